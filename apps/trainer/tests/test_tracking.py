"""The trackers for real: wandb offline, MLflow on a local file store, TensorBoard read back the way
TensorBoard reads it, and a resume that continues the same tracked runs with no step twice."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import pytest

from rstar2_trainer.cli import main
from rstar2_trainer.config import ConfigError, RunConfig, load_config
from rstar2_trainer.rundir import read_metrics
from rstar2_trainer.rundir.tracking import check_trackers, open_trackers, read_state

ALL = ["jsonl", "tensorboard", "wandb", "mlflow"]
CONFIG = {"run": {"seed": 7, "name": "t"}, "algo": {"name": "grpo_roc", "group_size": 2}}


def _settings(trackers: list[str] = ALL) -> RunConfig:
    return RunConfig(trackers=trackers, wandb={"mode": "offline"})  # type: ignore[arg-type]


def _png(path: Path) -> Path:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2], [0.1, 0.3])
    fig.savefig(path)
    plt.close(fig)
    return path


def wandb_records(run_dir: Path) -> list[tuple[str, list]]:
    """(run id, its records) of each offline-run folder, oldest first: the .wandb file is a
    LevelDB-format log of `Record` protos after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data, pos, chunk, records = path.read_bytes(), 7, b"", []
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0:
                break
            chunk += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or a record's last fragment
                record = pb.Record()
                record.ParseFromString(chunk)
                records.append(record)
                chunk = b""
        runs.append((path.stem.removeprefix("run-"), records))
    return runs


def wandb_history(records: list) -> list[dict[str, object]]:
    rows = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in row.item}
        for row in rows
    ]


def wandb_config(records: list) -> dict[str, object]:
    config = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        items = (
            r.config.update if kind == "config" else r.run.config.update if kind == "run" else []
        )
        config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return config


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())


def test_wandb_offline_and_mlflow_file_store_hold_metrics_config_and_plots(tmp_path):
    log = open_trackers(tmp_path, _settings(), CONFIG, resume=None)
    log.log("sft", 1, {"loss": 2.5})
    log.log("eval", 0, {"when": "after_sft", "accuracy": 0.25})
    log.log("rl", 1, {"reward": 0.5, "stage": "tiny1", "batch": ["a"], "nan": float("nan")})
    log.log_artifact(_png(tmp_path / "reward.png"))
    log.close(ok=True)

    [(run_id, records)] = wandb_records(tmp_path)
    assert read_state(tmp_path)["wandb"]["id"] == run_id
    history = wandb_history(records)
    assert {"sft/loss": 2.5, "sft/step": 1}.items() <= history[0].items()
    assert {"eval/accuracy": 0.25, "eval/step": 0}.items() <= history[1].items()
    assert {"rl/reward": 0.5, "rl/step": 1}.items() <= history[2].items()
    assert "rl/nan" not in history[2] and "rl/stage" not in history[2]
    assert history[3]["plots/reward/format"] == "png"
    assert wandb_config(records)["run"] == CONFIG["run"]

    client = mlflow_client(tmp_path)
    mlflow_id = read_state(tmp_path)["mlflow"]["run_id"]
    run = client.get_run(mlflow_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["run.seed"] == "7" and run.data.params["algo.group_size"] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_id, "rl/reward")] == [
        (1, 0.5)
    ]
    assert {a.path for a in client.list_artifacts(mlflow_id)} == {"config.yaml", "plots"}
    assert [a.path for a in client.list_artifacts(mlflow_id, "plots")] == ["plots/reward.png"]

    assert tensorboard_scalars(tmp_path / "tb", "rl/reward") == [(1, 0.5)]
    assert tensorboard_scalars(tmp_path / "tb" / "sft", "sft/loss") == [(1, 2.5)]
    assert [r["phase"] for r in read_metrics(tmp_path)] == ["sft", "eval", "rl"]


def test_resume_continues_the_same_tracked_runs_with_no_step_twice(tmp_path):
    """Steps 1-3 logged, checkpoints at 0, 1 and 2, killed before step 3's checkpoint; the resume
    redoes step 3 (other numbers) and runs step 4."""
    log = open_trackers(tmp_path, _settings(), CONFIG, resume=None)
    log.log("sft", 5, {"loss": 2.0})  # SFT steps run past the RL steps a resume purges from
    log.checkpointed(0)
    for step in (1, 2, 3):
        log.log("rl", step, {"reward": step / 10})
        if step < 3:
            log.checkpointed(step)
    log.close(ok=False)  # killed: step 3 has no checkpoint

    log = open_trackers(tmp_path, _settings(), CONFIG, resume=2)
    for step in (3, 4):
        log.log("rl", step, {"reward": step / 10 + 0.05})
        log.checkpointed(step)
    log.close(ok=True)

    want = [(1, 0.1), (2, 0.2), (3, 0.35), (4, 0.45)]
    assert [(r["step"], r["reward"]) for r in read_metrics(tmp_path) if r["phase"] == "rl"] == want
    assert tensorboard_scalars(tmp_path / "tb", "rl/reward") == want
    assert tensorboard_scalars(tmp_path / "tb" / "sft", "sft/loss") == [(5, 2.0)]

    (first_id, first), (second_id, second) = wandb_records(tmp_path)
    assert first_id == second_id  # one wandb run, continued
    rows = [row for row in wandb_history(first) + wandb_history(second) if "rl/step" in row]
    assert [(row["rl/step"], round(row["rl/reward"], 6)) for row in rows] == want  # type: ignore[arg-type]
    steps = [row["_step"] for row in wandb_history(first) + wandb_history(second)]
    assert steps == sorted(set(steps))  # wandb's own counter went on from the first part

    client = mlflow_client(tmp_path)
    [run] = client.search_runs([client.get_experiment_by_name("rstar2").experiment_id])
    history = client.get_metric_history(run.info.run_id, "rl/reward")
    assert sorted((m.step, round(m.value, 6)) for m in history) == want
    assert run.info.status == "FINISHED"


def test_a_resume_before_the_first_checkpoint_starts_new_tracked_runs(tmp_path):
    log = open_trackers(tmp_path, _settings(["jsonl", "wandb", "mlflow"]), CONFIG, resume=None)
    log.log("sft", 1, {"loss": 2.0})
    log.close(ok=False)
    first = read_state(tmp_path)
    log = open_trackers(tmp_path, _settings(["jsonl", "wandb", "mlflow"]), CONFIG, resume=None)
    log.close(ok=True)
    second = read_state(tmp_path)
    assert first["wandb"]["id"] != second["wandb"]["id"]
    assert first["mlflow"]["run_id"] != second["mlflow"]["run_id"]
    assert read_metrics(tmp_path) == []


def test_trackers_setting_parses_from_the_command_line_and_old_configs_still_load():
    config = load_config("tiny", ["run.trackers=[jsonl,tensorboard,wandb,mlflow]"])
    assert config.run.trackers == ALL
    assert load_config("tiny", ["run.trackers=[]"]).run.trackers == []
    # config.yaml of runs made before run.trackers (`--resume` reads it)
    assert RunConfig.model_validate({"tensorboard": True}).trackers == ["jsonl", "tensorboard"]
    assert RunConfig.model_validate({"tensorboard": False}).trackers == ["jsonl"]
    with pytest.raises(ConfigError, match=r"run\.tensorboard is replaced by run\.trackers"):
        load_config("tiny", ["run.tensorboard=true", "run.trackers=[jsonl]"])
    with pytest.raises(ConfigError, match="name each tracker once"):
        load_config("tiny", ["run.trackers=[jsonl,jsonl]"])


@pytest.mark.parametrize("extra", ["wandb", "mlflow"])
def test_a_missing_extra_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, extra):
    monkeypatch.setitem(sys.modules, extra, None)  # what an environment without it imports
    with pytest.raises(ConfigError):
        check_trackers(_settings(["jsonl", extra]))
    run_dir = tmp_path / "run"
    assert main(["tiny", f"run.trackers=[jsonl,{extra}]", f"run.output_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f'pip install "rstar2-trainer[{extra}]"' in err
    assert not run_dir.exists()


@pytest.mark.slow
def test_rstar2_train_with_every_tracker_killed_then_resumed(tmp_path, monkeypatch, in_process_rl):
    """The real trainer (the in-process engine of test_rl_step): killed after RL step 3, whose
    checkpoint (every 2 steps) never came, then resumed to the end."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the store here
    run_dir = tmp_path / "run"
    args = [
        "tiny",
        f"run.output_dir={run_dir}",
        *in_process_rl,
        "run.trackers=[jsonl,tensorboard,wandb,mlflow]",
        "run.wandb.mode=offline",
        "run.checkpoint_every=2",
        "curriculum.tiny.steps=[1,1,2]",
        "run.plots=true",
    ]
    # Each trainer its own wandb service, as a user's has: the fast tests' in-process runs left
    # WANDB_SERVICE pointing at this process's service, which would outlive the killed trainer
    # and keep its run id "in use" for the resume.
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rstar2_trainer.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # wandb's service process goes down with the run
    )
    deadline = time.monotonic() + 600
    rl = lambda: [r for r in read_metrics(run_dir) if r["phase"] == "rl"]  # noqa: E731
    while time.monotonic() < deadline and proc.poll() is None and len(rl()) < 3:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    proc.kill()  # the trainer; wandb's service sees it go
    proc.communicate()
    time.sleep(2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    client = mlflow_client(run_dir)
    run_id = read_state(run_dir)["mlflow"]["run_id"]
    held = client.get_metric_history(run_id, "rl/reward")
    assert sorted(m.step for m in held) == [1, 2]  # step 3 waits for its checkpoint

    resumed = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.cli", "--resume", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    want = [1, 2, 3, 4]
    assert [r["step"] for r in rl()] == want
    rewards = [round(r["reward"], 6) for r in rl()]
    assert [s for s, _ in tensorboard_scalars(run_dir / "tb", "rl/reward")] == want
    assert [v for _, v in tensorboard_scalars(run_dir / "tb", "rl/reward")] == rewards

    (first_id, first), (second_id, second) = wandb_records(run_dir)
    assert first_id == second_id
    before = [row["rl/step"] for row in wandb_history(first) if "rl/step" in row]
    after = [row["rl/step"] for row in wandb_history(second) if "rl/step" in row]
    # Step 3 was held back; what of steps 1-2 reached the file before the kill is wandb's own
    # durability (its service buffers), so the first part is a prefix of them.
    assert before == [1, 2][: len(before)] and after == [3, 4]
    # The killed part's config record may die in wandb's buffers, as its history may; the
    # resumed part logs the config again.
    assert wandb_config(second)["run"]["checkpoint_every"] == 2  # type: ignore[index]

    assert read_state(run_dir)["mlflow"]["run_id"] == run_id
    history = client.get_metric_history(run_id, "rl/reward")
    assert sorted(m.step for m in history) == want
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["run.checkpoint_every"] == "2"
    plots = {a.path for a in client.list_artifacts(run_id, "plots")}
    assert "plots/reward.png" in plots

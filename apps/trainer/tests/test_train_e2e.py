"""The trainer end to end on a tiny model: real vLLM (CPU build), real sandbox and verify servers
as child processes over gRPC, SFT, staged GRPO-RoC, checkpoints, metrics, plots, and resume
after SIGKILL in the middle of a step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rstar2_curriculum import Curriculum, CurriculumConfig, load_problems
from rstar2_trainer.rundir import read_metrics

pytestmark = pytest.mark.slow

SMALL = [
    "model.layers=2",
    "model.vocab_size=1024",
    "engine.kv_cache_memory_bytes=67108864",
    "run.trackers=[jsonl,tensorboard]",
]


def _train(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rstar2_trainer.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def _rl_steps(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["phase"] == "rl"]


def test_tiny_run_end_to_end(tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    stages = ["curriculum.tiny.steps=[1,1,1]", "curriculum.tiny.max_response_tokens=[64,96,96]"]
    sampled_eval = ["eval.temperature=0.6", "eval.samples=2", "sft.direct_share=0.25"]
    sampled_eval += ["eval.before_sft=true", "eval.every_stage=true"]  # tiny.yaml turns it off
    proc = _train(["tiny", f"run.output_dir={run_dir}", *tiny_run, *SMALL, *stages, *sampled_eval])
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert "Held-out evaluation" in out and str(run_dir) in out
    records = read_metrics(run_dir)
    evals = [r for r in records if r["phase"] == "eval"]
    assert [e["when"] for e in evals][:2] == ["before_sft", "after_sft"]
    assert len(evals) == 5  # before SFT, after SFT, after each of three stages
    for e in evals:  # avg@2: two sampled trajectories per held-out problem
        assert (e["problems"], e["samples"], e["trajectories"]) == (4, 2, 8)
    steps = _rl_steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        keys = ("reward", "time_rollout_s", "time_train_s", "engine_idle_share", "kept")
        for key in (*keys, "time_sleep_s", "time_sync_s", "tool_use_share"):
            assert key in r, key
        assert r["trajectories"] == 2 * 4  # batch 2 x 2G=4 rollouts
    sft = [r for r in records if r["phase"] == "sft"]
    assert sft and sft[-1]["loss"] < sft[0]["loss"]
    assert (run_dir / "config.yaml").exists() and (run_dir / "config.schema.json").exists()
    assert list((run_dir / "plots").glob("*.png"))
    assert list((run_dir / "tb").iterdir())
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000003"
    # the servers it started are gone
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(run_dir) not in ps
    _check_policy_export(run_dir, tmp_path)


def _check_policy_export(run_dir: Path, tmp_path: Path) -> None:
    """RUN_DIR/policy holds the final weights as a Hugging Face folder that rstar2-eval runs."""
    from safetensors.torch import load_file

    policy = run_dir / "policy"
    assert json.loads((policy / "rstar2.json").read_text()) == {
        "system_prompt": "compact",
        "step": 3,
    }
    final = torch.load(run_dir / "checkpoints" / "step_000003" / "model.pt", weights_only=True)
    saved = load_file(policy / "model.safetensors")
    assert saved and set(saved) <= set(final)
    for name, tensor in saved.items():
        assert torch.equal(tensor, final[name]), name

    problems = run_dir / "heldout.jsonl"  # the run's own held-out problems
    assert len(problems.read_text().splitlines()) == 4
    argv = [
        str(Path(sys.executable).with_name("rstar2-eval")),
        "run",
        str(policy),
        str(problems),
        "--config",
        "quick",
        "samples=1",
        "max_turns=2",
        "max_response_tokens=64",
        "model.engine=transformers",
        "--out",
        str(tmp_path / "eval"),
    ]
    wrong = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2
    assert "add system_prompt=compact" in wrong.stderr.strip().splitlines()[-1]
    right = subprocess.run(
        [*argv, "system_prompt=compact"], capture_output=True, text=True, timeout=600
    )
    assert right.returncode == 0, right.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["problems"] == 4


def test_sigkill_mid_step_then_resume_loses_and_repeats_nothing(tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    stages = ["curriculum.tiny.steps=[5,4,3]", "curriculum.tiny.max_response_tokens=[64,64,64]"]
    args = ["tiny", f"run.output_dir={run_dir}", *tiny_run, *SMALL, *stages, "eval.problems=2"]
    proc = _train(args, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if len(_rl_steps(run_dir)) >= 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # somewhere in step 3 (or its checkpoint)
    proc.communicate()
    killed_at = len(_rl_steps(run_dir))
    assert killed_at < 12

    resumed = _train(["--resume", str(run_dir)])
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    assert "resumed" in out
    steps = _rl_steps(run_dir)
    assert [r["step"] for r in steps] == list(range(1, 13))

    # The batches are the ones an uninterrupted run draws (stages 1-2 take the whole set in a
    # seeded order; stage 3's hard subset depends on rewards), including the step cut by the kill.
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    curriculum_config = CurriculumConfig.model_validate(config["curriculum"])
    problems = load_problems(curriculum_config.source, seed=config["run"]["seed"]).problems
    fresh = Curriculum.from_config(curriculum_config, problems)
    for record in steps[:9]:
        assert record["drawn"] == [p.id for p in fresh.next_batch().problems]
        fresh.end_step({})
    assert json.loads((run_dir / "checkpoints" / "step_000012" / "state.json").read_text())


def test_a_port_in_use_fails_with_one_line(tmp_path, tiny_run):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = _train(
            [
                "tiny",
                f"run.output_dir={tmp_path / 'r'}",
                f"verify_service.port={port}",
                *tiny_run,
                *SMALL,
            ]
        )
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1
    last = out.strip().splitlines()[-1]
    assert f"port {port} on 127.0.0.1 is already in use" in last

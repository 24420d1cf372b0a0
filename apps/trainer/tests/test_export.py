"""`rstar2-train --export`: a kept checkpoint of a run as a policy folder rstar2-eval loads."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rstar2_trainer.cli import main
from rstar2_trainer.config import ConfigError, load_config
from rstar2_trainer.export import export_checkpoint
from rstar2_trainer.placement.local import prepare_model_dir
from rstar2_trainer.rundir import write_config
from rstar2_trainer.rundir.checkpoint import save_checkpoint

MODEL = ["model.layers=1", "model.hidden_size=64", "model.vocab_size=512", "model.heads=2"]


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as the trainer leaves it: config, model folder, checkpoints 0 and 5."""
    run = tmp_path / "run"
    run.mkdir()
    config = load_config("tiny", [f"run.output_dir={run}", *MODEL])
    write_config(run, config)
    prepare_model_dir(config, run)  # the tiny model, built as the trainer builds it
    weights = load_file(run / "model" / "model.safetensors")
    for step in (0, 5):  # distinct weights per step
        state = {k: v + step for k, v in weights.items()}
        module = torch.nn.Module()
        module.state_dict = lambda state=state: state  # type: ignore[method-assign]
        save_checkpoint(run / "checkpoints", step, model=module, optimizer=None, state={})
    return run


def _exported(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_latest_and_a_chosen_step_are_written_with_their_weights(run_dir, tmp_path):
    latest = export_checkpoint(run_dir)
    assert latest == run_dir / "policy_step_000005"
    step0 = export_checkpoint(run_dir, 0, tmp_path / "sft")
    base = load_file(run_dir / "model" / "model.safetensors")
    for name, tensor in _exported(step0).items():
        assert torch.equal(tensor, base[name]), name
    for name, tensor in _exported(latest).items():
        assert torch.equal(tensor, base[name] + 5), name
    meta = json.loads((step0 / "rstar2.json").read_text())
    assert meta == {"system_prompt": "compact", "step": 0}
    assert (step0 / "tokenizer.json").exists() and (step0 / "config.json").exists()


def test_the_cli_prints_the_folder_and_the_eval_command(run_dir, tmp_path, capsys):
    assert main(["--export", str(run_dir), "--step", "0", "--to", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'p'}" in out
    assert f"rstar2-eval run {tmp_path / 'p'} {run_dir / 'heldout.jsonl'}" in out
    assert "system_prompt=compact" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--export", "{run}", "--step", "3"], "keeps no checkpoint of step 3 (kept: [0, 5]"),
        (["--export", "{tmp}"], "is not a run directory"),
        (["--step", "3"], "--step, --to and --merged go with --export"),
        (["--export", "{run}", "--resume", "{run}"], "--export takes only a run directory"),
        (["--export", "{run}", "--to", "{tmp}/no/such/p"], "is not a writable folder"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(run_dir, tmp_path, capsys, argv, message):
    argv = [a.format(run=run_dir, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_checkpoint_without_weights_is_refused(run_dir):
    (run_dir / "checkpoints" / "step_000005" / "model.pt").unlink()
    with pytest.raises(ConfigError, match=r"holds no weights: neither step_000005/model\.pt nor"):
        export_checkpoint(run_dir, 5)


@pytest.mark.slow
def test_an_fsdp2_checkpoint_exports_to_a_folder_transformers_loads(run_dir, tmp_path):
    """Two gloo ranks train the run's model a step and save it as the trainer's workers do
    (`save_sharded` under checkpoints/workers/, the driver's checkpoint without model.pt)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    worker = Path(__file__).resolve().parent / "_fsdp_worker.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    checkpoints = run_dir / "checkpoints"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--master-addr=127.0.0.1", f"--master-port={port}", str(worker), "checkpoint",
           "--model-dir", str(run_dir / "model"), "--checkpoint", str(checkpoints / "workers"),
           "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    save_checkpoint(checkpoints, 1, model=None, optimizer=None, state={})  # as ShardedPolicy.save

    out = export_checkpoint(run_dir, 1)
    assert out == run_dir / "policy_step_000001"
    trained = torch.load(tmp_path / "trained.pt", weights_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    base = load_file(run_dir / "model" / "model.safetensors")
    assert set(base) <= set(loaded)
    for name in base:
        assert torch.equal(loaded[name], trained[name]), name
    assert any(not torch.equal(base[n], trained[n]) for n in base)  # the step changed them
    assert json.loads((out / "rstar2.json").read_text())["step"] == 1

    # A new run from that FSDP2 step (`--init-from RUN_DIR:1`) starts from the trained weights:
    # the trainer resolves the origin and loads its weights exactly so.
    from rstar2_trainer.origin import origin_checkpoint
    from rstar2_trainer.rundir.kept import load_weights

    new = load_config("tiny", [*MODEL, f"init.run={run_dir}", "init.step=1"])
    origin = origin_checkpoint(new)
    assert origin.model is None  # the workers hold the weights: DCP shards, no model.pt
    fresh = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32)
    load_weights(origin.path, fresh)
    started = fresh.state_dict()
    for name in base:
        assert torch.equal(started[name], trained[name]), name

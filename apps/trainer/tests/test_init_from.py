"""`rstar2-train ... --init-from RUN_DIR[:STEP]`: a new run from another run's checkpoint.

Fast: every misuse is one line and exit 2 before a run directory exists (a run directory as the
trainer leaves it, with checkpoints 0 and 5, stands in for the origin). Slow: a tiny run, then a
new run from its step-1 checkpoint with its optimizer and curriculum, whose checkpoint 0 holds
exactly the origin's weights and optimizer state.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rstar2_trainer.cli import main
from rstar2_trainer.config import load_config
from rstar2_trainer.placement.local import prepare_model_dir
from rstar2_trainer.rundir import write_config
from rstar2_trainer.rundir.checkpoint import save_checkpoint

MODEL = ["model.layers=1", "model.hidden_size=64", "model.vocab_size=512", "model.heads=2"]


@pytest.fixture
def origin(tmp_path):
    """A run directory as the trainer leaves it: config, model folder, checkpoints 0 and 5."""
    run = tmp_path / "origin"
    run.mkdir()
    config = load_config("tiny", [f"run.output_dir={run}", *MODEL])
    write_config(run, config)
    prepare_model_dir(config, run)
    weights = load_file(run / "model" / "model.safetensors")
    for step in (0, 5):
        module = torch.nn.Module()
        module.state_dict = lambda w=weights: w  # type: ignore[method-assign]
        save_checkpoint(run / "checkpoints", step, model=module, optimizer=None, state={})
    return run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--init-from", "{tmp}"], "is not a run directory (no config.yaml in it)"),
        (["--init-from", "{run}:3"], "keeps no checkpoint of step 3 (kept: [0, 5]"),
        (
            ["tiny", *MODEL, "model.layers=2", "--init-from", "{run}"],
            "the model's architecture differs (model.layers 2 here, 1 there)",
        ),
        (
            ["--init-from", "{run}", "--init-include", "optimizer"],
            "holds no optimizer state of that kind; drop optimizer from --init-include",
        ),
        (
            ["--init-from", "{run}", "--init-include", "optimiser"],
            "init.include.0: Input should be 'optimizer' or 'curriculum'",
        ),
        (["--resume", "{run}", "--init-from", "{run}"], "--init-from starts a new run"),
        (["--init-include", "optimizer"], "--init-include goes with --init-from"),
    ],
)
def test_misuse_is_one_line_and_exit_2(origin, tmp_path, capsys, argv, message):
    out = tmp_path / "new"
    argv = [a.format(run=origin, tmp=tmp_path) for a in argv]
    if argv[0] == "--init-from":
        argv = ["tiny", *MODEL, *argv]
    if "--resume" not in argv:
        argv.append(f"run.output_dir={out}")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_dry_run_shows_the_origin(origin, capsys):
    argv = ["tiny", *MODEL, "--init-from", f"{origin}:5", "--init-include", "curriculum"]
    assert main([*argv, "--dry-run"]) == 0
    init = yaml.safe_load(capsys.readouterr().out)["init"]
    assert init == {"run": str(origin), "step": 5, "include": ["curriculum"]}


FAST = [  # the main loop in process, as in test_rl_step.py
    *MODEL,
    "engine={kind: hf}",
    "scheduler.policy={kind: least_requests}",
    "tool.kind=local",
    "verify_service.mode=local",
    "eval.problems=2",
    "eval.samples=1",
    "eval.temperature=0",
    "eval.max_response_tokens=24",
    "curriculum.batch_size=1",
    "curriculum.source.n=8",
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.tiny.max_response_tokens=[24,24,24]",
    "algo.group_size=2",
    "algo.filtering=none",
    "run.tensorboard=false",
    "run.plots=false",
    "run.keep_checkpoints=10",
]


@pytest.mark.slow
def test_a_new_run_starts_from_the_checkpoint(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["sft.examples=16", "sft.epochs=1", "sft.batch_size=8"]
    assert main(["tiny", f"run.output_dir={first}", *FAST, *args]) == 0
    origin = first / "checkpoints" / "step_000001"

    argv = ["tiny", f"run.output_dir={second}", *FAST, "optim.lr=1e-4"]
    argv += ["--init-from", f"{first}:1", "--init-include", "optimizer,curriculum"]
    assert main(argv) == 0
    said = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert f"initialised from {first} step 1 (weights, optimizer, curriculum)" in said

    written = yaml.safe_load((second / "config.yaml").read_text())
    assert written["init"] == {
        "run": str(first),
        "step": 1,
        "include": ["optimizer", "curriculum"],
    }
    assert written["optim"]["lr"] == 1e-4  # the new run's own config
    start = second / "checkpoints" / "step_000000"
    ours, theirs = torch.load(start / "model.pt"), torch.load(origin / "model.pt")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    opt_ours, opt_theirs = torch.load(start / "optimizer.pt"), torch.load(origin / "optimizer.pt")
    assert opt_ours["state"] and opt_ours["state"].keys() == opt_theirs["state"].keys()
    for k, v in opt_theirs["state"].items():
        assert torch.equal(opt_ours["state"][k]["exp_avg"], v["exp_avg"])
    state = json.loads((start / "state.json").read_text())
    assert state["curriculum"] == json.loads((origin / "state.json").read_text())["curriculum"]
    assert (second / "model" / "tokenizer.json").read_text() == (
        first / "model" / "tokenizer.json"
    ).read_text()  # the origin's tokenizer, not one trained afresh

    records = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if r["phase"] == "sft"]  # no SFT
    assert next(r["when"] for r in records if r["phase"] == "eval") == "init"
    # The origin's curriculum was past stage 1: the new run takes the two stages left.
    assert [r["step"] for r in records if r["phase"] == "rl"] == [1, 2]

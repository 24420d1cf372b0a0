"""The trainer's held-out accuracy and rstar2-eval's on the same policy agree exactly.

Both go through rstar2-rollout's RolloutWorker (scheduler and agent loop) and rstar2-verify's
reward rule; the trainer prints the rstar2-eval settings that reproduce its last evaluation
(`final_eval_command`). With the transformers engine every request is generated alone from its
own seed, so the same problems, samples and seeds give the same trajectories: the accuracy, the
finish reasons and the tool calls must all be equal, not merely close.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_trainer.config import load_config
from rstar2_trainer.rundir import read_metrics
from rstar2_trainer.train import final_eval_command

pytestmark = pytest.mark.slow

RUN = [
    "model.layers=2",
    "model.vocab_size=1024",
    "engine={kind: hf}",
    "scheduler.policy={kind: least_requests}",
    "tool.kind=local",
    "verify_service.mode=local",
    "sft.examples=96",
    "sft.epochs=2",
    "sft.batch_size=8",
    "eval.problems=8",
    "eval.samples=2",
    "eval.max_response_tokens=96",
    "curriculum.batch_size=2",
    "curriculum.source.n=24",
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.tiny.max_response_tokens=[64,64,64]",
    "algo.group_size=2",
    "run.trackers=[jsonl]",
    "run.plots=false",
]


def test_trainer_and_evaluator_report_the_same_accuracy(tmp_path):
    run_dir = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.cli", "tiny", f"run.output_dir={run_dir}", *RUN],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert train.returncode == 0, (train.stdout + train.stderr)[-3000:]
    last = [r for r in read_metrics(run_dir) if r["phase"] == "eval"][-1]

    settings = shlex.split(final_eval_command(load_config("tiny", RUN)))
    out = tmp_path / "eval"
    argv = [
        str(Path(sys.executable).with_name("rstar2-eval")),
        "run",
        str(run_dir / "policy"),
        str(run_dir / "heldout.jsonl"),
        *settings,
        "model.engine=hf",
        "tool.kind=local",
        "--out",
        str(out),
    ]
    evaluated = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())

    n = last["trajectories"]
    assert summary["samples"] == n == 8 * 2
    assert summary["pass_at_1"] == last["accuracy"]
    reasons = {k: v / n for k, v in summary["finish_reasons"].items()}
    for reason in ("answered", "no_tool_call", "max_turns", "max_length"):
        assert reasons.get(reason, 0.0) == pytest.approx(last[f"finish_{reason}"], abs=1e-12)
    assert sum(summary["tool_outcomes"].values()) == round(last["tool_calls_mean"] * n)

"""bench/default_run.py: the record it reads from a run's metrics.jsonl, and the committed
bench/results/default_run.json (issue 41's contract: three seeds of the default recipe, each
within ten minutes, RL adding at least +0.05 held-out accuracy on average)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "bench" / "results" / "default_run.json"

BENCH = "default_run"  # the `bench` fixture (tests/conftest.py) imports bench/default_run.py


def test_a_record_takes_the_evaluation_after_sft_and_the_last_one(bench):
    records = [
        {"phase": "sft", "step": 1, "time": 100.0, "loss": 7.6},
        {"phase": "sft", "step": 625, "time": 350.0, "loss": 0.03},
        {"phase": "eval", "step": 0, "time": 370.0, "when": "after_sft", "accuracy": 0.65},
        {"phase": "rl", "step": 1, "time": 375.0},
        {"phase": "eval", "step": 20, "time": 450.0, "when": "after_tiny1", "accuracy": 0.70},
        {"phase": "rl", "step": 60, "time": 600.0},
        {"phase": "eval", "step": 60, "time": 615.0, "when": "after_tiny3-hard", "accuracy": 0.74},
    ]
    record = bench.run_record(3, 540.04, records)
    assert record == {
        "seed": 3,
        "wall_s": 540.0,
        "after_sft": 0.65,
        "after_rl": 0.74,
        "gain": pytest.approx(0.09),
        "sft_s": 270.0,
        "rl_s": 230.0,
    }


def test_the_committed_runs_meet_the_contract(bench):
    result = json.loads(RESULT.read_text())
    runs = result["runs"]
    assert sorted(r["seed"] for r in runs) == [0, 1, 2]
    for r in runs:
        assert isinstance(r["seed"], int)
        assert all(isinstance(r[k], float) for k in ("wall_s", "after_sft", "after_rl"))
        assert r["gain"] == pytest.approx(r["after_rl"] - r["after_sft"])
        assert r["wall_s"] <= 600.0  # the default run takes at most ten minutes on this machine
    summary = bench.summary(runs)
    assert result["summary"]["gain_interval"] == pytest.approx(summary.pop("gain_interval"))
    assert {k: result["summary"][k] for k in summary} == pytest.approx(summary)
    assert result["summary"]["gain_mean"] >= 0.05  # RL shows: +0.05 over SFT on three seeds

"""bench/lora_vs_full.py: the record it reads from a run's metrics.jsonl, its summary and
verdict, and the committed bench/results/lora_vs_full.json (issue 42's contract: both arms,
three seeds each, from one SFT policy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
# the contract's run (the bench's defaults: LoRA at ten times the full learning rate), and the
# LoRA arm at three times it: on the same seeds, then on three seeds not looked at before
COMMITTED = [
    ("lora_vs_full.json", [0, 1, 2]),
    ("lora_vs_full_lr3e-4.json", [0, 1, 2]),
    ("lora_vs_full_lr3e-4_seeds345.json", [3, 4, 5]),
]

BENCH = "lora_vs_full"  # the `bench` fixture (tests/conftest.py) imports bench/lora_vs_full.py


def _run(seed: int, acc: float, wall: float) -> dict:
    return {"seed": seed, "final_accuracy": acc, "rl_wall_s": wall}


def test_a_record_starts_at_the_step_0_evaluation_and_ends_at_the_last_rl_step(bench):
    records = [
        {"phase": "eval", "step": 0, "time": 50.0, "when": "after_sft", "accuracy": 0.9},
        {"phase": "benchmark", "step": 0, "time": 60.0, "accuracy": 0.6},  # the held-out file
        {"phase": "rl", "step": 1, "time": 70.0, "mismatch_kl": 2e-14, "sync_bytes": 512},
        {"phase": "rl", "step": 2, "time": 160.0, "mismatch_kl": None},
        {"phase": "rl", "step": 3, "time": 260.0, "mismatch_kl": 4e-14, "sync_bytes": 256},
        {"phase": "benchmark", "step": 3, "time": 290.0, "accuracy": 0.7},
    ]
    assert bench.run_record(1, records) == {
        "seed": 1,
        "final_accuracy": 0.7,
        "rl_wall_s": 200.0,  # 60 -> 260: the final evaluation not included
        "accuracy_after_sft": 0.6,
        "rl_steps": 3,
        "sync_bytes": 256,
        "mismatch_kl_mean": pytest.approx(3e-14),
    }


def test_the_verdict_places_the_lora_mean_against_the_full_interval(bench):
    full = [_run(s, a, 100.0) for s, a in enumerate([0.60, 0.65, 0.70])]
    inside = [_run(s, a, 50.0) for s, a in enumerate([0.62, 0.66, 0.64])]
    below = [_run(s, a, 50.0) for s, a in enumerate([0.30, 0.31, 0.32])]
    said = bench.verdict({"full": full, "lora": inside})
    assert "inside the full 95 % interval" in said and "full/lora 2.00x" in said
    assert "below the full" in bench.verdict({"full": full, "lora": below})
    assert bench.verdict({"full": full, "lora": inside[:1]}).startswith("inconclusive")
    summary = bench.summary({"full": full, "lora": inside[:1]})
    assert summary["full"]["final_accuracy_mean"] == pytest.approx(0.65)
    assert summary["lora"]["final_accuracy_interval"] is None  # one run: no interval


@pytest.mark.parametrize(("name", "seeds"), COMMITTED)
def test_the_committed_comparisons_meet_the_contract(bench, name: str, seeds: list[int]):
    result = json.loads((RESULTS / name).read_text())
    arms = result["arms"]
    assert set(arms) == {"full", "lora"}
    for runs in arms.values():
        assert sorted(r["seed"] for r in runs) == seeds
        for r in runs:
            assert isinstance(r["seed"], int)
            assert isinstance(r["final_accuracy"], float) and 0.0 <= r["final_accuracy"] <= 1.0
            assert isinstance(r["rl_wall_s"], float) and r["rl_wall_s"] > 0.0
    # one SFT policy: every run starts from it (its evaluations differ by sampling only)
    start = [r["accuracy_after_sft"] for runs in arms.values() for r in runs]
    assert max(start) - min(start) < 0.05
    assert {r["rl_steps"] for runs in arms.values() for r in runs} == {60}  # the whole recipe
    # a LoRA push moves the adapter only: far fewer bytes than the full model's
    assert (
        max(r["sync_bytes"] for r in arms["lora"]) < min(r["sync_bytes"] for r in arms["full"]) / 4
    )
    for arm, want in bench.summary(arms).items():
        got = result["summary"][arm]
        assert got["final_accuracy_interval"] == pytest.approx(want.pop("final_accuracy_interval"))
        assert {k: got[k] for k in want} == pytest.approx(want)
    assert result["verdict"] == bench.verdict(arms)

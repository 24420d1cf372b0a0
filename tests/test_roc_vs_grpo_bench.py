"""bench/roc_vs_grpo.py's summary: the JSON contract of issue 22 and the computed verdict, on
synthetic metrics records (no run is started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BENCH = "roc_vs_grpo"  # the `bench` fixture (tests/conftest.py) imports bench/roc_vs_grpo.py


def _records(final_err: float, final_acc: float) -> list[dict]:
    """metrics.jsonl lines of a run: evaluation after SFT, two RL steps, evaluation after them."""
    return [
        {"phase": "eval", "step": 0, "when": "after_sft", "accuracy": 0.5,
         "tool_error_ratio_pos": 0.15, "response_len_mean": 90.0},
        {"phase": "sft", "step": 1, "loss": 3.0},
        {"phase": "rl", "step": 1, "tool_error_ratio_pos": 0.2, "response_len_mean": 100.0,
         "format_penalty_pos": 0.0, "reward": 0.5},
        {"phase": "rl", "step": 2, "tool_error_ratio_pos": None, "response_len_mean": 95.0,
         "format_penalty_pos": 0.1, "reward": 0.6},
        {"phase": "eval", "step": 2, "when": "after_stage1", "accuracy": final_acc,
         "tool_error_ratio_pos": final_err},
    ]  # fmt: skip


def test_run_record_follows_the_contract(bench):
    run = bench.run_record(3, _records(0.08, 0.7))
    assert run["seed"] == 3
    assert [s["step"] for s in run["steps"]] == [0, 2]  # the held-out evaluations only
    assert {"step", "tool_error_ratio_pos", "accuracy"} <= set(run["steps"][0])
    assert run["steps"][0]["accuracy"] == 0.5 and run["steps"][0]["tool_error_ratio_pos"] == 0.15
    assert run["final_accuracy"] == 0.7 and run["final_tool_error_ratio_pos"] == 0.08
    assert [s["step"] for s in run["rl_steps"]] == [1, 2]
    assert run["rl_steps"][1]["tool_error_ratio_pos"] is None
    assert run["rl_steps"][0]["response_len_mean"] == 100.0
    assert run["rl_tool_error_ratio_pos_mean"] == 0.2  # the step without positives is skipped


def test_interval_is_a_students_t_interval(bench):
    mean, low, high = bench.interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2)
    # sd 0.1, n 3: half-width 4.303 * 0.1 / sqrt(3)
    assert high - mean == pytest.approx(4.303 * 0.1 / 3**0.5)
    assert low == pytest.approx(2 * mean - high)
    assert bench.interval([]) is None


def _runs(bench, errors: list[float], accuracies: list[float]) -> list[dict]:
    pairs = zip(errors, accuracies, strict=True)
    return [bench.run_record(seed, _records(e, a)) for seed, (e, a) in enumerate(pairs)]


def _arms(
    bench, roc_err: list[float], grpo_err: list[float], roc_acc: list[float], grpo_acc: list[float]
):
    return {"grpo": _runs(bench, grpo_err, grpo_acc), "grpo_roc": _runs(bench, roc_err, roc_acc)}


def test_verdict_says_roc_lower_only_when_the_intervals_are_disjoint(bench):
    clear = bench.verdict(
        _arms(bench, [0.02, 0.03, 0.025], [0.12, 0.13, 0.125], [0.7, 0.71, 0.72], [0.7, 0.7, 0.71])
    )
    assert "RoC lower, 95 % intervals disjoint" in clear
    assert "accuracy" in clear and "within noise" in clear and "target met" in clear
    assert "\n" not in clear
    overlapping = bench.verdict(
        _arms(bench, [0.02, 0.12, 0.07], [0.05, 0.13, 0.09], [0.7, 0.71, 0.72], [0.7, 0.7, 0.71])
    )
    assert "no difference" in overlapping and "target not met" in overlapping
    worse_accuracy = bench.verdict(
        _arms(bench, [0.02, 0.03, 0.025], [0.12, 0.13, 0.125], [0.5, 0.51, 0.5], [0.7, 0.71, 0.7])
    )
    assert "RoC lower, intervals disjoint" in worse_accuracy and "not met" in worse_accuracy


def test_verdict_with_too_few_runs_is_inconclusive(bench):
    arms = _arms(bench, [0.02], [0.12], [0.7], [0.7])
    assert bench.verdict(arms).startswith("inconclusive")
    assert bench.verdict({"grpo": [], "grpo_roc": []}).startswith("inconclusive")


def test_the_json_has_exactly_the_contract_top_level(bench, tmp_path):
    arms = _arms(bench, [0.02, 0.03], [0.12, 0.13], [0.7, 0.71], [0.7, 0.7])
    doc = json.loads(json.dumps(bench.summary(arms)))
    assert set(doc) == {"arms", "verdict"}
    assert set(doc["arms"]) == {"grpo", "grpo_roc"}
    run = doc["arms"]["grpo_roc"][0]
    assert {"seed", "steps", "final_accuracy", "final_tool_error_ratio_pos"} <= set(run)
    bench.plot(arms, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_rl_runs_evaluate_on_the_sft_runs_held_out_set_with_more_samples_if_asked(bench, tmp_path):
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "heldout.jsonl").write_text("")
    eval_section = {"samples": 4, "temperature": 0.6, "max_turns": 4, "max_response_tokens": 384}
    (sft / "config.yaml").write_text(json.dumps({"eval": eval_section}))  # JSON is YAML
    same = bench.held_out_of_sft(tmp_path)
    assert f"eval.sources=[{(sft / 'heldout.jsonl').resolve()}]" in same
    assert "eval.synthetic=false" in same and "eval.benchmark.samples=4" in same
    more = bench.held_out_of_sft(tmp_path, 16)
    assert "eval.benchmark.samples=16" in more
    assert [o for o in more if "samples" not in o] == [o for o in same if "samples" not in o]


def test_tool_errors_vs_outcome_reads_eval_samples(bench_script, tmp_path):
    """bench/tool_errors_vs_outcome.py on an rstar2-eval samples.jsonl: the two conditional
    accuracies and the share of correct trajectories that kept a failed call."""
    diag = bench_script("tool_errors_vs_outcome")
    rows = [
        {"correct": True, "tool_calls": {"ok": 1}, "finish_reason": "answered"},
        {"correct": True, "tool_calls": {"error": 1, "ok": 1}, "finish_reason": "answered"},
        {"correct": False, "tool_calls": {"timeout": 1}, "finish_reason": "answered"},
        {"correct": False, "tool_calls": {"parse_error": 2}, "finish_reason": "max_length"},
        {"correct": False, "tool_calls": {}, "finish_reason": "no_tool_call"},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = diag.summarise([json.loads(line) for line in path.read_text().splitlines()])
    assert r["with_failed_call"] == 3
    assert r["p_correct_with_failed_call"] == pytest.approx(1 / 3)
    assert r["p_correct_clean"] == pytest.approx(1 / 2)
    assert r["correct_with_failed_call_share"] == pytest.approx(1 / 2)
    assert r["tool_error_ratio_in_correct"] == pytest.approx(1 / 3)  # 1 failed of 3 calls
    assert r["finish"] == {"answered": 3, "max_length": 1, "no_tool_call": 1}

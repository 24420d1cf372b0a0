"""rstar2-verify against Math-Verify on the external labelled set: dev and held-out splits.

    uv run --package rstar2-verify python bench/verify_external.py [--workers N] [--out PATH]

The external set (`packages/rstar2-verify/tests/data/external_{dev,heldout}.jsonl`) holds cases
transcribed from other graders' public test suites and hand-made cases in public dataset answer
formats; the held-out split was fixed by a hash before any rule was changed and no rule was
tuned on it. For each split, and for its subset whose response has a `\\boxed{}`/`\\fbox{}` or
an `<answer>` block (what RL training grades), this prints accuracy, false positives and
negatives of both graders side by side, with speed: cases/s through a pool of N processes (our
`Grader.grade_many`, Math-Verify in a process pool of the same size) and single-call latency
(p50, max) of one `grade` at a time. Accuracy is that of the pooled run; `timeouts` counts its
symbolic checks cut at the time limit (under load a check near the limit may fall either
side, so a rerun can differ by such a case). Math-Verify is called the way verl's `math_verify.compute_score` calls it (gold
wrapped in `\\boxed{}`, `math_metric` with LaTeX gold and Expr+LaTeX prediction targets,
exceptions and timeouts scored 0). Writes JSON (default bench/results/verify_external.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
import statistics
import time
from pathlib import Path

from rstar2_verify import Grader, VerifyConfig
from rstar2_verify.check import Case, load_cases

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "packages/rstar2-verify/tests/data"
_TRAINED = re.compile(r"\\boxed|\\fbox|<answer>")

_mv_metric = None


def _mv_grade(pair: tuple[str, str]) -> bool:
    """Math-Verify as verl's `math_verify.compute_score` calls it."""
    global _mv_metric
    from math_verify.errors import TimeoutException
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    if _mv_metric is None:
        logging.disable(logging.CRITICAL)
        _mv_metric = math_metric(
            gold_extraction_target=(LatexExtractionConfig(),),
            pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
        )
    response, gold = pair
    try:
        score, _ = _mv_metric(["\\boxed{" + gold + "}"], [response])
    except (Exception, TimeoutException):
        return False
    return score > 0


def _score(cases: list[Case], verdicts: list[bool]) -> dict[str, float | int]:
    pairs = list(zip(cases, verdicts, strict=True))
    return {
        "cases": len(cases),
        "accuracy": sum(v == c.correct for c, v in pairs) / max(len(cases), 1),
        "false_positives": sum(v and not c.correct for c, v in pairs),
        "false_negatives": sum(c.correct and not v for c, v in pairs),
    }


def _timed(fn, pairs) -> tuple[list[bool], list[float]]:
    verdicts, seconds = [], []
    for pair in pairs:
        start = time.perf_counter()
        verdicts.append(bool(fn(pair)))
        seconds.append(time.perf_counter() - start)
    return verdicts, seconds


def _latency(seconds: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(seconds) * 1e3, "max_ms": max(seconds) * 1e3}


def _run_split(cases: list[Case], workers: int, with_mv: bool) -> dict[str, dict]:
    pairs = [(c.response, c.gold) for c in cases]
    out: dict[str, dict] = {}
    with Grader(VerifyConfig(workers=workers)) as grader:
        grader.grade_many([("\\boxed{\\sqrt2}", "1.41")] * workers)  # workers ready
        start = time.perf_counter()
        grades = grader.grade_many(pairs)
        rate = len(pairs) / (time.perf_counter() - start)
        _, seconds = _timed(lambda p: grader.grade(*p).correct, pairs)
    ours = [g.correct for g in grades]
    timeouts = sum(g.reason == "timeout" for g in grades)
    out["rstar2-verify"] = {
        "verdicts": ours,
        "cases_per_s": rate,
        **_latency(seconds),
        "timeouts": timeouts,
    }
    if with_mv:
        theirs, seconds = _timed(_mv_grade, pairs)
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            pool.map(_mv_grade, [("\\boxed{1}", "1")] * workers)
            start = time.perf_counter()
            pool.map(_mv_grade, pairs, chunksize=4)
            rate = len(pairs) / (time.perf_counter() - start)
        out["math-verify"] = {"verdicts": theirs, "cases_per_s": rate, **_latency(seconds)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="rstar2-verify vs Math-Verify, dev and held-out.")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/verify_external.json")
    parser.add_argument("--skip-math-verify", action="store_true")
    args = parser.parse_args()

    results: dict[str, dict] = {}
    header = f"{'split':<22}{'grader':<15}{'cases':>6}{'accuracy':>9}{'FP':>4}{'FN':>4}"
    header += f"{'cases/s':>9}{'p50 ms':>8}{'max ms':>9}"
    print(header)
    for split in ("dev", "heldout"):
        cases = load_cases(DATA / f"external_{split}.jsonl")
        runs = _run_split(cases, args.workers, not args.skip_math_verify)
        trained = [k for k, c in enumerate(cases) if _TRAINED.search(c.response)]
        for name, run in runs.items():
            verdicts = run.pop("verdicts")
            rows = {
                split: _score(cases, verdicts),
                f"{split} boxed/<answer>": _score(
                    [cases[k] for k in trained], [verdicts[k] for k in trained]
                ),
            }
            for label, score in rows.items():
                results.setdefault(label, {})[name] = score
                speed = run if label == split else {}
                results[label][name].update(speed)
                line = f"{label:<22}{name:<15}{score['cases']:>6}{score['accuracy']:>9.1%}"
                line += f"{score['false_positives']:>4}{score['false_negatives']:>4}"
                if speed:
                    line += f"{speed['cases_per_s']:>9.0f}{speed['p50_ms']:>8.2f}{speed['max_ms']:>9.0f}"
                print(line)
        if "math-verify" in runs:
            ratio = runs["rstar2-verify"]["cases_per_s"] / runs["math-verify"]["cases_per_s"]
            results[split]["throughput_ratio"] = ratio
            print(f"{split}: throughput ratio (same pool size) {ratio:.1f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

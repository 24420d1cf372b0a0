"""Do failed tool calls predict a wrong answer? Read rstar2-eval's samples.jsonl and print it.

    uv run python bench/tool_errors_vs_outcome.py RUN/samples.jsonl [...]

GRPO-RoC's effect (paper §2.3, Figure 4) lives where correct trajectories keep failed calls that
GRPO rewards anyway. Whether a policy is there shows in two numbers: P(correct | the trajectory
had a failed call) against P(correct | every call ran), and the share of correct trajectories
with a failed call. When failed calls mostly end in wrong answers, GRPO's negative advantages
already push them down and RoC has little left to remove.

A failed call is a tool call whose status is not `ok` (`error`, `timeout`, `parse_error`), as
rstar2-eval's `tool_error_ratio` counts them.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def all_calls(sample: dict[str, Any]) -> int:
    return sum((sample.get("tool_calls") or {}).values())


def failed_calls(sample: dict[str, Any]) -> int:
    return all_calls(sample) - (sample.get("tool_calls") or {}).get("ok", 0)


def share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    with_error = [s for s in samples if failed_calls(s)]
    clean = [s for s in samples if not failed_calls(s)]
    correct = [s for s in samples if s.get("correct")]
    return {
        "trajectories": len(samples),
        "accuracy": share(len(correct), len(samples)),
        "with_failed_call": len(with_error),
        "p_correct_with_failed_call": share(
            sum(bool(s.get("correct")) for s in with_error), len(with_error)
        ),
        "p_correct_clean": share(sum(bool(s.get("correct")) for s in clean), len(clean)),
        "correct_with_failed_call_share": share(
            sum(1 for s in correct if failed_calls(s)), len(correct)
        ),
        "tool_error_ratio_in_correct": share(
            sum(failed_calls(s) for s in correct), sum(all_calls(s) for s in correct)
        ),
        "finish": dict(Counter(s.get("finish_reason") for s in samples)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="Do failed tool calls predict a wrong answer?")
    parser.add_argument("samples", type=Path, nargs="+", help="rstar2-eval's samples.jsonl")
    args = parser.parse_args()
    for path in args.samples:
        samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        r = summarise(samples)
        print(f"{path}: {r['trajectories']} trajectories, accuracy {r['accuracy']:.3f}")
        print(
            f"  P(correct | a failed call) {r['p_correct_with_failed_call']:.3f} "
            f"({r['with_failed_call']} trajectories), P(correct | clean) {r['p_correct_clean']:.3f}"
        )
        print(
            f"  correct trajectories with a failed call {r['correct_with_failed_call_share']:.3f}; "
            f"tool-error ratio (calls) in correct {r['tool_error_ratio_in_correct']:.3f}"
        )
        print(f"  finish reasons {r['finish']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

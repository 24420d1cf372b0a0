"""Statistics of a set of graded trajectories: what a step line and metrics.jsonl report.

Tool-error ratios pool the calls: failed calls / all calls over the trajectories of one sign
(the paper's Fig. 4 measure, "tool calls with errors in positively rewarded trajectories"). A
failure is a structured outcome (error, timeout, parse_error), never a word in the output.
The format penalty is RoC's p_format (rstar2_algos.penalty), averaged over trajectories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from rstar2_algos.penalty import format_penalty
from rstar2_rollout.trajectory import Trajectory
from rstar2_verify import is_correct

FAILED = ("error", "timeout", "parse_error")


def tool_error_ratio(trajectories: Sequence[Trajectory]) -> float | None:
    calls = sum(sum(t.tool_outcome_counts.values()) for t in trajectories)
    if calls == 0:
        return None
    failed = sum(t.tool_outcome_counts.get(k, 0) for t in trajectories for k in FAILED)
    return failed / calls


def mean_format_penalty(trajectories: Sequence[Trajectory]) -> float | None:
    """RoC's p_format (extra <answer> blocks per turn; 1 without any), averaged."""
    if not trajectories:
        return None
    blocks = np.array([t.answer_blocks for t in trajectories])  # [N]
    turns = np.array([t.turns for t in trajectories])  # [N]
    return float(format_penalty(blocks, turns).mean())


def trajectory_stats(trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
    """Reward, lengths, finish reasons and tool use of `trajectories`."""
    n = len(trajectories)
    if n == 0:
        return {"trajectories": 0}
    positives = [t for t in trajectories if is_correct(t.reward)]
    negatives = [t for t in trajectories if not is_correct(t.reward)]
    lengths = [len(t.response_ids) for t in trajectories]
    reasons = Counter(t.finish_reason or "none" for t in trajectories)
    calls = [sum(t.tool_outcome_counts.values()) for t in trajectories]
    out: dict[str, float | None] = {
        "trajectories": n,
        "reward": sum(t.reward for t in trajectories) / n,
        "response_len_mean": sum(lengths) / n,
        "response_len_max": max(lengths),
        "truncation_ratio": reasons.get("max_length", 0) / n,
        "tool_calls_mean": sum(calls) / n,
        "tool_use_share": sum(1 for c in calls if c > 0) / n,
        "tool_error_ratio": tool_error_ratio(trajectories),
        "tool_error_ratio_pos": tool_error_ratio(positives),
        "tool_error_ratio_neg": tool_error_ratio(negatives),
        "format_penalty_pos": mean_format_penalty(positives),
        "turns_mean": sum(t.turns for t in trajectories) / n,
    }
    for reason in ("answered", "no_tool_call", "max_turns", "max_length", "error"):
        out[f"finish_{reason}"] = reasons.get(reason, 0) / n
    return out


def group_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Per-problem pass rates: mean, and the shares of all-correct and all-wrong groups."""
    groups: dict[str, list[float]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t.reward)
    if not groups:
        return {}
    rates = [sum(1 for r in rs if is_correct(r)) / len(rs) for rs in groups.values()]
    return {
        "pass_rate_mean": sum(rates) / len(rates),
        "all_correct_share": sum(1 for r in rates if r == 1.0) / len(rates),
        "all_wrong_share": sum(1 for r in rates if r == 0.0) / len(rates),
    }

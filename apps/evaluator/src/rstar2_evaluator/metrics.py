"""Evaluation metrics: pure functions over finished samples, checked against hand-computed values.

Definitions (n samples of one problem, c of them correct):

- pass@1 (avg@n): the mean over problems of c / n. It is the paper's headline number.
- pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) of the chance that at least one of k
  samples drawn without replacement is correct (Chen et al., 2021), averaged over problems;
  defined for k <= n.
- maj@k: majority vote over the normalised extracted answers of the first k samples. A sample
  without an extracted answer does not vote; ties go to the answer that appeared first; the vote
  is correct when the winning answer's first sample was graded correct (all samples sharing a
  normalised answer share a grade). No answer at all counts as wrong.
- response length: tokens after the prompt (model tokens and tool outputs), and the model's own
  sampled tokens, each averaged over samples.
- tool calls per problem: the mean over problems of the mean tool calls per sample.
- tool-error ratio: non-`ok` tool calls (error, timeout, parse_error) over all tool calls.
- finish reasons: counts per reason over samples.
- the headline: `metric` names it and `score` is its value; `pass@1` (the above) for benchmarks
  graded by answer, else the key a reference checker names among its `metrics` (IFEval's
  `prompt_strict`, ...), which `summarize` is handed already computed.

Not covered: grading (rstar2-verify decides `correct`) and reading or writing samples (`store.py`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rstar2_evaluator.record import SampleRecord


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(keys: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """The winning normalised answer of one problem's samples and whether it is correct."""
    if len(keys) != len(correct):
        raise ValueError(f"{len(keys)} answers but {len(correct)} grades")
    votes: Counter[str] = Counter(key for key in keys if key is not None)
    if not votes:
        return None, False
    first_seen = {key: i for i, key in reversed(list(enumerate(keys))) if key is not None}
    winner = max(votes, key=lambda key: (votes[key], -first_seen[key]))
    return winner, correct[first_seen[winner]]


class ProblemResult(BaseModel):
    """One problem's samples, summarised."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    problem_id: str
    reference: str = Field(description="The reference answer.")
    samples: int = Field(description="Samples graded (n).")
    correct: int = Field(description="Samples graded correct (c).")
    majority_answer: str | None = Field(description="The normalised answer that won the vote.")
    majority_correct: bool


class Summary(BaseModel):
    """Every metric of one evaluation run, and its per-problem results."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    benchmark: str = Field(default="", description="The benchmark's name (or its file's stem).")
    metric: str = Field(default="pass@1", description="The headline metric's name.")
    score: float = Field(default=0.0, description="The headline metric's value, in [0, 1].")
    n: int = Field(default=0, description="Problems scored.")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="A reference checker's metrics (empty for answers)."
    )
    problems: int
    samples: int = Field(description="Samples in all.")
    samples_per_problem: int = Field(description="n, the same for every problem.")
    pass_at_1: float = Field(description="Mean over problems of c/n (avg@n).")
    pass_at_k: dict[str, float] = Field(description="'pass@k' -> unbiased estimate.")
    maj_at_k: dict[str, float] = Field(description="'maj@k' -> majority-vote accuracy.")
    mean_response_tokens: float
    mean_sampled_tokens: float
    mean_turns: float
    tool_calls_per_problem: float
    tool_error_ratio: float
    tool_outcomes: dict[str, int] = Field(description="Outcome -> tool calls over all samples.")
    finish_reasons: dict[str, int] = Field(description="Reason -> samples.")
    per_problem: list[ProblemResult]


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


def group_by_problem(records: Iterable[SampleRecord]) -> dict[str, list[SampleRecord]]:
    """Records of each problem, in sample order, problems in first-seen order."""
    groups: dict[str, list[SampleRecord]] = defaultdict(list)
    for record in records:
        groups[record.problem_id].append(record)
    for samples in groups.values():
        samples.sort(key=lambda r: r.sample_index)
    return dict(groups)


def summarize(
    records: Iterable[SampleRecord],
    ks: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    benchmark: str = "",
    metric: str = "pass@1",
    checked: dict[str, float] | None = None,
) -> Summary:
    """All metrics of a finished run; every problem must have the same number of samples.
    `checked`: a reference checker's metrics, of which `metric` is the headline."""
    groups = group_by_problem(records)
    if not groups:
        raise ValueError("no samples to summarise")
    sizes = {len(samples) for samples in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"problems have different sample counts {sorted(sizes)}")
    n = sizes.pop()
    ks = sorted({k for k in ks if 1 <= k <= n} | {n})
    all_samples = [r for samples in groups.values() for r in samples]

    per_problem: list[ProblemResult] = []
    pass_k: dict[int, list[float]] = {k: [] for k in ks}
    maj_k: dict[int, list[float]] = {k: [] for k in ks}
    for problem_id, samples in groups.items():
        keys = [r.answer_key for r in samples]
        grades = [r.correct for r in samples]
        c = sum(grades)
        for k in ks:
            pass_k[k].append(pass_at_k(n, c, k))
            maj_k[k].append(float(majority_vote(keys[:k], grades[:k])[1]))
        answer, right = majority_vote(keys, grades)
        per_problem.append(
            ProblemResult(
                problem_id=problem_id,
                reference=samples[0].reference,
                samples=n,
                correct=c,
                majority_answer=answer,
                majority_correct=right,
            )
        )

    outcomes: Counter[str] = Counter()
    for record in all_samples:
        outcomes.update(record.tool_calls)
    calls = sum(outcomes.values())
    failed = calls - outcomes.get("ok", 0)
    pass_at_1 = _mean(p.correct / n for p in per_problem)
    checked = dict(checked or {})
    if metric != "pass@1" and metric not in checked:
        raise ValueError(f"the headline metric {metric!r} is not among {sorted(checked)}")
    return Summary(
        benchmark=benchmark,
        metric=metric,
        score=checked.get(metric, pass_at_1),
        n=len(groups),
        metrics=checked,
        problems=len(groups),
        samples=len(all_samples),
        samples_per_problem=n,
        pass_at_1=pass_at_1,
        pass_at_k={f"pass@{k}": _mean(pass_k[k]) for k in ks},
        maj_at_k={f"maj@{k}": _mean(maj_k[k]) for k in ks},
        mean_response_tokens=_mean(r.response_tokens for r in all_samples),
        mean_sampled_tokens=_mean(r.sampled_tokens for r in all_samples),
        mean_turns=_mean(r.turns for r in all_samples),
        tool_calls_per_problem=_mean(
            _mean(sum(r.tool_calls.values()) for r in samples) for samples in groups.values()
        ),
        tool_error_ratio=failed / calls if calls else 0.0,
        tool_outcomes=dict(sorted(outcomes.items())),
        finish_reasons=dict(sorted(Counter(r.finish_reason for r in all_samples).items())),
        per_problem=per_problem,
    )

"""`rstar2-eval compare A B`: two finished runs side by side, and where they differ per problem.

Both runs must be finished (have `summary.json`); comparing a half-done run would compare
different problem sets. Per-problem differences are in pass rate (c/n); problems only one run
has are listed apart. Two suite runs (`suite.json`, e.g. the paper's suite on the SFT model and
on the RL model) compare benchmark by benchmark (`compare_suites`), whichever suites they ran:
the benchmarks both have, and those only one has. Not covered: statistical significance (the
per-problem table is the raw material for a paired test).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, computed_field

from rstar2_evaluator.metrics import Summary
from rstar2_evaluator.store import SUMMARY, RunError
from rstar2_evaluator.suite import SUITE_FILE, SuiteResult


class ProblemDiff(BaseModel):
    """One problem in both runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    problem_id: str
    a_correct: int
    a_samples: int
    b_correct: int
    b_samples: int
    a_majority: bool
    b_majority: bool

    @computed_field
    @property
    def delta(self) -> float:
        """B's pass rate minus A's."""
        return self.b_correct / self.b_samples - self.a_correct / self.a_samples


class Comparison(BaseModel):
    """Two runs' metrics and per-problem results."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    a: str = Field(description="Run directory A.")
    b: str = Field(description="Run directory B.")
    metrics: list[tuple[str, float, float]] = Field(description="(name, A, B) per metric.")
    problems: list[ProblemDiff] = Field(description="Problems in both runs, biggest change first.")
    only_a: list[str] = Field(description="Problem ids only A has.")
    only_b: list[str] = Field(description="Problem ids only B has.")

    @property
    def changed(self) -> list[ProblemDiff]:
        return [p for p in self.problems if p.delta != 0]


def headline(summary: Summary) -> list[tuple[str, float]]:
    """The metrics a reader compares, in display order."""
    rows = [("pass@1 (avg@n)", summary.pass_at_1)]
    rows += [(k, v) for k, v in summary.pass_at_k.items() if k != "pass@1"]
    rows += list(summary.maj_at_k.items())
    rows += [
        ("mean response tokens", summary.mean_response_tokens),
        ("mean sampled tokens", summary.mean_sampled_tokens),
        ("mean turns", summary.mean_turns),
        ("tool calls per problem", summary.tool_calls_per_problem),
        ("tool-error ratio", summary.tool_error_ratio),
    ]
    return rows


def read_summary(run: str | Path) -> Summary:
    path = Path(run) / SUMMARY
    if not path.exists():
        if (Path(run) / "samples.jsonl").exists():
            raise RunError(
                f"{run} is not finished (no {SUMMARY}); rerun its evaluation to resume it"
            )
        raise RunError(f"{run} is not an evaluation run (no {SUMMARY})")
    return Summary.model_validate_json(path.read_text())


def compare_runs(a: str | Path, b: str | Path) -> Comparison:
    """Line up two finished runs."""
    sa, sb = read_summary(a), read_summary(b)
    ha, hb = dict(headline(sa)), dict(headline(sb))
    metrics = [(name, ha[name], hb[name]) for name in ha if name in hb]
    by_a = {p.problem_id: p for p in sa.per_problem}
    by_b = {p.problem_id: p for p in sb.per_problem}
    problems = [
        ProblemDiff(
            problem_id=pid,
            a_correct=by_a[pid].correct,
            a_samples=by_a[pid].samples,
            b_correct=by_b[pid].correct,
            b_samples=by_b[pid].samples,
            a_majority=by_a[pid].majority_correct,
            b_majority=by_b[pid].majority_correct,
        )
        for pid in by_a
        if pid in by_b
    ]
    problems.sort(key=lambda p: -abs(p.delta))
    return Comparison(
        a=str(a),
        b=str(b),
        metrics=metrics,
        problems=problems,
        only_a=[pid for pid in by_a if pid not in by_b],
        only_b=[pid for pid in by_b if pid not in by_a],
    )


class SuiteRowDiff(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    benchmark: str
    label: str
    metric: str
    a: float
    b: float


class SuiteComparison(BaseModel):
    """Two suite runs, benchmark by benchmark."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    a: str
    b: str
    rows: list[SuiteRowDiff]
    only_a: list[str]
    only_b: list[str]


def is_suite_run(run: str | Path) -> bool:
    return (Path(run) / SUITE_FILE).is_file()


def read_suite(run: str | Path) -> SuiteResult:
    path = Path(run) / SUITE_FILE
    if not path.is_file():
        raise RunError(f"{run} is not a finished suite run (no {SUITE_FILE}); rerun it to resume")
    return SuiteResult.model_validate_json(path.read_text())


def compare_suites(a: str | Path, b: str | Path) -> SuiteComparison:
    """Line up two suite runs by benchmark."""
    rows_a = {r.benchmark: r for _, rows in read_suite(a).tables for r in rows}
    rows_b = {r.benchmark: r for _, rows in read_suite(b).tables for r in rows}
    both = [name for name in rows_b if name in rows_a]
    mismatched = [n for n in both if rows_a[n].metric != rows_b[n].metric]
    if mismatched:
        raise RunError(f"{', '.join(mismatched)}: the two runs report different metrics")
    return SuiteComparison(
        a=str(a),
        b=str(b),
        rows=[
            SuiteRowDiff(
                benchmark=n,
                label=rows_b[n].label,
                metric=rows_b[n].metric,
                a=rows_a[n].score,
                b=rows_b[n].score,
            )
            for n in both
        ],
        only_a=[rows_a[n].label for n in rows_a if n not in rows_b],
        only_b=[rows_b[n].label for n in rows_b if n not in rows_a],
    )

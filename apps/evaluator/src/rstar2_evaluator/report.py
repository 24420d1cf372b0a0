"""What a person sees on the terminal: the summary table, the comparison, a suite's tables in the
paper's layout, the progress bar.

Rendering only (rich); the numbers come from `metrics.py`, `compare.py` and `suite.py`. A suite
table is the paper's: a column per benchmark, this run's row first (percent, one decimal),
then a row per reported model marked "(reported)", "-" where a number is not reported. Two
suite runs side by side read as the paper's Table 5: "B (A)" per benchmark. The progress bar
shows samples done out of samples to do, samples per second over the run, the running pass@1
of the samples finished so far, and the time left.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from rstar2_evaluator.compare import Comparison, SuiteComparison, headline
from rstar2_evaluator.metrics import Summary
from rstar2_evaluator.suite import SuiteResult

_COUNTS = {"mean response tokens", "mean sampled tokens"}


def _fmt(name: str, value: float) -> str:
    if name in _COUNTS:
        return f"{value:,.0f}"
    if name.startswith(("pass@", "maj@", "tool-error")):
        return f"{100 * value:.1f}%"
    return f"{value:.2f}"


def summary_table(summary: Summary, title: str) -> Group:
    """The metrics of one run, then its tool outcomes and finish reasons."""
    metrics = Table(title=title, title_justify="left")
    metrics.add_column("metric")
    metrics.add_column("value", justify="right")
    metrics.add_row("problems x samples", f"{summary.problems} x {summary.samples_per_problem}")
    if summary.metric != "pass@1" or summary.metrics:
        metrics.add_row(f"[bold]{summary.metric}[/bold]", f"{100 * summary.score:.1f}%")
        for name, value in summary.metrics.items():
            if name != summary.metric:
                metrics.add_row(name, f"{100 * value:.1f}%")
    for name, value in headline(summary):
        metrics.add_row(name, _fmt(name, value))
    counts = Table(show_header=True)
    counts.add_column("finish reason")
    counts.add_column("samples", justify="right")
    for reason, n in summary.finish_reasons.items():
        counts.add_row(reason, str(n))
    for outcome, n in summary.tool_outcomes.items():
        counts.add_row(f"tool call: {outcome}", str(n))
    return Group(metrics, counts)


def comparison_tables(cmp: Comparison, limit: int = 20) -> Group:
    """Metrics side by side, then the problems whose pass rate changed most."""
    metrics = Table(title=f"A = {cmp.a}\nB = {cmp.b}", title_justify="left")
    for column in ("metric", "A", "B", "B - A"):
        metrics.add_column(column, justify="left" if column == "metric" else "right")
    for name, a, b in cmp.metrics:
        delta = _fmt(name, b - a)
        metrics.add_row(name, _fmt(name, a), _fmt(name, b), delta if b < a else f"+{delta}")
    changed = cmp.changed
    better = sum(p.delta > 0 for p in changed)
    problems = Table(
        title=f"{len(changed)} of {len(cmp.problems)} problems differ "
        f"(B better on {better}, worse on {len(changed) - better})",
        title_justify="left",
    )
    for column in ("problem", "A c/n", "B c/n", "B - A", "maj A", "maj B"):
        problems.add_column(column, justify="left" if column == "problem" else "right")
    for p in changed[:limit]:
        problems.add_row(
            p.problem_id,
            f"{p.a_correct}/{p.a_samples}",
            f"{p.b_correct}/{p.b_samples}",
            f"{p.delta:+.2f}",
            "yes" if p.a_majority else "no",
            "yes" if p.b_majority else "no",
        )
    parts: list[Table | Text] = [metrics, problems]
    if len(changed) > limit:
        parts.append(Text(f"... and {len(changed) - limit} more (--json writes them all)"))
    if cmp.only_a or cmp.only_b:
        parts.append(Text(f"only in A: {len(cmp.only_a)} problems; only in B: {len(cmp.only_b)}"))
    return Group(*parts)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def suite_tables(result: SuiteResult) -> Group:
    """A suite run's tables in the paper's layout, beside the reported numbers."""
    parts: list[Table | Text] = []
    for title, rows in result.tables:
        table = Table(title=title, title_justify="left")
        table.add_column("model")
        for row in rows:
            table.add_column(row.label, justify="right")
        table.add_row(result.model, *(_pct(100 * row.score) for row in rows))
        for column in result.reported:
            table.add_row(f"{column} (reported)", *(_pct(row.reported.get(column)) for row in rows))
        parts.append(table)
        metrics = ", ".join(
            f"{row.label}: {row.metric} over {row.n} x {row.samples_per_problem}" for row in rows
        )
        parts.append(Text(metrics, style="dim"))
    return Group(*parts)


def suite_comparison_table(cmp: SuiteComparison) -> Table:
    """Two suite runs per benchmark, as the paper's Table 5 reads: "B (A)" and the change."""
    table = Table(title=f"A = {cmp.a}\nB = {cmp.b}", title_justify="left")
    for column in ("benchmark", "metric", "B (A)", "B - A"):
        table.add_column(column, justify="left" if column in ("benchmark", "metric") else "right")
    for row in cmp.rows:
        delta = 100 * (row.b - row.a)
        table.add_row(
            row.label,
            row.metric,
            f"{100 * row.b:.1f} ({100 * row.a:.1f})",
            f"{delta:+.1f}",
        )
    for label in cmp.only_a:
        table.add_row(label, "", "only in A", "")
    for label in cmp.only_b:
        table.add_row(label, "", "only in B", "")
    return table


class RateColumn(ProgressColumn):
    """Samples per second since the bar started."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        done = task.completed - task.fields.get("resumed", 0)
        rate = done / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:.2f} samples/s", style="progress.data.speed")


def progress_bar(console: Console) -> Progress:
    """The bar an evaluation drives; `correct` and `resumed` are task fields."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TextColumn("pass@1 {task.fields[pass_rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )

"""What a person sees: progress, one line per step, the final table; the plots are `plots.py`.

In a terminal the display is rich's: live progress bars and a boxed final table. Anywhere else
(`rstar2-train > log 2>&1`, a cluster job's output file) the output is for reading later:
lines are never wrapped or cut, the final table is a Markdown table with every header and cell
whole, and a phase shown as a bar in a terminal prints a plain progress line every
`PROGRESS_INTERVAL_S` seconds and one at its end. Text is printed as is (no rich markup, so a
stage named `[x]` stays in the line).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rstar2_trainer.rundir.plots import draw_plots

__all__ = ["console", "draw_plots", "final_table", "fmt", "progress", "step_line"]

PROGRESS_INTERVAL_S = 30.0  # between two progress lines when the output is not a terminal


class LogConsole(Console):
    """rich's console that never wraps or cuts a line when its output is not a terminal (asked
    at each print, so the same object serves a run whose stdout is a file)."""

    @property
    def soft_wrap(self) -> bool:  # type: ignore[override]
        return not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        """rich's __init__ sets it; the output decides instead."""


console = LogConsole(highlight=False, markup=False)


@contextlib.contextmanager
def progress(description: str, total: int, interval_s: float | None = None) -> Iterator[Any]:
    """Progress of a phase of `total` units; yields `advance(n=1)`. A live bar in a terminal;
    elsewhere a line `description: done/total (pct) elapsed` every `interval_s` (default
    `PROGRESS_INTERVAL_S`) while the phase runs, and one when it ends."""
    if console.is_terminal:
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        with bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)
        return
    interval = PROGRESS_INTERVAL_S if interval_s is None else interval_s
    done, start, stop = [0], time.monotonic(), threading.Event()

    def line(end: str = "") -> None:
        pct = f" ({100 * done[0] / total:.0f} %)" if total else ""
        elapsed = _duration(time.monotonic() - start)
        console.print(f"{description}: {done[0]}/{total}{pct}, {elapsed}{end}")

    def tick() -> None:
        while not stop.wait(interval):
            line()

    ticker = threading.Thread(target=tick, name=f"progress {description}", daemon=True)
    ticker.start()
    try:
        yield lambda n=1: done.__setitem__(0, done[0] + n)
    finally:
        stop.set()
        ticker.join()
        line(" (done)")


def _duration(seconds: float) -> str:
    """12 s, 3m05s, 1h02m."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt(value: Any, digits: int = 3) -> str:
    """A value for a terminal line: floats to `digits` places, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def step_line(step: int, stage: str, m: Mapping[str, Any]) -> None:
    console.print(
        f"step {step:>3} [{stage}] reward {fmt(m.get('reward'), 2)} "
        f"kept {m.get('groups_kept', 0)}/{m.get('groups_in', 0)} groups "
        f"(all-correct {m.get('groups_all_correct', 0)}, all-wrong {m.get('groups_all_wrong', 0)}) "
        f"tool use {fmt(m.get('tool_use_share'), 2)} "
        f"tool-err pos {fmt(m.get('tool_error_ratio_pos'), 2)} "
        f"neg {fmt(m.get('tool_error_ratio_neg'), 2)} "
        f"len {fmt(m.get('response_len_mean'), 0)} trunc {fmt(m.get('truncation_ratio'), 2)} | "
        f"gen {fmt(m.get('time_rollout_s'), 1)}s grade {fmt(m.get('time_grade_tail_s'), 1)}s "
        f"train {fmt(m.get('time_train_s'), 1)}s sync {fmt(m.get('time_sync_s'), 2)}s"
        + services_note(m)
    )


def services_note(m: Mapping[str, Any]) -> str:
    """The step line's tail when the step restarted a service or an engine, or resent a call
    or a turn, else ""."""
    restarts, resent = m.get("service_restarts", 0), m.get("calls_retried", 0)
    note = ""
    if restarts or resent:
        note = f" | services: {restarts} restart{'s' * (restarts != 1)}, {resent} calls resent"
    engines, moved = m.get("engine_restarts", 0), m.get("turns_moved", 0)
    if engines or moved:
        note += f" | engines: {engines} restart{'s' * (engines != 1)}, {moved} turns moved"
    return note


TABLE_TITLE = "Held-out evaluation (benchmarks: avg@k)"
COLUMNS = (
    "set",
    "when",
    "step",
    "accuracy",
    "problems x k",
    "uses tool",
    "tool-err (correct)",
    "answered",
    "len",
)


def table_rows(evals: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """The final table's cells, held-out first, one row per evaluation."""
    return [
        (
            str(e.get("benchmark", "held-out")),
            str(e["when"]),
            str(e["step"]),
            fmt(e.get("accuracy")),
            f"{e.get('problems')} x {e.get('samples', 1)}",
            fmt(e.get("tool_use_share"), 2),
            fmt(e.get("tool_error_ratio_pos")),
            fmt(e.get("finish_answered"), 2),
            fmt(e.get("response_len_mean"), 0),
        )
        for e in sorted(evals, key=lambda e: str(e.get("benchmark", "")))
    ]


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, every cell whole; the first two columns left-aligned, the rest right."""
    cells = [list(columns), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]

    def line(row: Sequence[str]) -> str:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs]
        return "| " + " | ".join(cells) + " |"

    rule = ["-" * w if i < 2 else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
    return "\n".join([line(columns), line(rule), *(line(r) for r in rows)])


def final_table(
    evals: Sequence[Mapping[str, Any]], run_dir: Path, policy: Path, eval_settings: str
) -> None:
    """The held-out and benchmark evaluations of the run, then where its results are."""
    rows = table_rows(evals)
    if console.is_terminal:
        table = Table(title=TABLE_TITLE)
        for column in COLUMNS:
            table.add_column(column, justify="left" if column in ("set", "when") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:
        console.print(f"\n{TABLE_TITLE}\n\n{markdown_table(COLUMNS, rows)}\n")
    console.print(f"run directory: {run_dir}")
    if (run_dir / "heldout.jsonl").exists():
        console.print(
            f"trained policy: {policy} (its last held-out evaluation again: rstar2-eval run "
            f"{policy} {run_dir / 'heldout.jsonl'} {eval_settings})"
        )
    else:
        console.print(f"trained policy: {policy}")

"""What a person sees: progress bars, one line per step, the final table, and PNG plots."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(highlight=False)


@contextlib.contextmanager
def progress(description: str, total: int) -> Iterator[Any]:
    """A progress bar; yields `advance(n=1)`."""
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
    )


def final_table(
    evals: Sequence[Mapping[str, Any]], run_dir: Path, policy: Path, eval_settings: str
) -> None:
    table = Table(title="Held-out evaluation (benchmarks: avg@k)")
    columns = ("set", "when", "step", "accuracy", "problems x k", "uses tool", "tool-err (correct)")
    for column in (*columns, "answered", "len"):
        table.add_column(column, justify="left" if column in ("set", "when") else "right")
    for e in sorted(evals, key=lambda e: str(e.get("benchmark", ""))):  # held-out first
        table.add_row(
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
    console.print(table)
    console.print(f"run directory: {run_dir}")
    if (run_dir / "heldout.jsonl").exists():
        console.print(
            f"trained policy: {policy} (its last held-out evaluation again: rstar2-eval run "
            f"{policy} {run_dir / 'heldout.jsonl'} {eval_settings})"
        )
    else:
        console.print(f"trained policy: {policy}")


PLOTS = {
    "reward": ("rl", "reward"),
    "tool_error_ratio_pos": ("rl", "tool_error_ratio_pos"),
    "response_len_mean": ("rl", "response_len_mean"),
    "truncation_ratio": ("rl", "truncation_ratio"),
    "eval_accuracy": ("eval", "accuracy"),
    "benchmark_accuracy": ("benchmark", "accuracy"),
    "sft_loss": ("sft", "loss"),
}


def draw_plots(run_dir: Path, records: Sequence[Mapping[str, Any]]) -> list[Path]:
    """One PNG per main curve under plots/; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for name, (phase, key) in PLOTS.items():
        points = [
            (r["step"], r[key])
            for r in records
            if r.get("phase") == phase and r.get(key) is not None
        ]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written

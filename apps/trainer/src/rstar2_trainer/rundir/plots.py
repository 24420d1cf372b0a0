"""The run's plots: one PNG per curve under RUN_DIR/plots/, each saying what it shows.

`draw_plots(run_dir, records)` takes the records of metrics.jsonl (`phase`, `step`, metrics) and
writes a figure per curve that has points: a title in words, the x axis in RL (or SFT) steps,
the y axis with its unit, every stage switch (a `stage` record) as a dashed vertical line named
after the stage it starts, and, where a curve is per RL step (noisy: one batch each), the raw
points faint with a centred moving mean over them. Evaluation curves are drawn point to point,
one line per benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Curve:
    """One plot: which records and key it draws and what its title and axes say."""

    phase: str
    key: str
    title: str
    y_label: str
    x_label: str = "RL step"
    noisy: bool = False  # one value per RL batch: smooth it


PLOTS = {
    "reward": Curve(
        "rl", "reward", "Mean reward of the step's rollouts", "reward (0-1)", noisy=True
    ),
    "tool_error_ratio_pos": Curve(
        "rl",
        "tool_error_ratio_pos",
        "Failed tool calls in correct rollouts",
        "share of tool calls (0-1)",
        noisy=True,
    ),
    "response_len_mean": Curve(
        "rl", "response_len_mean", "Mean response length", "tokens", noisy=True
    ),
    "truncation_ratio": Curve(
        "rl",
        "truncation_ratio",
        "Rollouts cut at the length budget",
        "share of rollouts (0-1)",
        noisy=True,
    ),
    "eval_accuracy": Curve("eval", "accuracy", "Held-out accuracy", "accuracy (share correct)"),
    "benchmark_accuracy": Curve(
        "benchmark", "accuracy", "Benchmark accuracy (avg@k)", "accuracy (share correct)"
    ),
    "sft_loss": Curve(
        "sft",
        "loss",
        "SFT loss",
        "cross-entropy (nats per token)",
        x_label="SFT step",
        noisy=True,
    ),
}

SMOOTH_MIN_POINTS = 5  # fewer points than this: no moving mean


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """The centred mean over `window` points (fewer at the ends)."""
    half = window // 2
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half) : i + half + 1]
        out.append(sum(part) / len(part))
    return out


def figure(curve: Curve, records: Sequence[Mapping[str, Any]]) -> Any:
    """The matplotlib figure of one curve, or None when it has no points."""
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.get("phase") == curve.phase and r.get(curve.key) is not None:
            name = str(r.get("benchmark", "")) if curve.phase == "benchmark" else ""
            lines.setdefault(name, []).append((int(r["step"]), float(r[curve.key])))
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in sorted(lines.items()):
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        if curve.noisy and len(points) >= SMOOTH_MIN_POINTS:
            window = max(3, len(points) // 10) | 1  # odd
            ax.plot(xs, ys, "o", markersize=2.5, alpha=0.35, label="each step")
            ax.plot(xs, moving_mean(ys, window), linewidth=2, label=f"mean of {window} steps")
        else:
            ax.plot(xs, ys, marker="o", markersize=3, label=name or None)
    if curve.x_label == "RL step":
        for r in records:
            if r.get("phase") == "stage":
                to = r.get("to_name") or "end"
                ax.axvline(int(r["step"]) + 0.5, color="grey", linestyle="--", linewidth=1)
                ax.annotate(
                    f"stage: {to}",
                    (int(r["step"]) + 0.5, 1),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    va="top",
                    ha="right",
                    fontsize=7,
                    color="grey",
                )
    ax.set_title(curve.title)
    ax.set_xlabel(curve.x_label)
    ax.set_ylabel(curve.y_label)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def draw_plots(run_dir: Path, records: Sequence[Mapping[str, Any]]) -> list[Path]:
    """One PNG per curve with points under RUN_DIR/plots/; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for name, curve in PLOTS.items():
        fig = figure(curve, records)
        if fig is None:
            continue
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written

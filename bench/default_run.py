"""The default run a newcomer starts, once per seed: how long it takes and what RL adds.

    uv run python bench/default_run.py [--seeds 0 1 2] [--work runs/default_run]
        [--json bench/results/default_run.json] [a.b=value ...]

Each seed is `rstar2-train run.seed=SEED run.output_dir=WORK/sSEED` (the `tiny` recipe, nothing
else unless given), one after another so no run shares the machine with another. `wall_s` is the
trainer process's wall time from start to exit, start-up and both evaluations included (the
`uv run` install step is not: it is not the run). `after_sft` and `after_rl` are the held-out
accuracies of the evaluation after SFT and of the last one (the recipe's protocol: 128 problems,
4 samples each at temperature 0.6).

JSON: `{"runs": [{"seed", "wall_s", "after_sft", "after_rl", "gain", "sft_s", "rl_s"}, ...],
"summary": {"gain_mean", "gain_interval": [low, high], "after_rl_mean", "wall_s_mean",
"wall_s_max"}, "command": "..."}`; `sft_s` runs from the first SFT record to the evaluation after
SFT, `rl_s` from there to the last RL step. The interval is a 95 % t-interval over the seeds.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from roc_vs_grpo import interval, read_metrics, run_logged, trainer


def run_record(seed: int, wall_s: float, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's entry from its finished run's metrics.jsonl records."""
    evals = [r for r in records if r.get("phase") == "eval"]
    sft = [r for r in records if r.get("phase") == "sft"]
    rl = [r for r in records if r.get("phase") == "rl"]
    after_sft = next(r for r in evals if r["when"] == "after_sft")
    return {
        "seed": seed,
        "wall_s": round(wall_s, 1),
        "after_sft": after_sft["accuracy"],
        "after_rl": evals[-1]["accuracy"],
        "gain": evals[-1]["accuracy"] - after_sft["accuracy"],
        "sft_s": round(after_sft["time"] - sft[0]["time"], 1),
        "rl_s": round(rl[-1]["time"] - after_sft["time"], 1),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    gain = interval([r["gain"] for r in runs])
    spread = gain is not None and len(runs) >= 2
    return {
        "gain_mean": gain[0] if gain else None,
        "gain_interval": [gain[1], gain[2]] if spread and gain else None,
        "after_rl_mean": sum(r["after_rl"] for r in runs) / len(runs) if runs else None,
        "wall_s_mean": sum(r["wall_s"] for r in runs) / len(runs) if runs else None,
        "wall_s_max": max((r["wall_s"] for r in runs), default=None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="the default run, once per seed")
    parser.add_argument("overrides", nargs="*", help="a.b=value overrides of the tiny recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work", type=Path, default=Path("runs/default_run"))
    parser.add_argument("--json", type=Path, default=Path("bench/results/default_run.json"))
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        run_dir = args.work / f"s{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)  # a partial run would not time the whole
        cmd = trainer(f"run.seed={seed}", f"run.output_dir={run_dir}", *args.overrides)
        start = time.perf_counter()
        if run_logged(cmd, args.work / f"s{seed}.log"):
            return 1
        runs.append(run_record(seed, time.perf_counter() - start, read_metrics(run_dir)))
    print(f"{'seed':>4}{'wall s':>8}{'SFT s':>7}{'RL s':>6}{'after SFT':>11}{'after RL':>10}"
          f"{'gain':>8}")  # fmt: skip
    for r in runs:
        print(
            f"{r['seed']:>4}{r['wall_s']:>8.0f}{r['sft_s']:>7.0f}{r['rl_s']:>6.0f}"
            f"{r['after_sft']:>11.3f}{r['after_rl']:>10.3f}{r['gain']:>+8.3f}"
        )
    result = {
        "runs": runs,
        "summary": summary(runs),
        "command": shlex.join(["uv", "run", "python", *sys.argv]),
    }
    s = result["summary"]
    low_high = s["gain_interval"] or [float("nan")] * 2
    print(
        f"gain {s['gain_mean']:+.3f} [{low_high[0]:+.3f}, {low_high[1]:+.3f}] (95 % t over "
        f"{len(runs)} seeds); wall {s['wall_s_mean']:.0f} s mean, {s['wall_s_max']:.0f} s max"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

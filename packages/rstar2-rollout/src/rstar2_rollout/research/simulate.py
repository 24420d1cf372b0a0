"""A discrete-event simulator of agentic rollouts: the real `Scheduler` over simulated engines.

`simulate(scenario, config, seed)` draws a workload (`draw_workload`: per problem a shared
difficulty, per sample a long-tailed length and turn count, tool outputs and tool latencies), runs
it through `Scheduler(engines, config)` over `SimEngine`s (`simengine`) on a virtual clock, and
reports makespan, engine idle share, preemptions and how much of the admitted time trajectories
spent waiting for tools. Deterministic for a seed.

Tools run asynchronously per trajectory under every policy; `TurnBarrier` (`turn_barrier=True`)
adds VERL v0.2's per-turn synchronisation on each engine. `order` changes the order in which jobs
are submitted: `"submitted"` is prompt-major (what a trainer hands over); the two `oracle_*`
orders sort by the drawn lengths, which no real scheduler knows, to bound what ordering alone
could gain. Not modelled: network time, tool failures, and sampling itself.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from rstar2_rollout.config import SchedulerConfig
from rstar2_rollout.engine import Engine, SamplingParams
from rstar2_rollout.research.simengine import (
    EngineModel,
    EngineStats,
    SimEngine,
    VirtualClockLoop,
    run_virtual,
)
from rstar2_rollout.scheduler import Job, Scheduler

__all__ = [
    "EngineModel",
    "EngineStats",
    "LowerBound",
    "Order",
    "Scenario",
    "SimEngine",
    "SimResult",
    "TrajectorySpec",
    "TurnBarrier",
    "VirtualClockLoop",
    "draw_workload",
    "makespan_lower_bound",
    "order_workload",
    "run_trajectory",
    "run_virtual",
    "simulate",
]

Order = Literal["submitted", "oracle_longest_first", "oracle_group_longest_first"]


@dataclass(frozen=True)
class Scenario:
    """A rollout step to simulate; defaults follow the paper's stage 1 (see SCHEDULER.md)."""

    engines: int = 64
    prompts: int = 512
    samples_per_prompt: int = 32
    max_response_tokens: int = 8192  # budget L, tool tokens included (paper stage 1: 8K)
    max_turns: int = 10
    prompt_median_tokens: float = 400.0
    prompt_sigma: float = 0.4
    response_median_tokens: float = 3000.0  # lognormal: mean ~4K, ~10% clipped at 8K
    problem_sigma: float = 0.5  # shared by the samples of one problem (difficulty)
    sample_sigma: float = 0.6
    extra_turn_p: float = 0.7  # turns = 1 + geometric: P(another turn) = 0.7, capped
    tool_tokens_median: float = 60.0
    tool_tokens_sigma: float = 1.0
    tool_latency_median_s: float = 0.2  # the paper's service: 0.3 s per call on average
    tool_latency_sigma: float = 0.8
    tool_timeout_s: float = 10.0
    engine: EngineModel = field(default_factory=EngineModel)


@dataclass(frozen=True)
class TrajectorySpec:
    """One drawn trajectory: its prompt, each turn's sampled tokens, each tool call."""

    key: str
    prompt_tokens: int
    turn_tokens: tuple[int, ...]
    tool_tokens: tuple[int, ...]  # one per tool call; one per turn when a tool used up the budget
    tool_latency_s: tuple[float, ...]

    @property
    def group(self) -> str:
        """The problem this is a sample of (its siblings share the problem's difficulty)."""
        return self.key.rpartition("-")[0]

    @property
    def response_tokens(self) -> int:
        """Sampled plus tool tokens: what the trajectory spends of its budget."""
        return sum(self.turn_tokens) + sum(self.tool_tokens)


def order_workload(specs: list[TrajectorySpec], order: Order) -> list[TrajectorySpec]:
    """Reorder a drawn workload for submission. `oracle_longest_first` sorts by each sample's
    drawn length (longest-processing-time first, knowing what no scheduler can know);
    `oracle_group_longest_first` sorts problems by their samples' mean length, the best a
    scheduler that learns difficulty from finished siblings could know. Stable per seed."""
    if order == "submitted":
        return list(specs)
    if order == "oracle_longest_first":
        return sorted(specs, key=lambda s: -s.response_tokens)
    totals: Counter[str] = Counter()
    for s in specs:
        totals[s.group] += s.response_tokens
    return sorted(specs, key=lambda s: -totals[s.group])


def draw_workload(scenario: Scenario, seed: int) -> list[TrajectorySpec]:
    """Draw every trajectory of one step, prompt-major; the same seed gives the same list."""
    s, rng = scenario, random.Random(seed)
    out = []
    for p in range(s.prompts):
        prompt = max(
            32, round(rng.lognormvariate(math.log(s.prompt_median_tokens), s.prompt_sigma))
        )
        difficulty = rng.lognormvariate(0.0, s.problem_sigma)
        for i in range(s.samples_per_prompt):
            want = s.response_median_tokens * difficulty * rng.lognormvariate(0.0, s.sample_sigma)
            turns = 1
            while turns < s.max_turns and rng.random() < s.extra_turn_p:
                turns += 1
            weights = [rng.expovariate(1.0) for _ in range(turns)]
            total_w = sum(weights)
            budget, decode, tools, lat = s.max_response_tokens, [], [], []
            for t, w in enumerate(weights):
                d = min(budget, max(1, round(want * w / total_w)))
                decode.append(d)
                budget -= d
                if t == turns - 1 or budget <= 0:
                    break
                tt = round(rng.lognormvariate(math.log(s.tool_tokens_median), s.tool_tokens_sigma))
                tt = min(budget, max(1, tt))
                latency = rng.lognormvariate(
                    math.log(s.tool_latency_median_s), s.tool_latency_sigma
                )
                tools.append(tt)
                lat.append(min(s.tool_timeout_s, latency))
                budget -= tt
                if budget <= 0:
                    break
            out.append(
                TrajectorySpec(f"p{p}-s{i}", prompt, tuple(decode), tuple(tools), tuple(lat))
            )
    return out


class TurnBarrier:
    """VERL v0.2's per-turn synchronisation: on one engine, every trajectory still running
    finishes generating before any tool runs, and every tool returns before the next turn."""

    def __init__(self) -> None:
        self._parties: dict[str, int] = {}
        self._arrived: dict[str, int] = {}
        self._release: dict[str, asyncio.Future[None]] = {}

    def join(self, engine: str) -> None:
        self._parties[engine] = self._parties.get(engine, 0) + 1

    def leave(self, engine: str) -> None:
        self._parties[engine] -= 1
        self._maybe_release(engine)

    async def wait(self, engine: str) -> None:
        self._arrived[engine] = self._arrived.get(engine, 0) + 1
        fut = self._release.get(engine)
        if fut is None:
            fut = self._release[engine] = asyncio.get_running_loop().create_future()
        self._maybe_release(engine)
        await fut

    def _maybe_release(self, engine: str) -> None:
        arrived = self._arrived.get(engine, 0)
        if arrived and arrived >= self._parties[engine]:
            self._arrived[engine] = 0
            self._release.pop(engine).set_result(None)


async def run_trajectory(
    engine: Engine,
    spec: TrajectorySpec,
    barrier: TurnBarrier | None = None,
    script: dict[str, int] | None = None,
    budget: int | None = None,
) -> int:
    """Play one drawn trajectory on an engine: generate, wait for the tool, repeat; total tokens.

    With a `script` (the one the `SimEngine`s read) and a `budget`, each turn asks for the whole
    budget left, as the agent loop does, and the script makes the simulated model stop at the drawn
    length; without them each turn asks for exactly its drawn length."""
    context = spec.prompt_tokens
    if barrier is not None:
        barrier.join(engine.name)
    try:
        for turn, want in enumerate(spec.turn_tokens):
            request_id = f"{spec.key}/{turn}"
            limit = want
            if script is not None and budget is not None:
                script[request_id] = want
                limit = budget - (context - spec.prompt_tokens)
            params = SamplingParams(max_tokens=limit, logprobs=False)
            out = await engine.generate(range(context), params, request_id)
            if out.finish_reason == "error":
                raise RuntimeError(f"generate failed: {out.error}")
            context += len(out.token_ids)
            if turn < len(spec.tool_tokens):
                if barrier is not None:
                    await barrier.wait(engine.name)
                await asyncio.sleep(spec.tool_latency_s[turn])
                if barrier is not None:
                    await barrier.wait(engine.name)
                context += spec.tool_tokens[turn]
    finally:
        if barrier is not None:
            barrier.leave(engine.name)
    return context


@dataclass(frozen=True)
class SimResult:
    """What one simulated step cost."""

    policy: str
    turn_barrier: bool
    makespan_s: float
    idle_share: float  # mean over engines of the share of the makespan with nothing running
    preemption_events: int
    preempted_requests: int
    recomputed_tokens: int
    decoded_tokens: int
    trajectories: int
    failed: int
    order: str = "submitted"
    # share of the admitted trajectory-time spent waiting for tools: the most that releasing a
    # reservation between turns could hand back
    tool_wait_share: float = 0.0
    steps: int = 0  # engine steps, summed over engines
    prefill_tokens: int = 0  # prefilled tokens (recomputed ones included), summed over engines
    busy_max_s: float = 0.0  # the busiest engine's busy seconds


@dataclass(frozen=True)
class LowerBound:
    """What no schedule of a drawn workload can beat on the simulated engines (seconds)."""

    path_s: float  # the slowest trajectory alone: its decode steps, prefill and tool waits
    work_s: float  # every engine's step costs, spread perfectly (see `makespan_lower_bound`)

    @property
    def makespan_s(self) -> float:
        return max(self.path_s, self.work_s)


def makespan_lower_bound(scenario: Scenario, seed: int) -> LowerBound:
    """A lower bound on the makespan of `draw_workload(scenario, seed)` under any policy.

    On `SimEngine` a step costs `a + c_req x decoding + c_kv x KV in use + prefill / rate` with
    `a = scheduler_step_s + base_step_s`. A turn that starts decoding with context `c` and writes
    `d` tokens adds `c_req d + c_kv (d c + d (d - 1) / 2)` to its engine's busy time wherever it
    runs, and each turn prefills at least its new tokens (the prompt, the tool output). Summed over
    trajectories that is `W`, the same for every policy (preemption only adds to it). An engine
    also pays `a` per step, and one that runs a trajectory of `D` decode steps takes at least `D`
    steps. With `A` engines hosting the trajectories of at least `D` steps (work `W_D`):
    `E T >= W + A a D` and `T >= a D + W_D / A`; the bound is the least over `A` of the larger,
    the largest over `D`. `path_s`: one trajectory's own steps (a batch of one), prefill and tool
    waits in series."""
    m = scenario.engine
    a = m.scheduler_step_s + m.base_step_s
    items: list[tuple[int, float]] = []  # (decode steps, work) per trajectory
    path = 0.0
    for spec in draw_workload(scenario, seed):
        context, steps, kv, prefill = spec.prompt_tokens, 0, 0, spec.prompt_tokens
        for t, d in enumerate(spec.turn_tokens):
            kv += d * context + d * (d - 1) // 2
            steps += d
            context += d
            if t < len(spec.tool_tokens):
                context += spec.tool_tokens[t]
                prefill += spec.tool_tokens[t]
        work = m.per_request_step_s * steps + m.per_kv_token_step_s * kv
        work += prefill / m.prefill_tokens_per_s
        items.append((steps, work))
        path = max(path, a * steps + work + sum(spec.tool_latency_s))
    engines = scenario.engines
    total = sum(w for _, w in items)
    items.sort(key=lambda x: -x[0])
    best, top = total / engines, 0.0
    for i, (d, w) in enumerate(items):
        top += w
        if i + 1 < len(items) and items[i + 1][0] == d:
            continue  # W_D takes every trajectory of at least D steps
        bound = min(
            max((total + k * a * d) / engines, a * d + top / k) for k in range(1, engines + 1)
        )
        best = max(best, bound)
    return LowerBound(path_s=path, work_s=best)


def simulate(
    scenario: Scenario,
    config: SchedulerConfig,
    seed: int,
    turn_barrier: bool = False,
    order: Order = "submitted",
    forced_lengths: bool = False,
) -> SimResult:
    """Run one step of `scenario` under `config` on a virtual clock; `turn_barrier` adds
    VERL v0.2's per-turn synchronisation (`TurnBarrier`) on top of the scheduling policy and
    `order` the submission order (see the module docstring). Each turn asks for the whole
    budget left and stops at its drawn length, as a model stops at its end token; with
    `forced_lengths` it asks for exactly its drawn length (`max_tokens`, as a benchmark on a
    real engine forces it)."""
    specs = order_workload(draw_workload(scenario, seed), order)
    script: dict[str, int] = {}  # what the simulated model writes per request, drawn in advance
    engines = [SimEngine(f"engine-{i}", scenario.engine, script) for i in range(scenario.engines)]

    async def main() -> tuple[float, int, float]:
        scheduler: Scheduler[int] = Scheduler(engines, config)
        barrier = TurnBarrier() if turn_barrier else None
        jobs = [
            Job(
                lambda e, s=s: run_trajectory(
                    e, s, barrier, None if forced_lengths else script, scenario.max_response_tokens
                ),
                s.prompt_tokens,
                scenario.max_response_tokens,
                tag=s.key,
                group=s.group,
            )
            for s in specs
        ]
        results = await scheduler.run(jobs)
        makespan = asyncio.get_running_loop().time()
        for e in engines:
            await e.close()
        admitted = sum(r.finished_at - r.started_at for r in results if r.started_at is not None)
        waiting = sum(sum(s.tool_latency_s) for s in specs)
        return makespan, sum(not r.ok for r in results), waiting / admitted if admitted else 0.0

    makespan, failed, tool_wait_share = run_virtual(main())
    stats = [e.stats for e in engines]
    return SimResult(
        policy=config.policy.kind,
        turn_barrier=turn_barrier,
        makespan_s=makespan,
        idle_share=sum(1 - s.busy_s / makespan for s in stats) / len(stats) if makespan else 0.0,
        preemption_events=sum(s.preemption_events for s in stats),
        preempted_requests=sum(s.preempted_requests for s in stats),
        recomputed_tokens=sum(s.recomputed_tokens for s in stats),
        decoded_tokens=sum(s.decoded_tokens for s in stats),
        trajectories=len(specs),
        failed=failed,
        order=order,
        tool_wait_share=tool_wait_share,
        steps=sum(s.steps for s in stats),
        prefill_tokens=sum(s.prefill_tokens for s in stats),
        busy_max_s=max(s.busy_s for s in stats),
    )

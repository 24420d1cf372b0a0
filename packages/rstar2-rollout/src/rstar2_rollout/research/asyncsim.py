"""Several RL steps on the simulator: synchronous steps against bounded-staleness asynchronous ones.

`run_steps(scenario, config, train, AsyncSimConfig(...), seed)` plays `steps` RL steps of
`scenario` (`simulate.Scenario`: engines, prompts, 2G samples per prompt, lengths) through the
real `Scheduler` over `SimEngine`s on one virtual clock, with a trainer beside them (split
placement: the trainer has its own GPUs, the engines theirs). `run_sync` is the synchronous step. It
is a model for choosing settings, not the trainer's pool (`pool.py`, which drops no group).

- **Groups.** A prompt's 2G samples are one group; groups are drawn lazily, `prompts` per
  chunk, chunk c from a seed derived from (run seed, c), so both modes roll out the same
  trajectories in the same order. A step trains `prompts` groups (B), each whole.
- **sync** (`run_sync`): submit one chunk, wait for its last trajectory, train, push the
  weights; the engines idle while the trainer trains and pushes.
- **async** (`run_steps`): a new group is admitted (checked as each trajectory ends) while
  the in-flight cap allows it, and only while `admitted < (version + max_staleness + 1) x B`
  (AReaL's rule: the rollout runs at most that far ahead of the trainer). The cap is
  `inflight_steps` steps' worth (1.0: the load a synchronous step starts with) of
  `cap_unit`: "trajectories" (at most inflight_steps x B x 2G unfinished trajectories: the
  engines stay full however many groups wait on a straggler) or "groups" (at most
  inflight_steps x B unfinished groups: a group waiting on one straggler keeps its place, so
  fewer trajectories share the engines with the stragglers). A step trains the first B groups
  that finish (completion order), while the engines keep generating. After its
  update the trainer pushes the weights: every engine pauses `weight_sync_s` between two of its
  steps (`SimEngine.pause`), then the version is bumped and every engine's prefix cache reset
  (`update_weights`); running trajectories keep their place and KV and continue with the new
  weights (partial rollouts). Any group, finished or not, whose oldest version is now more than
  `max_staleness` behind is dropped (its trajectories cancelled) and counted. With
  `partial_rollout=False` the push first waits until every admitted trajectory has finished
  (no new ones start meanwhile), so no trajectory spans two versions.
- **Staleness** of a trained trajectory = the trainer's version at its step minus the oldest
  version its tokens used, taken as the version when its group was admitted: an upper bound (a
  request still queued in its engine through a push samples its first token with newer weights).
- **Where the time goes** (`RunResult`): per engine, busy (of which recompute after
  preemption), paused for pushes and idle; for the trainer, training, pushing and idle; tokens
  written in all against those of trained trajectories. `packed_work_s` is the engine work a
  set of trajectories needs at least (perfectly packed, nothing preempted); `overlap_bound_s`
  the shortest run that work and the trainer's allow with perfect overlap.
- **Training time** (`TrainModel`, the capacity model's rule, bench/capacity.py): the update
  costs `update_gpu_us_per_token` GPU-microseconds per kept token over `gpus` trainer GPUs, the
  old-logprob forward a quarter of that, plus `other_s`; kept tokens are `kept_share` of the
  batch's prompt + response tokens (RoC keeps G of 2G, a quarter of groups drop as uniform).

With `max_staleness=0` and `partial_rollout=False` the asynchronous runner admits one chunk per
version and waits for all of it: it is the synchronous step (a test pins the equality). Not
modelled: the off-policy correction's effect on learning, network time of the push beyond
`weight_sync_s`, and trainer failures; trajectories start with the version at admission.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

from rstar2_rollout.config import SchedulerConfig
from rstar2_rollout.job import JobResult
from rstar2_rollout.research.simulate import (
    EngineModel,
    Scenario,
    SimEngine,
    TrajectorySpec,
    draw_workload,
    run_trajectory,
    run_virtual,
)
from rstar2_rollout.scheduler import Job, Scheduler

__all__ = [
    "AsyncSimConfig",
    "RunResult",
    "StepRecord",
    "TrainModel",
    "Workload",
    "overlap_bound_s",
    "packed_work_s",
    "run_steps",
    "run_sync",
]


@dataclass(frozen=True)
class TrainModel:
    """The trainer's time per step and the weight push (defaults: bench/capacity.py's
    `Capacity`, assumed numbers for Qwen3-14B, none measured here)."""

    gpus: int = 64
    update_gpu_us_per_token: float = 240.0
    old_logprob_share: float = 0.25  # the old-logprob forward, a quarter of an update
    kept_share: float = 0.375  # (1 - 0.25 dropped groups) x 16 kept of 32
    other_s: float = 10.0  # data, advantages, RoC, logging, checkpoint share
    weight_sync_s: float = 20.0

    def train_s(self, tokens: int) -> float:
        """Seconds to train a batch of `tokens` prompt + response tokens (before RoC)."""
        update = tokens * self.kept_share * self.update_gpu_us_per_token * 1e-6 / self.gpus
        return update * (1 + self.old_logprob_share) + self.other_s


@dataclass(frozen=True)
class AsyncSimConfig:
    # defaults: the best of five settings on tuning seeds 21-23 (stage3 and stage3_late at TP=1,
    # 1/8 scale, bench/rollout_async.py; SCHEDULER.md, "Asynchronous steps, simulated")
    steps: int = 10
    max_staleness: int = 2  # versions; 0 with partial_rollout=False is the synchronous step
    partial_rollout: bool = True  # False: a push waits until no trajectory is running
    # what the in-flight cap counts: unfinished trajectories, or unfinished groups (a group
    # holds its place until its last trajectory ends)
    cap_unit: Literal["trajectories", "groups"] = "groups"
    # the cap, in steps' worth: inflight_steps x B x 2G trajectories, or x B groups
    inflight_steps: float = 1.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.max_staleness < 0:
            raise ValueError("steps must be >= 1 and max_staleness >= 0")
        if self.cap_unit not in ("trajectories", "groups"):
            raise ValueError(f"cap_unit must be trajectories or groups, got {self.cap_unit!r}")
        if not self.inflight_steps > 0:
            raise ValueError("inflight_steps must be > 0")


@dataclass(frozen=True)
class StepRecord:
    """One trained step: when its batch was complete, when its push ended, what it trained."""

    step: int
    ready_s: float  # the B-th group of its batch finished (virtual seconds)
    end_s: float  # its weights were pushed
    train_s: float
    tokens: int
    groups: tuple[tuple[int, int], ...]  # (group index, finished trajectories) per group
    staleness: tuple[int, ...]  # per group (all its trajectories share the admission version)


@dataclass(frozen=True)
class RunResult:
    mode: str
    steps: tuple[StepRecord, ...]
    samples_per_group: int
    admitted_trajectories: int
    dropped_trajectories: int
    unfinished_trajectories: int  # admitted, neither trained nor dropped when the run ended
    preempted_requests: int
    idle_share: float  # engines, over the run (idle or paused for a push)
    staleness_counts: dict[int, int] = field(default_factory=dict)  # trajectories per value
    # where the time went, per engine (mean over engines) and for the trainer, in seconds
    engine_busy_s: float = 0.0  # taking steps: decode, prefill, recompute after preemption
    engine_paused_s: float = 0.0  # loading pushed weights (pushes x weight_sync_s)
    recompute_s: float = 0.0  # of busy: prefilling again what preemption threw away
    decoded_tokens: int = 0  # all engines: every token written, trained or not
    trained_decoded_tokens: int = 0  # written for the trajectories that were trained
    trainer_train_s: float = 0.0
    trainer_push_s: float = 0.0
    # per engine, summed over pushes: re-prefill that aborting running turns at each push (and
    # resuming them after) would add, from the KV they held then; not simulated, computed
    abort_recompute_s: float = 0.0
    # per engine: `packed_work_s` of the trained trajectories, spread evenly over the engines
    packed_work_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.steps[-1].end_s

    @property
    def engine_idle_s(self) -> float:
        return self.seconds - self.engine_busy_s - self.engine_paused_s

    @property
    def trainer_idle_s(self) -> float:
        return self.seconds - self.trainer_train_s - self.trainer_push_s

    @property
    def trained_trajectories(self) -> int:
        return sum(n for s in self.steps for _, n in s.groups)

    @property
    def trajectories_per_s(self) -> float:
        return self.trained_trajectories / self.seconds

    @property
    def mean_staleness(self) -> float:
        total = sum(self.staleness_counts.values())
        return sum(k * v for k, v in self.staleness_counts.items()) / total if total else 0.0


def overlap_bound_s(result: RunResult, weight_sync_s: float) -> float:
    """The shortest time any schedule could train `result`'s batches in: its trajectories' packed
    work (`packed_work_s`, per engine) back to back with only the pushes' pauses between (the last
    batch is ready no earlier), or the trainer's chain (the first batch's share of the work, then
    every training and push but the last), whichever is longer; then the last training and push."""
    steps = result.steps
    engines = result.packed_work_s + (len(steps) - 1) * weight_sync_s
    first = result.packed_work_s / len(steps)
    trainer = first + sum(s.train_s + weight_sync_s for s in steps[:-1])
    return max(engines, trainer) + steps[-1].train_s + weight_sync_s


class Workload:
    """An endless stream of groups: group g is prompt g mod B of chunk g // B, and chunk c is
    `draw_workload(scenario, seed derived from (seed, c))` with keys made unique per chunk."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario, self.seed = scenario, seed
        self._chunks: dict[int, list[TrajectorySpec]] = {}

    def chunk(self, c: int) -> list[TrajectorySpec]:
        if c not in self._chunks:
            digest = hashlib.sha256(f"{self.seed}/{c}".encode()).digest()
            specs = draw_workload(self.scenario, int.from_bytes(digest[:8], "big"))
            self._chunks[c] = [dataclasses.replace(s, key=f"c{c}{s.key}") for s in specs]
        return self._chunks[c]

    def group(self, g: int) -> list[TrajectorySpec]:
        n = self.scenario.samples_per_prompt
        start = g % self.scenario.prompts * n
        return self.chunk(g // self.scenario.prompts)[start : start + n]


@dataclass(eq=False)
class _Group:
    index: int
    version: int  # at admission: the oldest version its tokens can have used
    futures: list[asyncio.Future[JobResult[int]]]
    left: int
    tokens: int = 0


def _job(spec: TrajectorySpec, scenario: Scenario, script: dict[str, int]) -> Job[int]:
    return Job(
        lambda e: run_trajectory(e, spec, None, script, scenario.max_response_tokens),
        spec.prompt_tokens,
        scenario.max_response_tokens,
        tag=spec.key,
        group=spec.group,
    )


def _engines(scenario: Scenario, script: dict[str, int]) -> list[SimEngine]:
    return [SimEngine(f"engine-{i}", scenario.engine, script) for i in range(scenario.engines)]


async def _push(engines: list[SimEngine], seconds: float) -> tuple[float, float]:
    """The trainer sends `seconds` worth of weights; each engine loads them between two steps.

    Returns, per engine (mean): when its pause ends after the push does (it starts after the
    step in flight), and what aborting its running requests instead would cost: the seconds to
    prefill again the KV they hold (no prefix survives new weights)."""
    now = asyncio.get_running_loop().time()
    held = [(e.kv_capacity(), e.model.prefill_tokens_per_s) for e in engines]
    # the step in flight ends first (SimEngine.pause)
    late = sum(max(0.0, e._step_end - now) for e in engines) / len(engines)
    for e in engines:
        e.pause(seconds)
    await asyncio.sleep(seconds)
    for e in engines:
        await e.update_weights([])  # new weights: the prefix cache is reset
    abort = sum((c.total_tokens - c.free_tokens) / rate for c, rate in held) / len(engines)
    return late, abort


def packed_work_s(specs: list[TrajectorySpec], model: EngineModel) -> float:
    """The engine-seconds `specs` need on `model`'s engine perfectly packed: every decoded
    token's share of a step (per request, and per KV token it reads), prompts and tool outputs
    prefilled once, nothing preempted or recomputed, and the per-step costs shared by a full
    batch: as many requests as the KV cache holds at their mean context (at most max_num_seqs)."""
    tokens = kv = prefill = 0
    for spec in specs:
        context = prefill_spec = spec.prompt_tokens
        for turn, t in enumerate(spec.turn_tokens):
            kv += t * context + t * (t - 1) // 2
            tokens += t
            context += t
            if turn + 1 < len(spec.turn_tokens):  # the tool's output is read by the next turn
                context += spec.tool_tokens[turn]
                prefill_spec += spec.tool_tokens[turn]
        prefill += prefill_spec
    if not tokens:
        return prefill / model.prefill_tokens_per_s
    batch = min(model.max_num_seqs, max(1.0, model.kv_tokens * tokens / kv))
    per_step = model.base_step_s + model.scheduler_step_s
    return (
        tokens * model.per_request_step_s
        + kv * model.per_kv_token_step_s
        + prefill / model.prefill_tokens_per_s
        + per_step * tokens / batch
    )


def _decoded(workload: Workload, index: int, tokens: int) -> int:
    """Tokens the engines wrote for group `index`, whole, whose trajectories hold `tokens`."""
    given = sum(s.prompt_tokens + sum(s.tool_tokens) for s in workload.group(index))
    return tokens - given


def _finish(
    mode: str,
    records: list[StepRecord],
    engines: list[SimEngine],
    train: TrainModel,
    samples: int,
    counts: tuple[int, int, int, int],  # admitted, dropped, unfinished, trained decoded tokens
    pushes: tuple[float, float],  # summed over pushes: (the last one's overhang, abort cost)
    trained: list[TrajectorySpec],
) -> RunResult:
    end = records[-1].end_s
    staleness: Counter[int] = Counter()
    for r in records:
        for (_, n), s in zip(r.groups, r.staleness, strict=True):
            staleness[s] += n
    admitted, dropped, unfinished, trained_decoded = counts
    busy = sum(e.stats.busy_s for e in engines) / len(engines)
    recomputed = sum(e.stats.recomputed_tokens / e.model.prefill_tokens_per_s for e in engines)
    return RunResult(
        mode=mode,
        steps=tuple(records),
        samples_per_group=samples,
        admitted_trajectories=admitted,
        dropped_trajectories=dropped,
        unfinished_trajectories=unfinished,
        preempted_requests=sum(e.stats.preempted_requests for e in engines),
        idle_share=1 - busy / end,
        staleness_counts=dict(sorted(staleness.items())),
        engine_busy_s=busy,
        engine_paused_s=len(records) * train.weight_sync_s - pushes[0],
        recompute_s=recomputed / len(engines),
        decoded_tokens=sum(e.stats.decoded_tokens for e in engines),
        trained_decoded_tokens=trained_decoded,
        trainer_train_s=sum(r.train_s for r in records),
        trainer_push_s=len(records) * train.weight_sync_s,
        abort_recompute_s=pushes[1],
        packed_work_s=packed_work_s(trained, engines[0].model) / len(engines),
    )


def run_sync(
    scenario: Scenario, config: SchedulerConfig, train: TrainModel, steps: int, seed: int
) -> RunResult:
    """Today's synchronous steps: roll out a chunk to its last trajectory, train, push."""
    workload, script = Workload(scenario, seed), {}
    engines = _engines(scenario, script)

    async def main() -> RunResult:
        loop = asyncio.get_running_loop()
        scheduler: Scheduler[int] = Scheduler(engines, config)
        records, decoded, abort_s, late = [], 0, 0.0, 0.0
        trained: list[TrajectorySpec] = []
        for step in range(steps):
            specs = workload.chunk(step)
            futures = [scheduler.submit(_job(s, scenario, script)) for s in specs]
            results = await asyncio.gather(*futures)
            failed = [r.error for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{len(failed)} trajectories failed: {failed[0]}")
            ready, tokens = loop.time(), sum(r.value or 0 for r in results)
            await asyncio.sleep(train.train_s(tokens))
            late, abort = await _push(engines, train.weight_sync_s)
            abort_s += abort
            n, groups = scenario.samples_per_prompt, scenario.prompts
            decoded += sum(r.value or 0 for r in results) - sum(
                s.prompt_tokens + sum(s.tool_tokens) for s in specs
            )
            trained.extend(specs)
            records.append(
                StepRecord(
                    step,
                    ready,
                    loop.time(),
                    train.train_s(tokens),
                    tokens,
                    tuple((step * groups + p, n) for p in range(groups)),
                    (0,) * groups,
                )
            )
        await _close(scheduler, engines)
        total = steps * scenario.prompts * scenario.samples_per_prompt
        n = scenario.samples_per_prompt
        return _finish(
            "sync", records, engines, train, n, (total, 0, 0, decoded), (late, abort_s), trained
        )

    return run_virtual(main())


async def _close(scheduler: Scheduler[int], engines: list[SimEngine]) -> None:
    await scheduler.close()
    for e in engines:
        await e.close()


def run_steps(
    scenario: Scenario, config: SchedulerConfig, train: TrainModel, run: AsyncSimConfig, seed: int
) -> RunResult:
    """Asynchronous steps with partial rollouts under a staleness bound (module docstring)."""
    workload, script = Workload(scenario, seed), {}
    engines = _engines(scenario, script)
    b, n, bound = scenario.prompts, scenario.samples_per_prompt, run.max_staleness
    groups_cap = run.cap_unit == "groups"
    cap = max(1 if groups_cap else n, round(run.inflight_steps * b * (1 if groups_cap else n)))

    async def main() -> RunResult:
        loop = asyncio.get_running_loop()
        scheduler: Scheduler[int] = Scheduler(engines, config)
        inflight: dict[int, _Group] = {}
        ready: deque[_Group] = deque()
        changed = asyncio.Event()
        state = {"version": 0, "admitted": 0, "dropped": 0, "running": 0, "pushing": False}
        failures: list[str] = []

        def on_done(group: _Group, future: asyncio.Future[JobResult[int]]) -> None:
            if future.cancelled() or group.index not in inflight:
                return  # dropped
            result = future.result()
            if not result.ok:
                failures.append(result.error or "failed")
            group.left -= 1
            state["running"] -= 1
            group.tokens += result.value or 0
            if group.left == 0:  # the group is whole: it may enter a batch
                del inflight[group.index]
                ready.append(group)
            admit()  # a new prompt takes the place it freed, if whole
            changed.set()

        def admit() -> None:
            while (
                not state["pushing"]
                and (len(inflight) < cap if groups_cap else state["running"] + n <= cap)
                and state["admitted"] < (state["version"] + bound + 1) * b
            ):
                g = state["admitted"]
                group = _Group(g, state["version"], [], n)
                inflight[g] = group
                state["running"] += n
                for spec in workload.group(g):
                    future = scheduler.submit(_job(spec, scenario, script))
                    future.add_done_callback(lambda f, grp=group: on_done(grp, f))
                    group.futures.append(future)
                state["admitted"] += 1

        async def until(condition: str) -> None:
            while not (len(ready) >= b if condition == "batch" else not inflight):
                if failures:
                    raise RuntimeError(f"{len(failures)} trajectories failed: {failures[0]}")
                changed.clear()
                await changed.wait()

        admit()
        records, decoded, abort_s, late = [], 0, 0.0, 0.0
        trained: list[TrajectorySpec] = []
        for step in range(run.steps):
            await until("batch")
            batch = [ready.popleft() for _ in range(b)]
            ready_at, tokens = loop.time(), sum(g.tokens for g in batch)
            decoded += sum(_decoded(workload, g.index, g.tokens) for g in batch)
            trained.extend(spec for g in batch for spec in workload.group(g.index))
            await asyncio.sleep(train.train_s(tokens))
            state["pushing"] = True
            if not run.partial_rollout:
                await until("drained")
            late, abort = await _push(engines, train.weight_sync_s)
            abort_s += abort
            state["version"] += 1
            for group in [*inflight.values(), *ready]:
                if state["version"] - group.version > bound:  # can never be trained now
                    state["dropped"] += n
                    if inflight.pop(group.index, None) is not None:
                        state["running"] -= group.left
                    for f in group.futures:
                        f.cancel()
            ready_kept = [g for g in ready if state["version"] - g.version <= bound]
            ready.clear()
            ready.extend(ready_kept)
            state["pushing"] = False
            admit()
            records.append(
                StepRecord(
                    step,
                    ready_at,
                    loop.time(),
                    train.train_s(tokens),
                    tokens,
                    tuple((g.index, n - g.left) for g in batch),
                    tuple(step - g.version for g in batch),
                )
            )
        state["pushing"] = True  # admit nothing more
        unfinished = (len(inflight) + len(ready)) * n
        await _close(scheduler, engines)
        admitted = state["admitted"] * n
        counts = (admitted, state["dropped"], unfinished, decoded)
        return _finish("async", records, engines, train, n, counts, (late, abort_s), trained)

    return run_virtual(main())

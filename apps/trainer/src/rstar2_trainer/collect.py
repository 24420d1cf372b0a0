"""Collect graded trajectories: the scheduler places them on engines, grading overlaps generation.

Each problem is rolled out `n` times through the rollout package's scheduler (KV-cache-aware by
default) and agent loop; as soon as a trajectory finishes, its `<answer>` block goes to the
grader, so grading runs off the generation path as in the paper. `EngineMeter` wraps an engine to
measure how long it sat with nothing to generate while the rollout was open: the "GPU-idle
equivalent" of waiting on tools and grading.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rstar2_curriculum import Problem
from rstar2_rollout import (
    Engine,
    EngineProgress,
    Generation,
    KVCapacity,
    ProgressEngine,
    RolloutConfig,
    SamplingParams,
)
from rstar2_rollout.loop import derive_seed, run_agent
from rstar2_rollout.scheduler import Job
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.verifier import Verifier, answer_text

if TYPE_CHECKING:
    from rstar2_trainer.build import Parts


class EngineMeter:
    """An `Engine` that counts in-flight generate calls and the time it had none."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine
        self.name = engine.name
        self._in_flight = 0
        self._idle_since: float | None = None
        self.idle_s = 0.0
        self.busy = False  # True while a rollout window is open

    def open(self) -> None:
        self.busy, self.idle_s = True, 0.0
        self._idle_since = time.perf_counter() if self._in_flight == 0 else None

    def close_window(self) -> float:
        if self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
        self.busy, self._idle_since = False, None
        return self.idle_s

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if self._in_flight == 0 and self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        self._in_flight += 1
        try:
            return await self.inner.generate(prompt_ids, params, request_id)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self.busy:
                self._idle_since = time.perf_counter()

    def kv_capacity(self) -> KVCapacity | None:
        return self.inner.kv_capacity()

    def progress(self) -> EngineProgress | None:
        """The inner engine's progress report, if it gives one (`ProgressEngine`)."""
        return self.inner.progress() if isinstance(self.inner, ProgressEngine) else None

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self.inner.update_weights(named_tensors)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Collected:
    """Graded trajectories of one batch, with the wall times of the phases."""

    problems: list[Problem]
    trajectories: list[Trajectory]  # grouped by problem, in sample order
    failed_jobs: list[str] = field(default_factory=list)  # reasons of jobs with no trajectory
    rollout_s: float = 0.0  # first job submitted -> last trajectory back
    grade_tail_s: float = 0.0  # grading left after the last trajectory came back
    engine_idle_s: float = 0.0  # summed over engines, while the rollout was open
    tool_s: float = 0.0  # summed time trajectories waited on the sandbox
    generate_s: float = 0.0  # summed time trajectories waited on the engine

    @classmethod
    def of(
        cls,
        problems: Sequence[Problem],
        trajectories: Iterable[Trajectory],
        failed_jobs: list[str],
        *,
        rollout_s: float,
        grade_tail_s: float,
        engine_idle_s: float,
    ) -> Collected:
        """Trajectories put back in batch order (problem, then sample) and their summed times."""
        order = {p.id: i for i, p in enumerate(problems)}
        ordered = sorted(trajectories, key=lambda t: (order[t.group_id], t.sample_index))
        return cls(
            problems=list(problems),
            trajectories=ordered,
            failed_jobs=failed_jobs,
            rollout_s=rollout_s,
            grade_tail_s=grade_tail_s,
            engine_idle_s=engine_idle_s,
            tool_s=sum(t.timings.tool_s for t in ordered),
            generate_s=sum(t.timings.generate_s for t in ordered),
        )


async def collect(
    problems: Sequence[Problem],
    n: int,
    parts: Parts,
    config: RolloutConfig,
    on_done: Callable[[], None] | None = None,
) -> Collected:
    """Roll out `n` trajectories per problem on `parts` and grade each as it finishes."""
    if parts.remote is not None:
        from rstar2_trainer.remote import collect_remote

        return await collect_remote(problems, n, parts, config, on_done)
    scheduler, meters, sandbox = parts.scheduler, parts.engines, parts.sandbox
    assert scheduler is not None and sandbox is not None
    verifier, tokenizer = parts.verifier, parts.tokenizer
    from rstar2_rollout.chat import ChatFormat, system_prompt

    fmt = ChatFormat(tokenizer, system_prompt(style=config.system_prompt))
    jobs = []
    by_id = {p.id: p for p in problems}
    for problem in problems:
        prompt_len = len(fmt.prompt_ids(problem.question))
        for i in range(n):

            async def run(engine: Engine, problem: Problem = problem, i: int = i) -> Trajectory:
                return await run_agent(engine, sandbox, fmt, problem, config, sample_index=i)

            jobs.append(Job(run, prompt_len, config.max_response_tokens))
    for meter in meters:
        meter.open()
    start = time.perf_counter()
    trajectories: list[Trajectory] = []
    failed: list[str] = []
    grading: list[asyncio.Task] = []

    async for result in scheduler.stream(jobs):
        if result.ok and result.value is not None:
            trajectories.append(result.value)
            problem = by_id[result.value.group_id]
            grading.append(asyncio.create_task(grade_trajectory(verifier, problem, result.value)))
        else:
            failed.append(result.error or "unknown")
        if on_done is not None:
            on_done()
    rollout_s = time.perf_counter() - start
    idle = sum(meter.close_window() for meter in meters)
    tail_start = time.perf_counter()
    await asyncio.gather(*grading)
    return Collected.of(
        problems,
        trajectories,
        failed,
        rollout_s=rollout_s,
        grade_tail_s=time.perf_counter() - tail_start,
        engine_idle_s=idle,
    )


async def grade_trajectory(verifier: Verifier, problem: Problem, traj: Trajectory) -> None:
    """Set `traj.reward`: 1.0 when its answer block matches the problem's answer, else 0.0."""
    text = answer_text(traj.final_answer)
    if not text:
        traj.reward = 0.0
        return
    (grade,) = await verifier.grade_many([(text, problem.answer)])
    traj.reward = 1.0 if grade.correct else 0.0


def rollout_config_for(
    base: RolloutConfig, *, seed: int, step: int, **budget: Any
) -> RolloutConfig:
    """The base rollout config with this step's seed and the stage's budget."""
    return base.model_copy(update={"seed": derive_seed(seed, "rl", step), **budget})

"""Collect graded trajectories from a trajectory source; grading overlaps generation.

A `TrajectorySource` turns problems and a `RolloutSampling` into finished trajectories, in the
order they finish. Two implement it, with one signature:

- `rstar2_rollout.RolloutWorker` in this process: the rollout package's scheduler places each
  trajectory on the local (or Ray) engines, the agent loop runs it (`build.open_parts`);
- `remote.RemoteWorkers`: `rstar2-rollout serve` workers on other machines, fed problem by problem
  as they have room (`remote:` section).

`collect` sends every setting of the step's `RolloutConfig` (`RolloutSampling.of`), grades each
trajectory as soon as it arrives (`Scorer`, off the generation path as in the paper), and returns
them in batch order with the phase times. A trajectory that ended in "error" (its engine died,
the sandbox failed) is a failed job: it is neither graded nor trained on, since the failure was
the system's, not the model's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rstar2_curriculum import Problem
from rstar2_rollout import Problem as RolloutProblem
from rstar2_rollout import RolloutConfig, RolloutSampling, WorkerResult
from rstar2_rollout.loop import derive_seed
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.meter import EngineMeter
from rstar2_trainer.verifier import Scorer


class TrajectorySource(Protocol):
    """Where trajectories come from: `n` per problem, yielded as each finishes."""

    def generate(
        self, problems: Sequence[RolloutProblem], sampling: RolloutSampling
    ) -> AsyncIterator[WorkerResult]: ...


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
    source: TrajectorySource,
    scorer: Scorer,
    problems: Sequence[Problem],
    n: int,
    config: RolloutConfig,
    *,
    meters: Sequence[EngineMeter] = (),
    on_done: Callable[[], None] | None = None,
) -> Collected:
    """Roll out `n` trajectories per problem from `source` and grade each as it finishes."""
    if not problems:  # e.g. a hard subset that came out empty
        return Collected(problems=[], trajectories=[])
    by_id = {p.id: p for p in problems}
    asked = [RolloutProblem(p.id, p.question) for p in problems]
    trajectories: list[Trajectory] = []
    failed: list[str] = []
    grading: list[asyncio.Task[Any]] = []
    for meter in meters:
        meter.open()
    start = time.perf_counter()
    try:
        async for result in source.generate(asked, RolloutSampling.of(config, n)):
            traj = result.trajectory
            if traj.finish_reason == "error":  # the engine or the sandbox failed, not the model
                failed.append(f"{result.engine}: {traj.error}".lstrip(": "))
            else:
                trajectories.append(traj)
                grading.append(asyncio.create_task(scorer.score(by_id[traj.group_id], traj)))
            if on_done is not None:
                on_done()
    finally:
        rollout_s = time.perf_counter() - start
        idle = sum(meter.close_window() for meter in meters)
        tail_start = time.perf_counter()
        await asyncio.gather(*grading, return_exceptions=True)
    for task in grading:
        task.result()  # a grading error surfaces here
    return Collected.of(
        problems,
        trajectories,
        failed,
        rollout_s=rollout_s,
        grade_tail_s=time.perf_counter() - tail_start,
        engine_idle_s=idle,
    )


def rollout_config_for(
    base: RolloutConfig, *, seed: int, step: int, **budget: Any
) -> RolloutConfig:
    """The base rollout config with this step's seed and the stage's budget."""
    return base.model_copy(update={"seed": derive_seed(seed, "rl", step), **budget})

"""Sample, then grade: the one path from problems to scored trajectories, for every caller.

rstar2-train's RL steps, its evaluations and hard-subset pass, `rstar2-eval` and the
curriculum's label check all call `collect`; an accuracy one of them reports is the accuracy the
others would, because it is the same function.

- A `TrajectorySource` turns problems and a `RolloutSampling` into finished trajectories in the
  order they finish: `RolloutService` in this process, or anything with its `generate` (the
  trainer's remote workers). Chosen (problem, sample index) pairs, e.g. a resumed evaluation's
  missing ones, need a source that also has `generate_samples` (`SampleSource`).
- The `Grader` is passed in (rstar2-verify's `Scorer` is the one used): `score(problem, traj)`
  sets `traj.reward` and returns the grade, off the generation path, as each trajectory
  arrives. Problems are anything with `id` and `question` (`ProblemLike`); the grader reads what
  else it needs (the answer) from the same object.
- A trajectory that ended in "error" (its engine died, the sandbox failed) is a failed job: it
  is neither graded nor returned, since the failure was the system's, not the model's; after
  `max_failures` of them the rest are cancelled.

`collect` returns the graded trajectories in batch order (problem, then sample) with the wall
times of the phases. Not covered: building the source, the engines or the grader.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from rstar2_rollout.config import RolloutConfig
from rstar2_rollout.loop import ProblemLike, RolloutTask
from rstar2_rollout.service import RolloutResult, RolloutSampling
from rstar2_rollout.trajectory import Trajectory

__all__ = [
    "Collected",
    "Grader",
    "Meter",
    "SampleSource",
    "TrajectorySource",
    "collect",
]

P = TypeVar("P", bound=ProblemLike)
P_contra = TypeVar("P_contra", bound=ProblemLike, contravariant=True)


class TrajectorySource(Protocol):
    """Where trajectories come from: `sampling.n` per problem, yielded as each finishes."""

    def generate(
        self, problems: Sequence[RolloutTask], sampling: RolloutSampling
    ) -> AsyncIterator[RolloutResult]: ...


@runtime_checkable
class SampleSource(Protocol):
    """A source that can also roll out chosen (problem, sample index) pairs."""

    def generate(
        self, problems: Sequence[RolloutTask], sampling: RolloutSampling
    ) -> AsyncIterator[RolloutResult]: ...

    def generate_samples(
        self, samples: Sequence[tuple[RolloutTask, int]], sampling: RolloutSampling
    ) -> AsyncIterator[RolloutResult]: ...


class Grader(Protocol[P_contra]):
    """Scores a finished trajectory of `problem`: sets `trajectory.reward`, returns the grade."""

    async def score(self, problem: P_contra, trajectory: Trajectory) -> Any: ...


class Meter(Protocol):
    """An engine that measures its idle time over a window (the trainer's `EngineMeter`)."""

    def open(self) -> None: ...

    def close_window(self) -> float: ...


@dataclass
class Collected(Generic[P]):
    """Graded trajectories of one batch, with the wall times of the phases."""

    problems: list[P]
    trajectories: list[Trajectory]  # grouped by problem, in sample order
    failed_jobs: list[str] = field(default_factory=list)  # 'id#index: engine: why' per failed job
    rollout_s: float = 0.0  # first job submitted -> last trajectory back
    grade_tail_s: float = 0.0  # grading left after the last trajectory came back
    engine_idle_s: float = 0.0  # summed over engines, while the rollout was open
    tool_s: float = 0.0  # summed time trajectories waited on the sandbox
    generate_s: float = 0.0  # summed time trajectories waited on the engine

    @classmethod
    def of(
        cls,
        problems: Sequence[P],
        trajectories: Iterable[Trajectory],
        failed_jobs: list[str],
        *,
        rollout_s: float,
        grade_tail_s: float,
        engine_idle_s: float,
    ) -> Collected[P]:
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
    grader: Grader[P],
    problems: Sequence[P],
    n: int,
    config: RolloutConfig,
    *,
    samples: Sequence[tuple[P, int]] | None = None,
    meters: Sequence[Meter] = (),
    on_done: Callable[[], None] | None = None,
    on_graded: Callable[[P, Trajectory, Any], None] | None = None,
    max_failures: int | None = None,
) -> Collected[P]:
    """Roll out `n` trajectories per problem (or exactly `samples`) and grade each as it ends.

    `on_done` is called once per finished job, `on_graded(problem, trajectory, grade)` once per
    graded trajectory; a grading error is raised once every grading task has ended.
    """
    chosen = samples is not None
    if samples is None:
        samples = [(p, i) for p in problems for i in range(n)]
        problems = list(problems)
    else:
        problems = list({p.id: p for p, _ in samples}.values())
    if not samples:  # e.g. a hard subset that came out empty, a finished evaluation
        return Collected(problems=list(problems), trajectories=[])
    by_id = {p.id: p for p in problems}
    sampling = RolloutSampling.of(config, n)
    asked = {p.id: RolloutTask(p.id, p.question) for p in problems}
    if not chosen:
        stream = source.generate(list(asked.values()), sampling)
    elif isinstance(source, SampleSource):
        stream = source.generate_samples([(asked[p.id], i) for p, i in samples], sampling)
    else:
        raise TypeError(f"{type(source).__name__} cannot roll out chosen samples")
    trajectories: list[Trajectory] = []
    failed: list[str] = []
    grading: list[asyncio.Task[None]] = []

    async def grade(problem: P, traj: Trajectory) -> None:
        outcome = await grader.score(problem, traj)
        if on_graded is not None:
            on_graded(problem, traj, outcome)

    for meter in meters:
        meter.open()
    start = time.perf_counter()
    try:
        async for result in stream:
            traj = result.trajectory
            if traj.finish_reason == "error":  # the engine or the sandbox failed, not the model
                why = f"{result.engine}: {traj.error}".lstrip(": ")
                failed.append(f"{traj.group_id}#{traj.sample_index}: {why}")
                if max_failures is not None and len(failed) >= max_failures:
                    break
            else:
                trajectories.append(traj)
                grading.append(asyncio.create_task(grade(by_id[traj.group_id], traj)))
            if on_done is not None:
                on_done()
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
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

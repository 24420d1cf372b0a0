"""Sample, then grade, waiting for everything: the path of every caller that is not an
asynchronous training step.

rstar2-train's synchronous RL steps, its evaluations and hard-subset pass, `rstar2-eval` and
the curriculum's label check all call `collect`; an accuracy one of them reports is the accuracy
the others would, because it is the same function. It is one submission on `GradedGroups`
(groups.py, the core `RolloutPool` runs on too), waited for whole:

- A `TrajectorySource` turns problems and a `RolloutSampling` into finished trajectories in the
  order they finish: `RolloutService` in this process, or anything with its `generate` (the
  trainer's remote services). Chosen (problem, sample index) pairs, e.g. a resumed evaluation's
  missing ones, need a source that also has `generate_samples` (`SampleSource`).
- The `Scorer` is passed in (rstar2-verify's `Scorer` is the one used): `score(problem, traj)`
  sets `traj.reward` and returns the grade, off the generation path, as each trajectory
  arrives. Problems are anything with `id` and `question` (`ProblemLike`); the scorer reads what
  else it needs (the answer) from the same object.
- A trajectory that ended in "error" (its engine died, the sandbox failed) is a failed job: it
  is neither graded nor returned, since the failure was the system's, not the model's; after
  `max_failures` of them the rest are cancelled.

`collect` returns a `Collected`: the graded trajectories in batch order (problem, then sample)
with the wall times of the phases; `RolloutPool.next_batch` returns the same shape, so a step's
metrics (`Collected.step_metrics`) have one shape whatever the mode. Not covered: building the
source, the engines or the scorer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from rstar2_rollout.config import RolloutConfig
from rstar2_rollout.groups import (
    GradedGroups,
    SampleSource,
    Scorer,
    TrajectorySource,
)
from rstar2_rollout.loop import ProblemLike
from rstar2_rollout.trajectory import Trajectory

__all__ = [
    "Collected",
    "Meter",
    "SampleSource",
    "Scorer",
    "TrajectorySource",
    "collect",
]

P = TypeVar("P", bound=ProblemLike)


class Meter(Protocol):
    """An engine that measures its idle time over a window (the trainer's `EngineMeter`)."""

    def open(self) -> None: ...

    def close_window(self) -> float: ...


@dataclass
class Collected(Generic[P]):
    """Graded trajectories of one step (or evaluation), with the wall times of the phases: what
    `collect` and `RolloutPool.next_batch` both return."""

    problems: list[P]  # asked (`collect`) or taken (`next_batch`), in that order
    trajectories: list[Trajectory]  # grouped by problem (that order), in sample order
    failed_jobs: list[str] = field(default_factory=list)  # 'id#index: engine: why' per failed job
    failed_groups: int = 0  # groups none of whose jobs could be graded
    carried: int = 0  # groups left running or waiting in a pool (0 for `collect`)
    rollout_s: float = 0.0  # waiting for trajectories: first submitted (or the call) -> last back
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
        **times: Any,
    ) -> Collected[P]:
        """Trajectories put back in batch order (problem, then sample) and their summed times."""
        order = {p.id: i for i, p in enumerate(problems)}
        ordered = sorted(trajectories, key=lambda t: (order[t.group_id], t.sample_index))
        return cls(
            problems=list(problems),
            trajectories=ordered,
            failed_jobs=failed_jobs,
            tool_s=sum(t.timings.tool_s for t in ordered),
            generate_s=sum(t.timings.generate_s for t in ordered),
            **times,
        )

    @property
    def groups(self) -> list[P]:
        """The problems with at least one graded trajectory (the groups a step trains)."""
        graded = {t.group_id for t in self.trajectories}
        return [p for p in self.problems if p.id in graded]

    def step_metrics(self) -> dict[str, Any]:
        """The rollout part of a training step's record, one shape for every way of stepping."""
        return {
            "groups": [p.id for p in self.groups],
            "groups_trained": len(self.groups),
            "groups_carried": self.carried,
            "groups_failed": self.failed_groups,
            "failed_jobs": len(self.failed_jobs),
            "time_rollout_s": self.rollout_s,
            "time_grade_tail_s": self.grade_tail_s,
            "time_tool_s": self.tool_s,
            "time_generate_s": self.generate_s,
            "engine_idle_s": self.engine_idle_s,
        }


async def collect(
    source: TrajectorySource,
    scorer: Scorer[P],
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
    """Roll out `n` trajectories per problem (or exactly `samples`) and grade each as it ends:
    one submission on `GradedGroups`, waited for whole.

    `on_done` is called once per finished job, `on_graded(problem, trajectory, grade)` once per
    graded trajectory; a grading (or source) error is raised once every grading task has ended.
    """
    if samples is not None:
        problems = list({p.id: p for p, _ in samples}.values())
    if (samples is not None and not samples) or not problems:  # e.g. an empty hard subset
        return Collected(problems=list(problems), trajectories=[])
    core: GradedGroups[P] = GradedGroups(source, scorer)
    for meter in meters:
        meter.open()
    try:
        sub = core.submit(
            problems,
            n,
            config,
            samples=samples,
            max_failures=max_failures,
            on_done=on_done,
            on_graded=on_graded,
        )
        try:
            await sub.streamed.wait()
        except BaseException:  # cancelled: close the stream, so the source stops its jobs
            await core.close()
            raise
    finally:
        idle = sum(meter.close_window() for meter in meters)
    rollout_s = (sub.streamed_at or sub.started_at) - sub.started_at
    tail_start = time.perf_counter()
    await core.settled(sub)
    for group in sub.groups.values():
        if group.error is not None:
            raise group.error
    return Collected.of(
        problems,
        sub.trajectories,
        sub.failed_jobs,
        failed_groups=sum(1 for g in sub.groups.values() if g.failed and not g.trajectories),
        rollout_s=rollout_s,
        grade_tail_s=time.perf_counter() - tail_start,
        engine_idle_s=idle,
    )

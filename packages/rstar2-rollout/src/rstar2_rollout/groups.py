"""Submit trajectories, grade each as it finishes, hand back whole groups: the one core of
`collect` and `RolloutPool`.

A **submission** is one call of `GradedGroups.submit`: `n` samples of each problem (or chosen
(problem, sample index) pairs) with one `RolloutConfig`, rolled out as one `generate` stream on
the `TrajectorySource`. A **group** is one problem's samples of one submission; it is finished
when every one of its jobs has ended, graded or failed. The core

- starts the stream at once and reads it on a task of its own: each trajectory is handed to the
  `Scorer` as it arrives (off the generation path), so grading overlaps generation;
- counts a trajectory that ended in "error" (its engine died, the sandbox failed: the system's
  failure, not the model's) as a failed job, `'id#index: engine: why'`, neither graded nor
  returned; after a submission's `max_failures` such jobs its stream is closed, which cancels
  the rest of it;
- ends every group of a submission whose source raised with that error (raised by whoever takes
  the group), and counts the jobs a stream never returned as failed;
- closes every stream it opened, however the submission ends (`cancel`, `close`).

What to take, when, and in which order is the caller's: `collect` submits once and waits for
everything; `RolloutPool` keeps submissions in flight across training steps. `ready` lists the
groups that finished and were not taken yet, in finish order, `finished` counts every group that
finished; `changed()` waits until one more finishes (or a stream ends).

A gate (an `asyncio.Event`, open when set) holds the next turns of this core's trajectories
while closed, where the source can (`GatedSource`: `RolloutService` waits on it before each
engine call of a job; turns already on an engine and tool calls already running finish):
what `RolloutPool.paused` uses around checkpoints and stage switches. A source without it keeps
generating; nothing is discarded either way.

Not covered: building the source, the engines or the scorer; which problems to draw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from rstar2_rollout.config import RolloutConfig
from rstar2_rollout.loop import ProblemLike, RolloutTask
from rstar2_rollout.service import RolloutResult, RolloutSampling
from rstar2_rollout.trajectory import Trajectory

__all__ = [
    "GatedSource",
    "GradedGroups",
    "Group",
    "SampleSource",
    "Scorer",
    "Submission",
    "TrajectorySource",
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


@runtime_checkable
class GatedSource(Protocol):
    """A source whose jobs wait on `gate` (set: open) before each engine call."""

    def generate_gated(
        self,
        samples: Sequence[tuple[RolloutTask, int]],
        sampling: RolloutSampling,
        gate: asyncio.Event,
    ) -> AsyncIterator[RolloutResult]: ...


class Scorer(Protocol[P_contra]):
    """Scores a finished trajectory of `problem`: sets `trajectory.reward`, returns the grade
    (rstar2-verify's `Scorer` is one; rollout does not import verify)."""

    async def score(self, problem: P_contra, trajectory: Trajectory) -> Any: ...


@dataclass(eq=False)
class Group(Generic[P]):
    """One problem's samples of one submission, filling up as its jobs end."""

    problem: P
    submission: int  # the submission's number, in submission order
    size: int  # jobs asked
    trajectories: list[Trajectory] = field(default_factory=list)  # graded, as they ended
    failed: list[str] = field(default_factory=list)  # 'id#index: engine: why'
    arrived: int = 0  # jobs the source returned
    ended: int = 0  # jobs ended: graded, failed, or never returned
    error: BaseException | None = None  # a grading or source error, for whoever takes the group
    listed: bool = False  # put on `GradedGroups.ready` (once)

    @property
    def done(self) -> bool:
        return self.ended >= self.size

    def ordered(self) -> list[Trajectory]:
        """The graded trajectories in sample order."""
        return sorted(self.trajectories, key=lambda t: t.sample_index)


@dataclass(eq=False)
class Submission(Generic[P]):
    """One `submit`: its groups, and when its stream started and ended."""

    number: int
    problems: list[P]
    n: int
    config: RolloutConfig
    groups: dict[str, Group[P]]
    started_at: float
    streamed: asyncio.Event = field(default_factory=asyncio.Event)  # the stream ended
    streamed_at: float | None = None
    failures: int = 0

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups.values() for t in g.trajectories]

    @property
    def failed_jobs(self) -> list[str]:
        return [f for g in self.groups.values() for f in g.failed]


class GradedGroups(Generic[P]):
    """Submissions in flight on one source, graded as they arrive (see the module docstring)."""

    def __init__(
        self, source: TrajectorySource, scorer: Scorer[P], *, gate: asyncio.Event | None = None
    ) -> None:
        self.source = source
        self.scorer = scorer
        self.gate = gate
        self.submissions: dict[int, Submission[P]] = {}  # not yet ended or not yet taken
        self.ready: list[Group[P]] = []  # finished, not taken, in finish order
        self.finished = 0  # groups that finished since the core started
        self._count = 0
        self._changed = asyncio.Event()
        self._feeds: dict[int, asyncio.Task[None]] = {}
        self._grading: dict[int, set[asyncio.Task[None]]] = {}

    def submit(
        self,
        problems: Sequence[P],
        n: int,
        config: RolloutConfig,
        *,
        samples: Sequence[tuple[P, int]] | None = None,
        max_failures: int | None = None,
        on_done: Callable[[], None] | None = None,
        on_graded: Callable[[P, Trajectory, Any], None] | None = None,
    ) -> Submission[P]:
        """Start `n` samples of each problem (or exactly `samples`) and return at once.

        `on_done` is called once per job that comes back (failed or not), `on_graded(problem,
        trajectory, grade)` once per graded trajectory."""
        chosen = samples is not None
        if samples is None:
            samples = [(p, i) for p in problems for i in range(n)]
        else:
            problems = list({p.id: p for p, _ in samples}.values())
        sizes: dict[str, int] = {}
        for p, _ in samples:
            sizes[p.id] = sizes.get(p.id, 0) + 1
        if len({p.id for p in problems}) != len(problems):
            raise ValueError("a submission names one problem twice")
        self._count += 1
        number = self._count
        sub = Submission(
            number,
            list(problems),
            n,
            config,
            {p.id: Group(p, number, sizes.get(p.id, 0)) for p in problems},
            time.perf_counter(),
        )
        self.submissions[number] = sub
        self._grading[number] = set()
        if not samples:
            sub.streamed_at = sub.started_at
            sub.streamed.set()
            return sub
        stream = self._stream(sub, samples, chosen)
        feed = asyncio.create_task(self._feed(sub, stream, max_failures, on_done, on_graded))
        self._feeds[number] = feed
        feed.add_done_callback(lambda _t, k=number: self._feeds.pop(k, None))
        return sub

    def _stream(
        self, sub: Submission[P], samples: Sequence[tuple[P, int]], chosen: bool
    ) -> AsyncIterator[RolloutResult]:
        sampling = RolloutSampling.of(sub.config, sub.n)
        asked = {p.id: RolloutTask(p.id, p.question) for p in sub.problems}
        pairs = [(asked[p.id], i) for p, i in samples]
        if self.gate is not None and isinstance(self.source, GatedSource):
            return self.source.generate_gated(pairs, sampling, self.gate)
        if not chosen:
            return self.source.generate(list(asked.values()), sampling)
        if isinstance(self.source, SampleSource):
            return self.source.generate_samples(pairs, sampling)
        raise TypeError(f"{type(self.source).__name__} cannot roll out chosen samples")

    async def _feed(
        self,
        sub: Submission[P],
        stream: AsyncIterator[RolloutResult],
        max_failures: int | None,
        on_done: Callable[[], None] | None,
        on_graded: Callable[[P, Trajectory, Any], None] | None,
    ) -> None:
        cut = False
        try:
            async for result in stream:
                traj = result.trajectory
                group = sub.groups.get(traj.group_id)
                if group is None:  # a trajectory of a problem not asked: ignored
                    continue
                group.arrived += 1
                if traj.finish_reason == "error":  # the engine or the sandbox failed
                    why = f"{result.engine}: {traj.error}".lstrip(": ")
                    group.failed.append(f"{traj.group_id}#{traj.sample_index}: {why}")
                    sub.failures += 1
                    self._ended(group)
                else:
                    task = asyncio.create_task(self._grade(group, traj, on_graded))
                    grading = self._grading[sub.number]
                    grading.add(task)
                    task.add_done_callback(grading.discard)
                if on_done is not None:
                    on_done()
                if max_failures is not None and sub.failures >= max_failures:
                    cut = True
                    break
        except Exception as exc:  # the source failed: every unfinished group ends with it
            for group in sub.groups.values():
                if not group.done:
                    group.error = group.error or exc
                    group.arrived = group.ended = group.size
                    self._finish(group)
        else:
            for group in sub.groups.values():  # what the stream never returned
                missing = group.size - group.arrived
                if missing > 0:
                    if not cut:
                        why = f"the source returned {group.arrived} of {group.size}"
                        group.failed.append(f"{group.problem.id}: {why}")
                    group.arrived = group.size
                    group.ended += missing - 1
                    self._ended(group)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
            sub.streamed_at = time.perf_counter()
            sub.streamed.set()
            self._changed.set()

    async def _grade(
        self,
        group: Group[P],
        traj: Trajectory,
        on_graded: Callable[[P, Trajectory, Any], None] | None,
    ) -> None:
        try:
            outcome = await self.scorer.score(group.problem, traj)
            group.trajectories.append(traj)
            if on_graded is not None:
                on_graded(group.problem, traj, outcome)
        except Exception as exc:
            group.error = group.error or exc
        self._ended(group)

    def _ended(self, group: Group[P]) -> None:
        group.ended += 1
        if group.done:
            self._finish(group)

    def _finish(self, group: Group[P]) -> None:
        if not group.listed:
            group.listed = True
            self.finished += 1
            self.ready.append(group)
            self._changed.set()

    async def changed(self) -> None:
        """Wait until a group finishes or a stream ends (returns at once if one did since the
        last call)."""
        await self._changed.wait()
        self._changed.clear()

    def take(self, group: Group[P]) -> Group[P]:
        """Remove a finished group from the core (the caller keeps it)."""
        self.ready.remove(group)
        sub = self.submissions[group.submission]
        del sub.groups[group.problem.id]
        if not sub.groups:
            del self.submissions[sub.number]
            self._grading.pop(sub.number, None)
        return group

    def running(self) -> list[Group[P]]:
        """Groups with a job not ended yet, oldest submission first."""
        return [g for s in self.submissions.values() for g in s.groups.values() if not g.done]

    async def settled(self, sub: Submission[P]) -> None:
        """Wait until `sub`'s stream ended and its every grading task ended."""
        await sub.streamed.wait()
        await asyncio.gather(*list(self._grading.get(sub.number, ())), return_exceptions=True)

    async def cancel(self, number: int) -> int:
        """Close a submission's stream (its running jobs are cancelled), drop its groups; how
        many groups were not taken."""
        sub = self.submissions.pop(number, None)
        feed = self._feeds.get(number)
        if feed is not None:
            feed.cancel()
            await asyncio.gather(feed, return_exceptions=True)
        grading = self._grading.pop(number, set())
        for task in grading:
            task.cancel()
        await asyncio.gather(*grading, return_exceptions=True)
        if sub is None:
            return 0
        self.ready = [g for g in self.ready if g.submission != number]
        return len(sub.groups)

    async def close(self) -> int:
        """Cancel every submission; how many groups were not taken."""
        gone = 0
        for number in list(self.submissions):
            gone += await self.cancel(number)
        return gone

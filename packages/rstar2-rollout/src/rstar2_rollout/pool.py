"""Asynchronous steps: groups in flight across training steps, each trained whole, none discarded.

`RolloutPool` runs on the same core as `collect` (`GradedGroups`, groups.py): a submission is
one `generate` stream whose trajectories are graded as they arrive, and a group (the `n` samples
of one problem in one submission) enters a batch only whole. What the pool adds is when a
submission starts and which groups a step takes, so that a run trains on what it drew:

- **Throttled at submission.** At most `(max_staleness + 1) x groups_per_step` groups are
  started and not yet taken (AReaL's capacity rule). `submit` queues a submission; it starts
  (whole, one stream) as soon as it fits and the pool is not paused. `room` says how many more
  groups would fit: a caller draws batches ahead while a whole one does (the first step, a
  resumed run), and one batch a step after that.
- **Due groups first.** Each `next_batch` call is one step. A group started `max_staleness` or
  more steps before the call is due: the call takes every due group (oldest submission first,
  waiting for each to finish), so no group waits more than `max_staleness` steps between its
  start and its training. With the capacity rule the due groups fit in one batch while the
  caller pushes one weights version a step; when they do not, the oldest are taken and the rest
  stay due. The batch is then filled with finished groups, oldest submission first (Tinker's
  cookbook), waiting for the next to finish when none is.
- **Nothing discarded.** No group is dropped for its staleness: its tokens carry the weights
  version they were sampled with (`Generation.weights_version`) and the trainer corrects for it
  (off-policy correction). A running trajectory goes on over a weight push; the engine finishes
  its running turn on the old weights first (`at_push: wait`) or aborts it and the loop resumes
  it on the new ones (`at_push: abort`). Only a group all of whose jobs failed is not returned
  (`failed_groups`).
- **Paused, not drained.** `paused()` holds what has not started (queued submissions) and, on a
  source that takes a gate (`RolloutService` whose scheduler starts every job at once, the
  default least_requests), the next turn of every running trajectory; turns and tool calls
  already running finish. Checkpoints and stage switches (evaluations, the hard-subset pass) run
  inside it; the groups go on afterwards. Elsewhere running trajectories go on generating.
- `order="submission"` (one-step-off steps): `next_batch` returns the oldest submission's groups,
  waiting for each, and stops where that submission ends, while later submissions run.

One group per problem per batch: when a problem was submitted again while its earlier group
still ran, the second waits for a later batch. A grading or source error is raised by the
`next_batch` that would have returned its group. `pending()` lists what was drawn and not
taken, per submission (a checkpoint records it; a resumed run submits it again, since nothing
in flight survives a restart). `close()` cancels everything (the end of a run). Not covered:
weights (the caller pushes them), which problems to draw (the caller's curriculum).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from rstar2_rollout.collect import Collected, Meter
from rstar2_rollout.config import RolloutConfig
from rstar2_rollout.groups import GradedGroups, Group, Scorer, TrajectorySource
from rstar2_rollout.loop import ProblemLike

__all__ = ["Pending", "RolloutPool"]

P = TypeVar("P", bound=ProblemLike)


@dataclass(frozen=True)
class Pending(Generic[P]):
    """A submission's problems not taken yet, with what they were submitted with and how many
    steps ago it started (0 while queued)."""

    problems: list[P]
    n: int
    config: RolloutConfig
    age: int = 0


class RolloutPool(Generic[P]):
    """Groups in flight across steps (see the module docstring)."""

    def __init__(
        self,
        source: TrajectorySource,
        scorer: Scorer[P],
        *,
        groups_per_step: int,
        max_staleness: int = 1,
        order: Literal["finish", "submission"] = "finish",
    ) -> None:
        if groups_per_step < 1:
            raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if order not in ("finish", "submission"):
            raise ValueError(f"order must be 'finish' or 'submission', got {order!r}")
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.order = order
        self.capacity = (max_staleness + 1) * groups_per_step
        self.steps = 0  # next_batch calls made
        self._gate = asyncio.Event()
        self._gate.set()
        self._pauses = 0
        self.core: GradedGroups[P] = GradedGroups(source, scorer, gate=self._gate)
        self._queued: list[Pending[P]] = []
        self._started: dict[int, int] = {}  # submission number -> the step it started in

    @property
    def finished(self) -> int:
        """Groups that finished (every job ended) since the pool started."""
        return self.core.finished

    @property
    def in_flight(self) -> int:
        """Groups started and not taken yet (running or finished)."""
        return sum(len(s.groups) for s in self.core.submissions.values())

    @property
    def queued(self) -> int:
        """Groups submitted and not started yet."""
        return sum(len(q.problems) for q in self._queued)

    @property
    def room(self) -> int:
        """Groups that would still fit under the capacity."""
        return self.capacity - self.in_flight - self.queued

    def submit(self, problems: Sequence[P], n: int, config: RolloutConfig, *, age: int = 0) -> None:
        """Queue `n` samples of each problem (sampled as `config` says); they start as soon as
        they fit. Returns at once. `age`: steps to count as already spent in the pool (a
        resumed run's `pending()` from its checkpoint, so what was due stays due)."""
        if problems:
            if len({p.id for p in problems}) != len(problems):
                raise ValueError("a submission names one problem twice")
            self._queued.append(Pending(list(problems), n, config, age))
            self._start_queued()

    def _start_queued(self) -> None:
        while self._queued and self._pauses == 0:
            first = self._queued[0]
            if self.in_flight and self.in_flight + len(first.problems) > self.capacity:
                return
            self._queued.pop(0)
            sub = self.core.submit(first.problems, first.n, first.config)
            self._started[sub.number] = self.steps - first.age

    def pending(self) -> list[Pending[P]]:
        """What was submitted and not taken, per submission, oldest first."""
        started = [
            Pending(
                [g.problem for g in s.groups.values()],
                s.n,
                s.config,
                self.steps - self._started[s.number],
            )
            for s in self.core.submissions.values()
            if s.groups
        ]
        return started + list(self._queued)

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold new starts and the next turns of running trajectories (see module docstring)."""
        self._pauses += 1
        self._gate.clear()
        try:
            yield
        finally:
            self._pauses -= 1
            if self._pauses == 0:
                self._gate.set()
                self._start_queued()

    async def step(
        self,
        problems: Sequence[P],
        n: int,
        config: RolloutConfig,
        *,
        ahead: Callable[[int], tuple[Sequence[P], RolloutConfig]],
        meters: Sequence[Meter] = (),
        on_group: Callable[[P], None] | None = None,
    ) -> tuple[Collected[P], list[P]]:
        """One training step's rollout, as the trainer drives it: submit the step's `problems`,
        draw batches ahead (`ahead(k)`: the k-th one's problems and config) while a whole one
        still fits (the first step, a resumed run), then take the step's groups
        (`next_batch`). Returns the batch and every problem drawn for it."""
        self.submit(problems, n, config)
        drawn = list(problems)
        k = 0
        while problems and self.room >= len(problems):
            more, more_config = ahead(k)
            if not more:
                break
            self.submit(more, n, more_config)
            drawn += more
            k += 1
        batch = await self.next_batch(len(problems) or None, meters=meters, on_group=on_group)
        return batch, drawn

    def _age(self, group: Group[P]) -> int:
        return self.steps - self._started[group.submission]

    async def next_batch(
        self,
        groups: int | None = None,
        *,
        meters: Sequence[Meter] = (),
        on_group: Callable[[P], None] | None = None,
    ) -> Collected[P]:
        """This step's groups (`groups_per_step` unless given): due groups first, then the
        oldest finished; with `order="submission"`, the oldest submission's groups. Fewer only
        when nothing is left that could finish."""
        want = self.groups_per_step if groups is None else groups
        for meter in meters:
            meter.open()
        start = time.perf_counter()
        taken: list[Group[P]] = []
        failed_jobs: list[str] = []
        failed_groups = 0
        self._start_queued()
        whole = self._oldest() if self.order == "submission" else None
        try:
            while len(taken) < want:
                self._start_queued()
                group = self._pick({g.problem.id for g in taken}, whole)
                if group is _STOP:
                    break
                if not isinstance(group, Group):  # one the batch must have is still running
                    await self.core.changed()
                    continue
                self.core.take(group)
                if group.error is not None:
                    raise group.error
                failed_jobs += group.failed
                if not group.trajectories:
                    failed_groups += 1
                    continue
                taken.append(group)
                if on_group is not None:
                    on_group(group.problem)
        finally:
            idle = sum(meter.close_window() for meter in meters)
        self.steps += 1
        self._start_queued()
        trajectories = [t for g in taken for t in g.ordered()]
        batch = Collected.of(
            [g.problem for g in taken],
            trajectories,
            failed_jobs,
            failed_groups=failed_groups,
            carried=self.in_flight + self.queued,
            rollout_s=time.perf_counter() - start,
            engine_idle_s=idle,
        )
        return batch

    def _oldest(self) -> int | None:
        numbers = [s.number for s in self.core.submissions.values() if s.groups]
        return min(numbers, default=None)

    def _pick(self, taken: set[str], whole: int | None) -> Group[P] | object:
        """The next group to take (finished), `_WAIT` while the batch needs one still running,
        `_STOP` when nothing more can join the batch."""
        running = [g for g in self.core.running() if g.problem.id not in taken]
        ready = [g for g in self.core.ready if g.problem.id not in taken]
        if whole is not None or self.order == "submission":  # the oldest submission, whole
            if whole is None:
                return _STOP
            mine = [g for g in ready if g.submission == whole]
            if mine:
                return mine[0]
            return _WAIT if any(g.submission == whole for g in running) else _STOP
        due = [g for g in ready + running if self._age(g) >= self.max_staleness]
        if due:
            oldest = min(g.submission for g in due)
            first = [g for g in ready if g.submission == oldest and g in due]
            return first[0] if first else _WAIT
        if ready:
            return min(ready, key=lambda g: g.submission)
        return _WAIT if running else _STOP

    async def close(self) -> int:
        """Cancel everything (the end of a run); how many groups were not taken."""
        gone = self.queued + await self.core.close()
        self._queued.clear()
        return gone


_WAIT = object()  # `_pick`: the batch needs a group still running
_STOP = object()  # `_pick`: nothing more can join this batch

"""Partial rollouts: whole groups as they finish, the rest kept in flight across calls.

`RolloutPool` is `collect` for a step that does not wait for its slowest trajectory (issue #30,
item 3). `submit(problems, n, config)` starts `n` samples of each problem on the source (one
`generate` stream per submission, graded as each trajectory arrives, as `collect` does) and
returns at once; `next_batch(groups, version)` returns the first `groups` groups to finish
(a group, the `n` samples of one problem, is the unit: it enters a batch only whole) and leaves
every other group running on the engines, to finish during a later call.

`order="submission"` (one-step-off steps): `next_batch` returns the groups of the oldest
submission still in the pool, waiting for each of them, and stops where that submission ends;
later submissions keep running meanwhile. A caller that submits the next step's batch before it
trains then trains every batch whole, one step after it was submitted.

- Versions: nothing here sets them. A trajectory still running when the caller pushes new
  weights goes on; the engine tags the tokens with the weights they ran on
  (`Generation.weights_version`), so a carried trajectory's later tokens carry the new version.
  At a push a vLLM engine either finishes its running turns on the old weights first
  (`at_push: wait`, the push waits for them) or aborts them, and the loop resumes each on the
  new weights from where it stopped (`at_push: abort`: one turn then spans two versions).
- Staleness: a finished group whose oldest token is more than `max_staleness` versions behind
  `version` (the trainer's, passed to `next_batch`) is dropped, counted in `stale_dropped`, and
  `next_batch` waits for another in its place. Groups with no known version are kept.
- One group per problem per batch: when a problem was submitted again (a later step drew it
  while its earlier group still ran) and both finish, the second waits for the next batch, so a
  batch's groups never merge under one group id.
- Failed jobs (finish_reason "error": the engine or the sandbox failed) are neither graded nor
  returned, as in `collect`; a group counts as finished when each of its `n` jobs has ended,
  and one whose jobs all failed is dropped (counted in `failed_groups`).
- `drain()` cancels every running stream and discards the finished groups not yet taken (the
  count it returns): what a stage switch, an evaluation or a checkpoint needs so that the pool
  is empty at a point a resumed run restarts from. `close()` is `drain()` for the end.

`finished` counts the groups that finished since the pool started (the caller reads it around
other work, e.g. an update, to see what finished meanwhile).

`next_batch` returns fewer groups only when nothing is left running. A grading error is raised by
the `next_batch` that would have returned its group. Not covered: cancelling one group of a
submission (streams end whole), and weights (the caller pushes them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from rstar2_rollout.collect import Grader, Meter, TrajectorySource
from rstar2_rollout.config import RolloutConfig
from rstar2_rollout.loop import ProblemLike, RolloutTask
from rstar2_rollout.service import RolloutSampling
from rstar2_rollout.trajectory import Trajectory

__all__ = ["PoolBatch", "RolloutPool"]

P = TypeVar("P", bound=ProblemLike)


@dataclass
class _Group(Generic[P]):
    """One problem's `n` samples of one submission, filling up as its jobs end."""

    problem: P
    n: int
    submitted: int  # the submission's number: older groups first when both are ready
    trajectories: list[Trajectory] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    arrived: int = 0  # jobs the source returned
    ended: int = 0  # jobs ended (graded or failed)
    error: BaseException | None = None  # a grading error, raised by next_batch

    @property
    def oldest_version(self) -> int | None:
        known = [v for t in self.trajectories if (v := t.oldest_version) is not None]
        return min(known, default=None)


@dataclass
class PoolBatch(Generic[P]):
    """The groups one `next_batch` call returns, and what happened to the others meanwhile."""

    problems: list[P]  # one per group, as taken (of the finished ones, the oldest submitted)
    trajectories: list[Trajectory]  # grouped by problem (that order), in sample order
    failed_jobs: list[str] = field(default_factory=list)  # 'id#index: engine: why'
    stale_dropped: int = 0  # groups dropped for staleness during this call
    failed_groups: int = 0  # groups whose every job failed, during this call
    carried: int = 0  # groups left in the pool (running or finished, not taken)
    wait_s: float = 0.0  # the call's wall time: waiting for the groups to finish
    engine_idle_s: float = 0.0  # summed over the meters, over the call
    tool_s: float = 0.0  # summed over the returned trajectories
    generate_s: float = 0.0


class RolloutPool(Generic[P]):
    """Groups of trajectories in flight across steps (see module docstring)."""

    def __init__(
        self,
        source: TrajectorySource,
        grader: Grader[P],
        *,
        max_staleness: int = 0,
        order: Literal["finish", "submission"] = "finish",
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if order not in ("finish", "submission"):
            raise ValueError(f"order must be 'finish' or 'submission', got {order!r}")
        self.order = order
        self.source = source
        self.grader = grader
        self.max_staleness = max_staleness
        self._submissions = 0
        self.finished = 0  # groups that finished (every job ended), since the pool started
        self._running: dict[tuple[int, str], _Group[P]] = {}  # (submission, problem id)
        self._ready: list[_Group[P]] = []  # finished, not taken, in finish order
        self._changed = asyncio.Event()
        self._feeds: set[asyncio.Task[None]] = set()
        self._grading: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        """Groups with a job still running."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Finished groups not taken yet."""
        return len(self._ready)

    def submit(self, problems: Sequence[P], n: int, config: RolloutConfig) -> None:
        """Start `n` samples of each problem (sampled as `config` says); returns at once."""
        if not problems:
            return
        self._submissions += 1
        number = self._submissions
        groups = {p.id: _Group(p, n, number) for p in problems}
        if len(groups) != len(problems):
            raise ValueError("a submission names one problem twice")
        for pid, group in groups.items():
            self._running[(number, pid)] = group
        tasks = [RolloutTask(p.id, p.question) for p in problems]
        stream = self.source.generate(tasks, RolloutSampling.of(config, n))
        feed = asyncio.create_task(self._feed(number, stream))
        self._feeds.add(feed)
        feed.add_done_callback(self._feeds.discard)

    async def _feed(self, number: int, stream: Any) -> None:
        try:
            async for result in stream:
                traj = result.trajectory
                group = self._running.get((number, traj.group_id))
                if group is None:  # drained meanwhile
                    continue
                group.arrived += 1
                if traj.finish_reason == "error":
                    why = f"{result.engine}: {traj.error}".lstrip(": ")
                    group.failed.append(f"{traj.group_id}#{traj.sample_index}: {why}")
                    self._ended(number, group)
                else:
                    task = asyncio.create_task(self._grade(number, group, traj))
                    self._grading.add(task)
                    task.add_done_callback(self._grading.discard)
        except Exception as exc:  # the source failed: every group of it ends with the reason
            for (num, _pid), group in list(self._running.items()):
                if num == number:
                    group.error = group.error or exc
                    group.ended = group.n
                    self._finish(num, group)
        else:  # a stream that ended short: the missing jobs failed
            for (num, pid), group in list(self._running.items()):
                if num == number and group.arrived < group.n:
                    missing = group.n - group.arrived
                    group.failed.append(f"{pid}: the source returned {group.arrived} of {group.n}")
                    group.arrived = group.n
                    group.ended += missing - 1
                    self._ended(num, group)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _grade(self, number: int, group: _Group[P], traj: Trajectory) -> None:
        try:
            await self.grader.score(group.problem, traj)
            group.trajectories.append(traj)
        except Exception as exc:
            group.error = group.error or exc
        self._ended(number, group)

    def _ended(self, number: int, group: _Group[P]) -> None:
        group.ended += 1
        if group.ended >= group.n:
            self._finish(number, group)

    def _finish(self, number: int, group: _Group[P]) -> None:
        if self._running.pop((number, group.problem.id), None) is not None:
            self.finished += 1
            self._ready.append(group)
            self._changed.set()

    async def next_batch(
        self,
        groups: int,
        version: int,
        *,
        meters: Sequence[Meter] = (),
        on_group: Callable[[P], None] | None = None,
    ) -> PoolBatch[P]:
        """The first `groups` groups to finish (fewer only when nothing is left running), none
        more than `max_staleness` versions behind `version`; the rest stay in the pool. With
        `order="submission"`, the oldest submission's groups (fewer when it has fewer left)."""
        for meter in meters:
            meter.open()
        start = time.perf_counter()
        batch: PoolBatch[P] = PoolBatch(problems=[], trajectories=[])
        taken: list[_Group[P]] = []
        whole = self._oldest_submission() if self.order == "submission" else None
        try:
            while len(taken) < groups:
                if whole is not None and not self._holds(whole):
                    break  # the submission ended: its groups taken, dropped or failed
                group = self._take({g.problem.id for g in taken}, whole)
                if group is None:
                    if not self._running:
                        break  # nothing left that could finish
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                if group.error is not None:
                    raise group.error
                batch.failed_jobs += group.failed
                oldest = group.oldest_version
                if not group.trajectories:
                    batch.failed_groups += 1
                elif oldest is not None and version - oldest > self.max_staleness:
                    batch.stale_dropped += 1
                else:
                    taken.append(group)
                    if on_group is not None:
                        on_group(group.problem)
        finally:
            batch.engine_idle_s = sum(meter.close_window() for meter in meters)
        for group in taken:
            batch.problems.append(group.problem)
            batch.trajectories += sorted(group.trajectories, key=lambda t: t.sample_index)
        batch.carried = len(self._running) + len(self._ready)
        batch.wait_s = time.perf_counter() - start
        batch.tool_s = sum(t.timings.tool_s for t in batch.trajectories)
        batch.generate_s = sum(t.timings.generate_s for t in batch.trajectories)
        return batch

    def _take(self, taken_ids: set[str], submission: int | None) -> _Group[P] | None:
        """The oldest-submitted ready group whose problem is not in the batch yet (of
        `submission` only, when given)."""
        eligible = [
            g
            for g in self._ready
            if g.problem.id not in taken_ids and submission in (None, g.submitted)
        ]
        if not eligible:
            return None
        group = min(eligible, key=lambda g: g.submitted)
        self._ready.remove(group)
        return group

    def _oldest_submission(self) -> int | None:
        numbers = [n for n, _ in self._running] + [g.submitted for g in self._ready]
        return min(numbers, default=None)

    def _holds(self, submission: int) -> bool:
        """Whether a group of `submission` is still running or waiting to be taken."""
        return any(n == submission for n, _ in self._running) or any(
            g.submitted == submission for g in self._ready
        )

    async def drain(self) -> int:
        """Cancel every running group and discard the finished ones; how many groups went."""
        gone = len(self._running) + len(self._ready)
        feeds = list(self._feeds)
        for feed in feeds:
            feed.cancel()
        await asyncio.gather(*feeds, return_exceptions=True)
        await asyncio.gather(*list(self._grading), return_exceptions=True)
        self._running.clear()
        self._ready.clear()
        return gone

    async def close(self) -> None:
        """Stop everything (the end of a run)."""
        await self.drain()

"""Admission: each scheduling policy as an object that decides which engine a job gets, whether it
may start now, and whether each of its turns may run.

(The trainer's `placement/` decides where services and engines run; this module decides nothing
about processes, only which of the running engines takes a job.) Every policy of
`SchedulerConfig.policy` becomes one `Admission` (`scheduler.make_admission`), built once when the
`Scheduler` is. The scheduler core keeps the queue, failures and the job lifecycle and
calls the same hooks whatever the policy:

- `place(entry)`: an engine for the job at the head of the queue, `"wait"` (try again when
  something ends or on the recheck timer), or None (no live engine can ever take it);
- `on_start` / `on_finish`: the job was given an engine / has left it;
- `enter_turn` / `leave_turn`: around each generation call of a running job (a turn); a policy
  may hold a turn until it fits, or refuse it with a reason;
- `before_dispatch`: admit what waits inside the policy (turns) before the queue is looked at;
- `order(queue)`: the order queued jobs are offered in (FIFO unless the policy reorders);
- `fits`, `reserved`, `recheck_interval_s`: what the scheduler reports and how often it looks.

Policies see the engines through the scheduler's `Pool` (slots, capacity probes that may find an
engine dead, dispatch and the recheck timer). This module holds the core's data, the base class
and the two policies of the main surface: `LeastRequests` (the default) and `KVAware` (the paper's
rule as written). The others (kv_progress, forecast, the peers' dispatch) are research code in
`rstar2_rollout.research`, imported only when a config names them. Not covered: moving or
preempting a running job (engines preempt by themselves).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rstar2_rollout.config import KVAwarePolicy, LeastRequestsPolicy
from rstar2_rollout.engine import Engine, Generation, KVCapacity
from rstar2_rollout.job import Job


@dataclass(eq=False)
class Slot:
    """Holds what the scheduler core knows of one engine: whether it lives, its errors, its jobs."""

    engine: Engine
    index: int
    alive: bool = True
    dead_reason: str = ""
    errors: int = 0
    running: dict[int, asyncio.Task[Any]] = field(default_factory=dict)


@dataclass(eq=False)
class Entry:
    """Holds a submitted job with its index, the future its result goes to, and its position in
    the batch it came with."""

    index: int
    job: Job[Any]
    future: asyncio.Future[Any]
    submitted_at: float
    batch: tuple[int, int] | None = None  # (position, size) in the batch it came with


class Pool(Protocol):
    """Shows a policy what it may use of the scheduler: the engines, their capacity, and two ways
    to ask for another look."""

    slots: list[Slot]

    def capacity(self, slot: Slot) -> KVCapacity | None: ...
    def total_and_free(self, slot: Slot) -> tuple[int, int | None]: ...
    def dispatch(self) -> None: ...
    def schedule_recheck(self) -> None: ...


class Admission:
    """Decides for the scheduler which engine takes each job and when; every hook here is at its
    neutral value (jobs go where `place` says, turns run at once), and subclasses override some."""

    recheck_interval_s: float | None = None

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def alive(self) -> Iterator[Slot]:
        return (s for s in self.pool.slots if s.alive)

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        raise NotImplementedError

    def order(self, queue: deque[Entry]) -> None:
        """Reorder the queue in place before jobs are offered (default: FIFO, untouched)."""

    def fits(self, reserve_tokens: int) -> bool:
        """Whether some live engine could ever run a job of this worst-case size: one whose whole
        KV cache holds it (an engine that reports no capacity is taken at its word). The engine
        admits and preempts by itself, but a job bigger than its cache never finishes."""
        for slot in self.alive():
            cap = self.pool.capacity(slot)
            if cap is None or reserve_tokens <= cap.total_tokens:
                return True
        return False

    def too_large(self, entry: Entry) -> str:
        return (
            f"job needs {entry.job.reserve_tokens} KV tokens; no live engine can hold"
            " that many in total"
        )

    def reserved(self, slot: Slot) -> int:
        """Returns the KV tokens the policy counts as promised on this engine (reported in `status`)."""
        return 0

    def on_start(self, entry: Entry, slot: Slot) -> None:
        """The job was given `slot`."""

    def on_finish(self, entry: Entry, slot: Slot) -> None:
        """The job left `slot` (finished, failed or withdrawn)."""

    async def enter_turn(
        self, slot: Slot, job: int, request_id: str, context: int, max_tokens: int
    ) -> str:
        """Return "" once the turn may run, or why it never can."""
        return ""

    def leave_turn(self, slot: Slot, job: int, request_id: str, out: Generation | None) -> None:
        """The turn ended (`out` None: it raised or was cancelled)."""

    def before_dispatch(self) -> None:
        """Admit whatever waits inside the policy, before queued jobs are placed."""

    def on_recheck(self) -> None:
        """The recheck timer fired: the engines moved on."""


class LeastRequests(Admission):
    """Sends each job to the engine running the fewest jobs, where it stays for its life (verl
    v0.5's dispatch, the default); with `max_running_per_engine`, a job waits at AReaL's cap."""

    def __init__(self, pool: Pool, policy: LeastRequestsPolicy) -> None:
        super().__init__(pool)
        self.cap = policy.max_running_per_engine

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        alive = list(self.alive())
        if not alive:
            return None
        slot = min(alive, key=lambda s: (len(s.running), s.index))
        return "wait" if self.cap is not None and len(slot.running) >= self.cap else slot


class KVAware(Admission):
    """Admits a job only to an engine whose headroom holds its prompt + max response tokens
    (rStar2-Agent's rule as written)."""

    def __init__(self, pool: Pool, policy: KVAwarePolicy) -> None:
        super().__init__(pool)
        self.policy = policy
        self.recheck_interval_s = policy.recheck_interval_s
        self._reserved: dict[int, int] = {}

    def reserved(self, slot: Slot) -> int:
        return self._reserved.get(slot.index, 0)

    def _headroom(self, slot: Slot) -> int:
        total, free = self.pool.total_and_free(slot)
        if not slot.alive:
            return -1
        if free is None:
            return total - self.reserved(slot)
        return min(total - self.reserved(slot), free)

    def fits(self, reserve_tokens: int) -> bool:
        return any(
            s.alive and reserve_tokens <= self.pool.total_and_free(s)[0] for s in self.pool.slots
        )

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        need = entry.job.reserve_tokens
        best, best_room = None, -1
        for slot in list(self.alive()):
            room = self._headroom(slot)
            if room >= need and room > best_room:
                best, best_room = slot, room
        if best is not None:
            return best
        return "wait" if self.fits(need) else None

    def on_start(self, entry: Entry, slot: Slot) -> None:
        self._reserved[slot.index] = self.reserved(slot) + entry.job.reserve_tokens

    def on_finish(self, entry: Entry, slot: Slot) -> None:
        self._reserved[slot.index] -= entry.job.reserve_tokens

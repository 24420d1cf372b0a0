"""The rollout scheduler: which engine runs which trajectory, and when.

A `Job` is an async callable `run(engine) -> result` that declares its prompt length and its
maximum response length. The scheduler hands it one engine for its whole life (every turn goes to
the same engine, so the prefix cache keeps its context), collects its result or its failure, and
never moves or preempts a running job. Four policies, chosen once by `SchedulerConfig.policy`:

- `kv_aware` (rStar2-Agent, paper §3.2): a job is admitted to an engine only when that engine can
  hold prompt + max response tokens. Headroom is `min(total - reserved, free)`: `reserved` is the
  worst case of every job the scheduler already admitted there (so admission never races the
  engine's own report), and `free` is what the engine reports (so memory used by anyone else is
  respected). Engines are refilled as jobs finish; jobs wait in FIFO order until one fits.
- `kv_progress` (the default): the same promise (no preemption, ever), kept turn by turn with
  the exact worst case instead of the sum of worst cases. Every generation call of a job (a turn)
  is admitted only if `kvbound.peak_kv_tokens` of the engine's turns, given how far each has come
  (`ProgressEngine.progress`), plus the new turn at its maximum length fits in the cache. A job
  holds nothing between turns (while its tool runs, the engine keeps its prefix as evictable
  cache); its next turn waits on the same engine until it fits, ahead of any new job. The books
  of one engine are a `kvgate.TurnGate`; on an engine that reports no progress every turn counts
  at its worst case.
- `static` (VERL v0.2, what the paper replaced): every job of a batch (`run`, `stream`) is
  pre-assigned and started at once. `split="chunks"` (the default) gives engine e the e-th
  contiguous slice of the batch, as verl's data-parallel dispatch does (`DataProto.chunk` over a
  batch whose samples of one problem are adjacent), so a problem's samples share an engine;
  `split="round_robin"` sends job i to engine i mod E. A lone `submit` has no batch to slice and
  goes round robin.
- `least_requests` (verl v0.5): a job goes to the engine with the fewest running jobs and stays
  there; optionally capped at `max_running_per_engine`.

Engine failure: a `generate` that raises or answers `finish_reason="error"` `max_engine_errors`
times in a row, or a `kv_capacity()` probe that raises, marks the engine dead. Its running jobs
fail with the reason and nothing new goes to it; when every engine is dead, queued and new jobs
fail at once with the reasons instead of waiting forever. A failed job is not retried.

The data it takes and hands back (`Job`, `JobResult`, `EngineStatus`) is in `job.py`. Not
covered: the jobs' own logic (the agent loop), retries, priorities, weight updates (the owner
of the engines calls `update_weights` between batches). Times are the running event loop's clock,
so the same code runs on a real loop and on the simulator's virtual clock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from rstar2_rollout.config import (
    KVAwarePolicy,
    KVProgressPolicy,
    SchedulerConfig,
    StaticPolicy,
)
from rstar2_rollout.engine import Engine, Generation, KVCapacity, SamplingParams
from rstar2_rollout.job import EngineDeadError, EngineStatus, Job, JobResult
from rstar2_rollout.kvgate import TurnGate, WaitingTurn

__all__ = ["EngineDeadError", "EngineLease", "EngineStatus", "Job", "JobResult", "Scheduler"]

T = TypeVar("T")


@dataclass(eq=False)
class _Slot:
    engine: Engine
    index: int
    alive: bool = True
    dead_reason: str = ""
    reserved: int = 0
    errors: int = 0
    running: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    gate: TurnGate | None = None  # kv_progress only: the engine's turns


@dataclass(eq=False)
class _Entry:
    index: int
    job: Job[Any]
    future: asyncio.Future[JobResult[Any]]
    submitted_at: float
    batch: tuple[int, int] | None = None  # (position, size) in the batch it came with


class EngineLease:
    """The engine handle a job gets: forwards to its engine and reports errors to the scheduler."""

    def __init__(self, scheduler: Scheduler[Any], slot: _Slot, job: int) -> None:
        self._scheduler = scheduler
        self._slot = slot
        self._job = job
        self.name = slot.engine.name

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        slot = self._slot
        if not slot.alive:
            raise EngineDeadError(f"engine {self.name} is dead: {slot.dead_reason}")
        gated = slot.gate is not None
        if gated:
            refused = await self._scheduler._enter_turn(
                slot, self._job, request_id, len(prompt_ids), params.max_tokens
            )
            if refused:
                return Generation([], finish_reason="error", error=refused)
        try:
            out = await slot.engine.generate(prompt_ids, params, request_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._scheduler._record_error(slot, f"generate raised {exc!r}")
            raise
        finally:
            if gated:
                self._scheduler._leave_turn(slot, request_id)
        if out.finish_reason == "error":
            self._scheduler._record_error(slot, f"generate failed: {out.error or 'no message'}")
        else:
            slot.errors = 0
        if not slot.alive:
            raise EngineDeadError(f"engine {self.name} is dead: {slot.dead_reason}")
        return out

    def kv_capacity(self) -> KVCapacity | None:
        return self._slot.engine.kv_capacity()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        raise RuntimeError("a job may not update weights; the scheduler's owner does")

    async def close(self) -> None:
        """Nothing to release: the scheduler's owner closes engines."""


class Scheduler(Generic[T]):
    """Runs jobs on engine replicas under one placement policy (see the module docstring)."""

    def __init__(self, engines: Sequence[Engine], config: SchedulerConfig | None = None) -> None:
        if not engines:
            raise ValueError("a scheduler needs at least one engine")
        names = [e.name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        self.config = config or SchedulerConfig()
        policy = self.config.policy
        self._slots = [
            _Slot(e, i, gate=TurnGate(e, policy) if isinstance(policy, KVProgressPolicy) else None)
            for i, e in enumerate(engines)
        ]
        self._queue: deque[_Entry] = deque()
        self._submitted = 0
        self._recheck: asyncio.TimerHandle | None = None
        self._health: asyncio.Task[None] | None = None
        self._dispatching = False
        self._again = False
        static = (
            self._place_static_slices
            if isinstance(policy, StaticPolicy) and policy.split == "chunks"
            else self._place_round_robin
        )
        self._place: Callable[[_Entry], _Slot | Literal["wait"] | None] = {
            "kv_aware": self._place_kv_aware,
            "kv_progress": self._place_kv_progress,
            "static": static,
            "least_requests": self._place_least_requests,
        }[self.config.policy.kind]
        if isinstance(self.config.policy, KVAwarePolicy | KVProgressPolicy):
            for slot in self._slots:
                cap = self._capacity(slot)
                if slot.alive and cap is None and self.config.policy.kv_tokens_fallback is None:
                    raise ValueError(
                        f"engine {slot.engine.name} reports no KV capacity:"
                        f" {self.config.policy.kind} needs policy.kv_tokens_fallback"
                    )

    # ---- public API ------------------------------------------------------------------------

    def submit(self, job: Job[T]) -> asyncio.Future[JobResult[T]]:
        """Queue a job; the future resolves with its result. Cancel the future to withdraw it."""
        return self._submit([job], batch=False)[0]

    def _submit(self, jobs: Iterable[Job[T]], *, batch: bool) -> list[asyncio.Future[JobResult[T]]]:
        """Queue jobs in order, then dispatch once; `batch` records their places in the batch."""
        loop = asyncio.get_running_loop()
        jobs = list(jobs)
        futures = []
        for pos, job in enumerate(jobs):
            entry = _Entry(
                self._submitted,
                job,
                loop.create_future(),
                loop.time(),
                (pos, len(jobs)) if batch else None,
            )
            self._submitted += 1
            entry.future.add_done_callback(
                lambda f, e=entry: self._on_done(e) if f.cancelled() else None
            )
            self._queue.append(entry)
            futures.append(entry.future)
        self._start_health_checks()
        self._dispatch()
        return futures

    async def stream(self, jobs: Iterable[Job[T]]) -> AsyncGenerator[JobResult[T], None]:
        """Run jobs and yield results as they complete; closing early withdraws the rest."""
        futures = self._submit(jobs, batch=True)
        try:
            for next_done in asyncio.as_completed(futures):
                yield await next_done
        finally:
            for f in futures:
                f.cancel()

    async def run(self, jobs: Iterable[Job[T]]) -> list[JobResult[T]]:
        """Run jobs and return every result in submission order."""
        futures = self._submit(jobs, batch=True)
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for f in futures:
                f.cancel()

    def status(self) -> list[EngineStatus]:
        """Every engine: health, running jobs, reserved tokens and reported capacity."""
        out = []
        for s in self._slots:
            cap = self._capacity(s) if s.alive else None
            reserved = s.gate.bound(None, s.gate.progress()) if s.gate and s.alive else s.reserved
            out.append(
                EngineStatus(s.engine.name, s.alive, len(s.running), reserved, cap, s.dead_reason)
            )
        return out

    def fits(self, reserve_tokens: int) -> bool:
        """Whether some live engine could ever hold a job of this size (the KV policies limit)."""
        if self.config.policy.kind == "kv_aware":
            return any(s.alive and reserve_tokens <= self._total(s) for s in self._slots)
        if self.config.policy.kind == "kv_progress":
            return any(
                s.alive and s.gate and reserve_tokens <= s.gate.largest(self._total(s))
                for s in self._slots
            )
        return any(s.alive for s in self._slots)

    def mark_dead(self, name: str, reason: str) -> None:
        """Stop using an engine: its running jobs fail with `reason`, nothing new goes to it."""
        slot = next((s for s in self._slots if s.engine.name == name), None)
        if slot is None:
            raise ValueError(f"no engine named {name!r}")
        if not slot.alive:
            return
        slot.alive, slot.dead_reason = False, reason
        current = asyncio.current_task() if self._queue or slot.running else None
        for task in list(slot.running.values()):
            if task is not current:  # a job marking its own engine dead gets EngineDeadError
                task.cancel()
        if self._queue:
            self._dispatch()

    async def close(self) -> None:
        """Withdraw queued jobs and cancel running ones (their futures get an error result)."""
        if self._health is not None:
            self._health.cancel()
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        while self._queue:
            self._fail(self._queue.popleft(), "scheduler closed")
        tasks = [t for s in self._slots for t in s.running.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- placement -------------------------------------------------------------------------

    def _alive(self) -> Iterator[_Slot]:
        return (s for s in self._slots if s.alive)

    def _capacity(self, slot: _Slot) -> KVCapacity | None:
        if not slot.alive:
            return None
        try:
            return slot.engine.kv_capacity()
        except Exception as exc:
            self.mark_dead(slot.engine.name, f"health check failed: kv_capacity() raised {exc!r}")
            return None

    def _total(self, slot: _Slot) -> int:
        return self._total_and_free(slot)[0]

    def _total_and_free(self, slot: _Slot) -> tuple[int, int | None]:
        """One capacity probe: total KV tokens (the fallback where the engine reports none) and
        free ones (None where unknown)."""
        cap = self._capacity(slot)
        if cap is not None:
            return cap.total_tokens, cap.free_tokens
        return getattr(self.config.policy, "kv_tokens_fallback", None) or 0, None

    def _headroom(self, slot: _Slot) -> int:
        cap = self._capacity(slot)
        if not slot.alive:
            return -1
        if cap is None:
            return self._total(slot) - slot.reserved
        return min(cap.total_tokens - slot.reserved, cap.free_tokens)

    def _place_kv_aware(self, entry: _Entry) -> _Slot | Literal["wait"] | None:
        need = entry.job.reserve_tokens
        best, best_room = None, -1
        for slot in list(self._alive()):
            room = self._headroom(slot)
            if room >= need and room > best_room:
                best, best_room = slot, room
        if best is not None:
            return best
        if not self.fits(need):
            return None
        return "wait"

    def _place_kv_progress(self, entry: _Entry) -> _Slot | Literal["wait"] | None:
        """The engine with the most room for the job's first turn at its maximum length; engines
        whose own turns wait for room take no new job."""
        job = entry.job
        candidates = []
        for slot in list(self._alive()):
            gate = slot.gate
            assert gate is not None
            if gate.waiting or gate.full():
                continue
            room = gate.cached_room(job.max_response_tokens)
            if room is None:  # something changed here: read the engine again
                room = gate.room(self._total(slot), job.max_response_tokens)
            if room >= job.prompt_tokens:
                candidates.append((room, -slot.index, slot))
        for _, _, slot in sorted(candidates, key=lambda c: c[:2], reverse=True):
            cap = self._capacity(slot)
            if slot.alive and (cap is None or job.prompt_tokens <= cap.free_tokens):
                return slot
        if not self.fits(job.reserve_tokens):
            return None
        return "wait"

    def _place_static_slices(self, entry: _Entry) -> _Slot | Literal["wait"] | None:
        """Engine e takes the e-th contiguous slice of the job's batch (verl's split)."""
        if entry.batch is None:  # a lone submit: no batch to slice
            return self._place_round_robin(entry)
        alive = list(self._alive())
        pos, size = entry.batch
        return alive[pos * len(alive) // size] if alive else None

    def _place_round_robin(self, entry: _Entry) -> _Slot | Literal["wait"] | None:
        alive = list(self._alive())
        return alive[entry.index % len(alive)] if alive else None

    def _place_least_requests(self, entry: _Entry) -> _Slot | Literal["wait"] | None:
        alive = list(self._alive())
        if not alive:
            return None
        slot = min(alive, key=lambda s: (len(s.running), s.index))
        cap = getattr(self.config.policy, "max_running_per_engine", None)
        return "wait" if cap is not None and len(slot.running) >= cap else slot

    def _dispatch(self) -> None:
        """Start queued jobs, in order, while the policy places them (re-entrant safe)."""
        if self._dispatching:
            self._again = True
            return
        self._dispatching = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._dispatch_queue()
        finally:
            self._dispatching = False

    def _dispatch_queue(self) -> None:
        if self.config.policy.kind == "kv_progress":
            self._admit_waiting_turns()
        while self._queue:
            entry = self._queue[0]
            if entry.future.done():  # withdrawn; its _on_done has not run yet
                self._queue.popleft()
                continue
            if not any(s.alive for s in self._slots):
                reasons = "; ".join(f"{s.engine.name}: {s.dead_reason}" for s in self._slots)
                self._fail(self._queue.popleft(), f"no healthy engine ({reasons})")
                continue
            place = self._place(entry)
            if place == "wait":
                self._schedule_recheck()
                return
            if place is None and not any(s.alive for s in self._slots):
                continue  # a probe found the last engine dead: fail with every reason above
            self._queue.popleft()
            if place is None:
                where = "for one turn" if self.config.policy.kind == "kv_progress" else "in total"
                self._fail(
                    entry,
                    f"job needs {entry.job.reserve_tokens} KV tokens; no live engine can hold"
                    f" that many {where}",
                )
                continue
            self._start(entry, place)

    def _schedule_recheck(self) -> None:
        policy = self.config.policy
        if self._recheck is None and isinstance(policy, KVAwarePolicy | KVProgressPolicy):
            loop = asyncio.get_running_loop()
            self._recheck = loop.call_later(policy.recheck_interval_s, self._on_recheck)

    def _on_recheck(self) -> None:
        self._recheck = None
        for slot in self._slots:  # the engines moved on: every bound may have fallen
            if slot.gate is not None:
                slot.gate.touch()
        self._dispatch()

    # ---- kv_progress: turn admission -------------------------------------------------------

    async def _enter_turn(
        self, slot: _Slot, job: int, request_id: str, context: int, max_tokens: int
    ) -> str:
        """Return once the turn is admitted on its engine ("") or why it never can be."""
        gate = slot.gate
        assert gate is not None
        if gate.has(request_id):  # its books are by request id: a second one would hide the first
            return f"request id {request_id!r} is already running on engine {slot.engine.name}"
        if gate.first_turn(job, request_id, context, max_tokens):
            return ""  # admitted with its job
        total, free = self._total_and_free(slot)
        if not slot.alive:  # its capacity probe just failed
            raise EngineDeadError(f"engine {slot.engine.name} is dead: {slot.dead_reason}")
        need, largest = context + max_tokens, gate.largest(total)
        if need > largest:
            return (
                f"turn needs {need} KV tokens (context {context} + max_tokens {max_tokens});"
                f" engine {slot.engine.name} can hold {largest} for one turn"
            )
        if not gate.waiting and gate.fits(context, max_tokens, total, free):
            gate.admit(request_id, context, max_tokens)
            return ""
        loop = asyncio.get_running_loop()
        turn = WaitingTurn(request_id, context, max_tokens, loop.create_future())
        gate.waiting.append(turn)
        self._schedule_recheck()
        try:
            await turn.admitted
        except asyncio.CancelledError:
            if turn in gate.waiting:
                gate.waiting.remove(turn)
                gate.touch()  # the turns behind it may fit now
                self._dispatch()
            else:
                self._leave_turn(slot, request_id)
            raise
        return ""

    def _leave_turn(self, slot: _Slot, request_id: str) -> None:
        if slot.gate is not None and slot.gate.leave(request_id):
            self._dispatch()

    def _admit_waiting_turns(self) -> None:
        """Admit waiting turns, oldest first on each engine, where something changed."""
        for slot in list(self._alive()):
            gate = slot.gate
            if gate is None or not gate.dirty:
                continue
            gate.dirty = False
            total, free = self._total_and_free(slot)
            while gate.waiting:
                turn = gate.waiting[0]
                if turn.admitted.done():  # its job was cancelled
                    gate.waiting.popleft()
                    continue
                if not gate.fits(turn.context, turn.max_tokens, total, free):
                    break
                gate.waiting.popleft()
                gate.admit(turn.request_id, turn.context, turn.max_tokens)
                turn.admitted.set_result(None)
        if any(s.gate is not None and s.gate.waiting for s in self._alive()):
            self._schedule_recheck()

    # ---- running ---------------------------------------------------------------------------

    def _start(self, entry: _Entry, slot: _Slot) -> None:
        slot.reserved += entry.job.reserve_tokens
        if slot.gate is not None:
            slot.gate.hold(entry.index, entry.job.prompt_tokens, entry.job.max_response_tokens)
        task = asyncio.get_running_loop().create_task(self._run(entry, slot))
        slot.running[entry.index] = task
        task.add_done_callback(lambda _, e=entry, s=slot: self._never_ran(e, s))

    def _release(self, entry: _Entry, slot: _Slot) -> bool:
        """Give back what the job held on its engine; False if that was done already."""
        if slot.running.pop(entry.index, None) is None:
            return False
        slot.reserved -= entry.job.reserve_tokens
        if slot.gate is not None:
            slot.gate.release(entry.index)
        return True

    def _never_ran(self, entry: _Entry, slot: _Slot) -> None:
        """A task cancelled before its first step skips `_run` entirely: release for it."""
        if self._release(entry, slot):
            if not slot.alive:
                reason = f"engine {slot.engine.name} died: {slot.dead_reason}"
            else:
                reason = "withdrawn" if entry.future.cancelled() else "scheduler closed"
            self._fail(entry, reason)
            self._dispatch()

    async def _run(self, entry: _Entry, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        value, error = None, None
        try:
            value = await entry.job.run(EngineLease(self, slot, entry.index))
        except asyncio.CancelledError:
            if slot.alive and entry.future.cancelled():
                error = "withdrawn"
            elif slot.alive:
                error = "scheduler closed"
            else:
                error = f"engine {slot.engine.name} died: {slot.dead_reason}"
        except EngineDeadError:
            error = f"engine {slot.engine.name} died: {slot.dead_reason}"
        except Exception as exc:
            error = f"job raised {exc!r}"
        finally:
            self._release(entry, slot)
        if error is None and not slot.alive:
            error = f"engine {slot.engine.name} died: {slot.dead_reason}"
        if not entry.future.done():
            entry.future.set_result(
                JobResult(
                    entry.index,
                    entry.job.tag,
                    value,
                    error,
                    slot.engine.name,
                    entry.submitted_at,
                    started,
                    loop.time(),
                )
            )
        self._dispatch()

    def _on_done(self, entry: _Entry) -> None:
        """The caller cancelled the future: drop the job from the queue or stop it."""
        if entry in self._queue:
            self._queue.remove(entry)
            return
        for slot in self._slots:
            task = slot.running.get(entry.index)
            if task is not None:
                task.cancel()

    def _fail(self, entry: _Entry, reason: str) -> None:
        if not entry.future.done():
            now = asyncio.get_running_loop().time()
            entry.future.set_result(
                JobResult(
                    entry.index, entry.job.tag, None, reason, None, entry.submitted_at, None, now
                )
            )

    def _record_error(self, slot: _Slot, message: str) -> None:
        slot.errors += 1
        if slot.errors >= self.config.max_engine_errors:
            self.mark_dead(slot.engine.name, f"{slot.errors} errors in a row, last: {message}")

    def _start_health_checks(self) -> None:
        interval = self.config.health_check_interval_s
        if interval is None or (self._health is not None and not self._health.done()):
            return
        self._health = asyncio.get_running_loop().create_task(self._probe(interval))

    async def _probe(self, interval: float) -> None:
        while any(s.running for s in self._slots) or self._queue:
            for slot in list(self._alive()):
                self._capacity(slot)
            await asyncio.sleep(interval)

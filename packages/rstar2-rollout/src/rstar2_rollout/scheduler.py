"""The rollout scheduler: which engine runs which trajectory, and when.

A `Job` is an async callable `run(engine) -> result` that declares its prompt length and its
maximum response length. The scheduler hands it one engine for its whole life (every turn goes to
the same engine, so the prefix cache keeps its context), collects its result or its failure, and
never moves or preempts a running job. The core here keeps the queue, failures and the job
lifecycle; the policy is one `admission.Admission` object built once from `SchedulerConfig.policy`
(`make_admission`), asked where a job goes and whether each turn may run. The policies:

- `kv_aware` (rStar2-Agent, paper §3.2): a job is admitted to an engine only when that engine can
  hold prompt + max response tokens. Headroom is `min(total - reserved, free)`: `reserved` is the
  worst case of every job the scheduler already admitted there (so admission never races the
  engine's own report), and `free` is what the engine reports (so memory used by anyone else is
  respected). Engines are refilled as jobs finish; jobs wait in FIFO order until one fits.
- `kv_progress`: the same promise (no preemption, ever), kept turn by turn with
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
- `least_requests` (verl v0.5; the default): a job goes to the engine with the fewest running
  jobs and stays there, and the engine admits and preempts by itself; optionally capped at
  `max_running_per_engine`. On an engine that preempts like vLLM V1 it was measured the best
  policy overall (SCHEDULER.md): KV-aware admission gives up more batch than it saves.
- `power_of_two`, `cache_aware` (sglang-router), `least_tokens`: see `research/peers.py`.

`least_requests` and `kv_aware` live in `admission.py` and are what `SchedulerConfig` offers;
the others (kv_progress, forecast, the peers) are research code in `rstar2_rollout.research`,
configured with `research.config.ResearchSchedulerConfig` and imported by `make_admission` only
when the config names one, so `import rstar2_rollout` never loads them.

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
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any, Generic, TypeVar

from rstar2_rollout.admission import Admission, Entry, KVAware, LeastRequests, Pool, Slot
from rstar2_rollout.config import KVAwarePolicy, LeastRequestsPolicy, SchedulerConfig
from rstar2_rollout.engine import Engine, Generation, KVCapacity, SamplingParams
from rstar2_rollout.job import EngineDeadError, EngineStatus, Job, JobResult

__all__ = [
    "EngineDeadError",
    "EngineLease",
    "EngineStatus",
    "Job",
    "JobResult",
    "Scheduler",
    "make_admission",
]

T = TypeVar("T")


def make_admission(config: SchedulerConfig, pool: Pool) -> Admission:
    """Builds the admission object of `config.policy` over the engines of `pool` (once per
    scheduler). It imports the research policies only when the config names one."""
    p = config.policy
    if isinstance(p, LeastRequestsPolicy):
        return LeastRequests(pool, p)
    if isinstance(p, KVAwarePolicy):
        return KVAware(pool, p)
    from rstar2_rollout.research.policies import make_research_admission

    return make_research_admission(p, pool)


class EngineLease:
    """The engine handle a job gets: forwards to its engine and reports errors to the scheduler."""

    def __init__(self, scheduler: Scheduler[Any], slot: Slot, job: int) -> None:
        self._scheduler = scheduler
        self._slot = slot
        self._job = job
        self.name = slot.engine.name

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        slot, policy = self._slot, self._scheduler.admission
        if not slot.alive:
            raise EngineDeadError(f"engine {self.name} is dead: {slot.dead_reason}")
        refused = await policy.enter_turn(
            slot, self._job, request_id, len(prompt_ids), params.max_tokens
        )
        if refused:
            return Generation([], finish_reason="error", error=refused)
        out: Generation | None = None
        try:
            out = await slot.engine.generate(prompt_ids, params, request_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._scheduler._record_error(slot, f"generate raised {exc!r}")
            raise
        finally:
            policy.leave_turn(slot, self._job, request_id, out)
        assert out is not None  # generate returned
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
    """Runs jobs on engine replicas under one scheduling policy (see the module docstring)."""

    def __init__(self, engines: Sequence[Engine], config: SchedulerConfig | None = None) -> None:
        if not engines:
            raise ValueError("a scheduler needs at least one engine")
        names = [e.name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        self.config = config or SchedulerConfig()
        self.slots = [Slot(e, i) for i, e in enumerate(engines)]
        self._queue: deque[Entry] = deque()
        self._submitted = 0
        self._recheck: asyncio.TimerHandle | None = None
        self._health: asyncio.Task[None] | None = None
        self._dispatching = False
        self._again = False
        fallback = getattr(self.config.policy, "kv_tokens_fallback", False)
        if fallback is None:  # a KV-aware policy: every engine must report capacity
            for slot in self.slots:
                if self.capacity(slot) is None and slot.alive:
                    raise ValueError(
                        f"engine {slot.engine.name} reports no KV capacity:"
                        f" {self.config.policy.kind} needs policy.kv_tokens_fallback"
                    )
        self.admission = make_admission(self.config, self)

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
            entry = Entry(
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
        for s in self.slots:
            cap = self.capacity(s) if s.alive else None
            reserved = self.admission.reserved(s) if s.alive else 0
            out.append(
                EngineStatus(s.engine.name, s.alive, len(s.running), reserved, cap, s.dead_reason)
            )
        return out

    @property
    def starts_every_job(self) -> bool:
        """Whether every job starts at once, whatever runs (least_requests without a cap): a job
        waiting between its turns then keeps nothing from another job."""
        policy = self.config.policy
        return isinstance(policy, LeastRequestsPolicy) and policy.max_running_per_engine is None

    def fits(self, reserve_tokens: int) -> bool:
        """Whether some live engine could ever hold a job of this size (the KV policies limit)."""
        return self.admission.fits(reserve_tokens)

    def mark_dead(self, name: str, reason: str) -> None:
        """Stop using an engine: its running jobs fail with `reason`, nothing new goes to it."""
        slot = next((s for s in self.slots if s.engine.name == name), None)
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
        tasks = [t for s in self.slots for t in s.running.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- what policies see (`admission.Pool`) --------------------------------------------

    def capacity(self, slot: Slot) -> KVCapacity | None:
        """The engine's capacity report; an engine whose probe raises is marked dead (None)."""
        if not slot.alive:
            return None
        try:
            return slot.engine.kv_capacity()
        except Exception as exc:
            self.mark_dead(slot.engine.name, f"health check failed: kv_capacity() raised {exc!r}")
            return None

    def total_and_free(self, slot: Slot) -> tuple[int, int | None]:
        """One capacity probe: total KV tokens (the fallback where the engine reports none) and
        free ones (None where unknown)."""
        cap = self.capacity(slot)
        if cap is not None:
            return cap.total_tokens, cap.free_tokens
        return getattr(self.config.policy, "kv_tokens_fallback", None) or 0, None

    def dispatch(self) -> None:
        self._dispatch()

    def schedule_recheck(self) -> None:
        interval = self.admission.recheck_interval_s
        if self._recheck is None and interval is not None:
            self._recheck = asyncio.get_running_loop().call_later(interval, self._on_recheck)

    # ---- the queue -------------------------------------------------------------------------

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
        self.admission.before_dispatch()
        if self._queue:
            self.admission.order(self._queue)
        while self._queue:
            entry = self._queue[0]
            if entry.future.done():  # withdrawn; its _on_done has not run yet
                self._queue.popleft()
                continue
            if not any(s.alive for s in self.slots):
                reasons = "; ".join(f"{s.engine.name}: {s.dead_reason}" for s in self.slots)
                self._fail(self._queue.popleft(), f"no healthy engine ({reasons})")
                continue
            place = self.admission.place(entry)
            if place == "wait":
                self.schedule_recheck()
                return
            if place is None and not any(s.alive for s in self.slots):
                continue  # a probe found the last engine dead: fail with every reason above
            self._queue.popleft()
            if place is None:
                self._fail(entry, self.admission.too_large(entry))
                continue
            self._start(entry, place)

    def _on_recheck(self) -> None:
        self._recheck = None
        self.admission.on_recheck()
        self._dispatch()

    # ---- running ---------------------------------------------------------------------------

    def _start(self, entry: Entry, slot: Slot) -> None:
        self.admission.on_start(entry, slot)
        task = asyncio.get_running_loop().create_task(self._run(entry, slot))
        slot.running[entry.index] = task
        task.add_done_callback(lambda _, e=entry, s=slot: self._never_ran(e, s))

    def _release(self, entry: Entry, slot: Slot) -> bool:
        """Give back what the job held on its engine; False if that was done already."""
        if slot.running.pop(entry.index, None) is None:
            return False
        self.admission.on_finish(entry, slot)
        return True

    def _never_ran(self, entry: Entry, slot: Slot) -> None:
        """A task cancelled before its first step skips `_run` entirely: release for it."""
        if self._release(entry, slot):
            if not slot.alive:
                reason = f"engine {slot.engine.name} died: {slot.dead_reason}"
            else:
                reason = "withdrawn" if entry.future.cancelled() else "scheduler closed"
            self._fail(entry, reason)
            self._dispatch()

    async def _run(self, entry: Entry, slot: Slot) -> None:
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

    def _on_done(self, entry: Entry) -> None:
        """The caller cancelled the future: drop the job from the queue or stop it."""
        if entry in self._queue:
            self._queue.remove(entry)
            return
        for slot in self.slots:
            task = slot.running.get(entry.index)
            if task is not None:
                task.cancel()

    def _fail(self, entry: Entry, reason: str) -> None:
        if not entry.future.done():
            now = asyncio.get_running_loop().time()
            entry.future.set_result(
                JobResult(
                    entry.index, entry.job.tag, None, reason, None, entry.submitted_at, None, now
                )
            )

    def _record_error(self, slot: Slot, message: str) -> None:
        slot.errors += 1
        if slot.errors >= self.config.max_engine_errors:
            self.mark_dead(slot.engine.name, f"{slot.errors} errors in a row, last: {message}")

    def _start_health_checks(self) -> None:
        interval = self.config.health_check_interval_s
        if interval is None or (self._health is not None and not self._health.done()):
            return
        self._health = asyncio.get_running_loop().create_task(self._probe(interval))

    async def _probe(self, interval: float) -> None:
        while any(s.running for s in self.slots) or self._queue:
            for slot in list(s for s in self.slots if s.alive):
                self.capacity(slot)
            await asyncio.sleep(interval)

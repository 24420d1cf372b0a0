"""`Engines`: the run's rollout engines as one object the loop can sleep, wake and push to.

Every placement (local engines in this process, Ray engine actors, engines held by colocated
training ranks) hands the trainer one `Engines`. It is a sequence of the metered engines (the
scheduler and the rollout meters iterate it) plus the three calls a step makes around its update:

    sleep()                 free the engines' accelerator memory before the ranks train
                            (vLLM sleep level 1 or 2; level 0, a pause, on engines that cannot)
    wake(tags)              "weights" before a push, "kv_cache" after it (vLLM's RL order)
    push(named_tensors)     the policy's weights into every engine, streamed in buckets of
                            the engine's dtype (training/weight_sync.py), with a `SyncReport`
    push_channel(ranks)     split placement: training rank 0's weights into every engine
                            actor over one weight channel (see below), with a `SyncReport`

Each call goes to every engine at once. An engine whose call fails because its process died
(a Ray actor error, or an engine that reports itself not alive) is DROPPED: it gets no later
sleep, wake or push, the step goes on with the others, and `dropped` names it; when none is left
the call raises `EngineError`. Any other exception propagates (a bug, not a lost machine).

`push_channel(ranks, bucket_bytes, timeout_s)` (ranks: a `train_workers.TrainGroup`) checks every
live engine actor first (a dead one is dropped before any group exists), wakes their weights,
has rank 0 open a channel for exactly those E engines, then runs rank 0's send (every rank
gathering) and the E receives at once; the group's set-up and collectives give up after
`timeout_s` (default: the `sync_timeout_s` the cluster placement sets from
`cluster.sync_timeout_s`, 300 s). With turns in flight (partial rollouts) each engine actor
finishes its running turns on the old weights and holds new ones until its load ends (vLLM's
update session, the transformers engine's lock): no turn spans two versions, and that wait
counts against `timeout_s` (tests/test_split_partial.py pushes with turns in flight). An
engine lost during the sync is dropped and the sync is made again, once, for the survivors (a
fresh group: the failed one left them with a partial update). `bytes_moved` is the model once
in the engines' dtype; `extra["time_sync_connect_s"]` is the group's build time.

Tested on real Ray actors (tests/test_split_sync.py): an engine killed before a sync (dropped
at the check); and the retry: an engine killed after the channel was opened for it, as rank 0
starts sending, so the first attempt fails (rank 0's send reports it, well within
`sync_timeout_s`), the engine is dropped and the survivor is synced again over a fresh channel. A death between two buckets takes the same path (a lost engine in
the attempt's results) but is not timed by a test: that would need a hook in the engine.

Not covered: replacing a dropped engine (the run continues with fewer), engines on remote
rollout workers (`placement.remote` pushes through its own stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar2_rollout.engine import SleepingEngine

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """No engine is left to roll out on."""


@dataclass
class SyncReport:
    """One push: what it moved and how long each part took."""

    bytes_moved: int = 0  # per engine, in the engine's dtype
    buckets: int = 0
    wake_s: float = 0.0  # waking weights and KV cache around the load
    load_s: float = 0.0  # gathering, casting and loading, slowest engine
    total_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        return {
            "time_sync_s": self.total_s,
            "time_sync_load_s": self.load_s,
            "time_wake_s": self.wake_s,
            "sync_bytes": float(self.bytes_moved),
            "sync_buckets": float(self.buckets),
            **self.extra,
        }


def _inner(engine: Any) -> Any:
    return getattr(engine, "inner", engine)  # an EngineMeter wraps the engine


def _is_lost(exc: BaseException) -> bool:
    """True when `exc` means the engine's process is gone (not a bug in our code)."""
    try:
        from ray.exceptions import RayActorError, WorkerCrashedError
    except ImportError:  # no Ray: only local engines, which report death through `alive`
        return False
    return isinstance(exc, (RayActorError, WorkerCrashedError))


class Engines(Sequence[Any]):
    """The run's engines (metered), with sleep, wake and push over the ones still alive."""

    def __init__(
        self, engines: Sequence[Any], *, sleep_level: int = 1, sync_timeout_s: float = 300.0
    ) -> None:
        self._all = list(engines)
        self.sleep_level = sleep_level
        self.sync_timeout_s = sync_timeout_s  # push_channel's default (cluster.sync_timeout_s)
        self.dropped: list[str] = []
        self.sleep_s = 0.0  # the last sleep() call's seconds

    # -- the sequence the scheduler and the meters iterate
    def __len__(self) -> int:
        return len(self._all)

    def __getitem__(self, index: Any) -> Any:
        return self._all[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all)

    @property
    def alive(self) -> list[Any]:
        """The engines not dropped and not reporting themselves dead."""
        return [
            e
            for e in self._all
            if e.name not in self.dropped and getattr(_inner(e), "alive", True) is not False
        ]

    def _sleepers(self, asleep: bool) -> list[Any]:
        """The live engines that can sleep and are (`asleep`) or are not asleep now."""
        found = []
        for engine in self.alive:
            inner = _inner(engine)
            if isinstance(inner, SleepingEngine) and inner.can_sleep and inner.sleeping == asleep:
                found.append(engine)
        return found

    async def _each(self, engines: Sequence[Any], call: Any) -> list[Any]:
        """`call(engine)` on every engine at once; the lost ones are dropped."""
        results = await asyncio.gather(*(call(e) for e in engines), return_exceptions=True)
        kept = []
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, BaseException):
                if not _is_lost(result):
                    raise result
                self.dropped.append(engine.name)
                log.warning("engine %s dropped: %s", engine.name, str(result).splitlines()[0])
            else:
                kept.append(result)
        if self._all and not self.alive:
            raise EngineError(f"every engine is gone (dropped: {', '.join(self.dropped)})")
        return kept

    async def sleep(self) -> float:
        """Sleep every engine that can (at `sleep_level`); seconds."""
        start = time.perf_counter()
        await self._each(self._sleepers(False), lambda e: _inner(e).sleep(self.sleep_level))
        self.sleep_s = time.perf_counter() - start
        return self.sleep_s

    async def wake(self, tags: Sequence[str] | None = None) -> float:
        """Wake `tags` ("weights", "kv_cache"; None: all) on every sleeping engine; seconds."""
        start = time.perf_counter()
        wake = list(tags) if tags else None
        await self._each(self._sleepers(True), lambda e: _inner(e).wake_up(wake))
        return time.perf_counter() - start

    async def push(self, named_tensors: Iterable[tuple[str, Any]]) -> SyncReport:
        """The policy's weights (held in this process) into every live engine: each wakes its
        weights, loads the stream, wakes its KV cache (`weight_sync.push_weights`)."""
        from rstar2_trainer.training.weight_sync import push_weights

        start = time.perf_counter()
        items = list(named_tensors)  # references: every engine reads the same tensors
        times = await self._each(self.alive, lambda e: push_weights([e], items))
        report = SyncReport(total_s=time.perf_counter() - start)
        if times:
            report.wake_s = max(t.wake_weights_s + t.wake_kv_s for t in times)
            report.load_s = max(t.load_s for t in times)
        _absorb(report, times)
        return report

    async def push_channel(
        self, ranks: Any, *, bucket_bytes: int, timeout_s: float | None = None
    ) -> SyncReport:
        """Rank 0 of `ranks` sends the weights to every live engine actor over one fresh
        channel group (engines lost before or during it are dropped); a `SyncReport`.
        `timeout_s`: None takes `sync_timeout_s`."""
        start = time.perf_counter()
        timeout_s = self.sync_timeout_s if timeout_s is None else timeout_s
        if not self._all:
            return SyncReport()
        dtypes = await self._each(self.alive, lambda e: _inner(e).weight_dtype_name())
        wake_s = await self.wake(["weights"])
        sent, failed = await self._over_channel(ranks, dtypes[0], bucket_bytes, timeout_s)
        if failed is not None and failed[1]:  # an engine died mid-sync: again, the survivors
            sent, failed = await self._over_channel(ranks, dtypes[0], bucket_bytes, timeout_s)
        if failed is not None:
            raise EngineError(f"weight sync over the channel failed: {failed[0]}")
        wake_s += await self.wake(["kv_cache"])
        return SyncReport(
            bytes_moved=int(sent["bytes_moved"]),
            buckets=int(sent["buckets"]),
            wake_s=wake_s,
            load_s=float(sent["seconds"]),
            total_s=time.perf_counter() - start,
            extra={"time_sync_connect_s": float(sent["connect_s"])},
        )

    async def _over_channel(
        self, ranks: Any, dtype: str, bucket_bytes: int, timeout_s: float
    ) -> tuple[dict[str, Any], tuple[str, bool] | None]:
        """One sync over a fresh group: rank 0's report, and (why, engines were lost) on failure."""
        targets = self.alive
        opened = await ranks.open_channel(len(targets), timeout_s)
        world = len(targets) + 1
        send = asyncio.ensure_future(ranks.send_weights(dtype, bucket_bytes))
        receives = [
            _inner(e).receive_weights(opened["address"], rank, world, opened["backend"], timeout_s)
            for rank, e in enumerate(targets, start=1)
        ]
        results = await asyncio.gather(*receives, return_exceptions=True)
        sent = await send
        lost = failed = 0
        why = sent.get("error", "")
        for engine, result in zip(targets, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            if _is_lost(result):
                self.dropped.append(engine.name)
                log.warning("engine %s dropped: %s", engine.name, str(result).splitlines()[0])
                lost += 1
            else:
                failed += 1
                why = why or f"{engine.name}: {type(result).__name__}: {result}".splitlines()[0]
        if self._all and not self.alive:
            raise EngineError(f"every engine is gone (dropped: {', '.join(self.dropped)})")
        if lost or failed or "error" in sent:
            return sent, (why or f"{lost} engine(s) lost", lost > 0)
        return sent, None


def _absorb(report: SyncReport, parts: Sequence[Any]) -> None:
    """Bytes and buckets from per-engine push results that report them (the first engine's)."""
    for part in parts[:1]:
        report.bytes_moved = int(getattr(part, "bytes_moved", 0) or 0)
        report.buckets = int(getattr(part, "buckets", 0) or 0)

"""`Engines`: the run's rollout engines as one object: which are alive, sleep and wake.

Every placement (local engines in this process, Ray engine actors, engines held by colocated
training ranks) hands the trainer one `Engines`. It is a sequence of the metered engines (the
scheduler and the rollout meters iterate it) plus what the placement's weight mover
(placement/weights.py) does to them around an update:

    sleep()                 free the engines' accelerator memory before the ranks train
                            (vLLM sleep level 1 or 2; level 0, a pause, on engines that cannot);
                            the number of engines it put to sleep
    wake(tags)              "weights" before a push, "kv_cache" after it (vLLM's RL order)
    each(engines, call)     `call(engine)` on each at once, the lost ones dropped

Each call goes to every engine at once. An engine whose call fails because its process died
(a Ray actor error, or an engine that reports itself not alive) is DROPPED: it gets no later
sleep, wake or push, and `dropped` names it; when none is left the call raises `EngineError`.
Any other exception propagates (a bug, not a lost machine). What a dropped engine means is the
mover's to say: in split placement the run goes on with the others; a colocated engine shares
its process with a training rank, so the colocated mover stops the run (`RankError`).

Tested without Ray's cluster in tests/test_placement.py (an engine whose calls raise Ray's
actor error); on real actors in tests/test_split_sync.py and tests/test_gpu_rules.py.

Split placement's engine actors come back instead of being dropped (ray_engine.py: health
checks, a new actor with the current weights, their turns sent to the others meanwhile); an
engine is dropped once it has no restart left. Not covered: replacing a dropped engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from rstar2_rollout.engine import SleepingEngine

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """No engine is left to roll out on."""


def _inner(engine: Any) -> Any:
    return getattr(engine, "inner", engine)  # an EngineMeter wraps the engine


def is_lost(exc: BaseException) -> bool:
    """True when `exc` means the engine's process is gone (not a bug in our code)."""
    try:
        from ray.exceptions import RayActorError, WorkerCrashedError
    except ImportError:  # no Ray: only local engines, which report death through `alive`
        return False
    return isinstance(exc, (RayActorError, WorkerCrashedError))


class Engines(Sequence[Any]):
    """The run's engines (metered), with sleep and wake over the ones still alive."""

    def __init__(self, engines: Sequence[Any], *, sleep_level: int = 1) -> None:
        self._all = list(engines)
        self.sleep_level = sleep_level
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

    def drop(self, engine: Any, exc: BaseException) -> None:
        """Stop using `engine`, whose process died (`exc`); an engine that comes back
        (ray_engine.py: a `spawn` and restarts left) is brought back instead."""
        inner = _inner(engine)
        if getattr(inner, "can_come_back", lambda: False)():
            inner.lost(inner.actor, exc)
            return
        self.dropped.append(engine.name)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("engine %s dropped: %s", engine.name, why)

    def check_left(self) -> None:
        """Raise `EngineError` when every engine is gone."""
        if self._all and not self.alive:
            raise EngineError(f"every engine is gone (dropped: {', '.join(self.dropped)})")

    async def each(
        self, engines: Sequence[Any], call: Callable[[Any], Awaitable[Any]]
    ) -> list[Any]:
        """`call(engine)` on every engine at once; the results of those not lost (the lost
        ones are dropped)."""
        results = await asyncio.gather(*(call(e) for e in engines), return_exceptions=True)
        kept = []
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, BaseException):
                if not is_lost(result):
                    raise result
                self.drop(engine, result)
            else:
                kept.append(result)
        self.check_left()
        return kept

    async def sleep(self) -> int:
        """Sleep every awake engine that can (at `sleep_level`); how many it put to sleep."""
        start = time.perf_counter()
        awake = self._sleepers(False)
        done = await self.each(awake, lambda e: _inner(e).sleep(self.sleep_level))
        self.sleep_s = time.perf_counter() - start
        return len(done)

    async def wake(self, tags: Sequence[str] | None = None) -> float:
        """Wake `tags` ("weights", "kv_cache"; None: all) on every sleeping engine; seconds."""
        start = time.perf_counter()
        wake = list(tags) if tags else None
        await self.each(self._sleepers(True), lambda e: _inner(e).wake_up(wake))
        return time.perf_counter() - start

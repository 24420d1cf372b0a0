"""The driver's face of an engine actor: `RayEngine`, and `WeightPublisher`.

`RayEngine` satisfies the rollout `Engine` Protocol (and `SleepingEngine`) over one engine actor
(an `EngineActor`, or a colocated rank's engine, `colocated.ColocatedTrainWorker`) by awaiting actor
calls. `kv_capacity()` must not block the event loop, so it returns the capacity the actor
reported with its last answer (the scheduler also counts what it has reserved, so a slightly old
number never over-admits); `progress()` likewise. A failed generate (the actor died) answers with
finish_reason "error". `receive_weights` / `close_channel` are the engine's side of split
placement's weight channel (placement/channel.py); `update_weights` puts the driver's state dict
in the object store once per version of the weights (`WeightPublisher`) for every engine actor
to load. `close()` gives an actor stuck in a collective `CLOSE_TIMEOUT_S` before killing it.

Engines that come back (split placement; `start_engines` hands each engine a `spawn` and an
`EngineHealth`): every `interval_s` the driver asks each engine actor for its capacity and
gives it `timeout_s` to answer. An actor that died (kill -9: Ray's actor error on any call) or
does not answer in time (SIGSTOP, a wedged engine) is LOST: it is killed (`ray.kill`, and by
pid when it runs on the driver's host, since a stopped process answers no request to exit),
and a new actor with the same engine config is started (`spawn`). It gets the current weights
before it serves: the object-store copy the publisher holds (`TensorMover`), or, when its
weights came over the split channel or as an adapter, the next push (`needs_weights`; until
then it serves nothing, and the channel is rebuilt for its new incarnation). Meanwhile the
turns the lost actor was running fail with the actor error and are sent again, whole, to a
sibling engine that is serving (`siblings`), or to this engine once it is back: the agent loop
above never sees the failure, so no trajectory fails and no turn is scored as the model's.
Counted: `restarts` (actors started again) and `turns_moved` (turns sent again). After
`max_restarts` restarts the engine is gone (`alive` False) and `Engines` drops it.

When every engine waits for the weights of a push (split channel, all lost in one rollout) the
turns fail as the system's ("error", never the model's) instead of waiting for a push that waits
for them. Not covered: a colocated engine (it shares its process with a training rank: the run
restarts, restarts.py), an engine that answers its health check but never finishes a turn, one
whose event loop is blocked longer than the deadline by legitimate work (it counts as hung: keep
`timeout_s` above a weight load's duration), and the tokens of a turn in flight when its actor
was lost (the turn runs again from its prompt).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_rollout.engine import EngineProgress, Generation, KVCapacity, SamplingParams

CLOSE_TIMEOUT_S = 10.0
MOVES_PER_TURN = 4  # a turn is sent again at most this many times

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineHealth:
    """How an engine actor is watched and brought back (see the module docstring)."""

    interval_s: float = 5.0  # between health checks
    timeout_s: float = 30.0  # a check not answered by then: the engine hangs
    max_restarts: int = 3  # actors started again before the engine is given up
    start_timeout_s: float = 900.0  # a new actor's start


class EngineLost(RuntimeError):
    """No actor of this engine (nor of its siblings) can serve."""


class WeightPublisher:
    """Puts a state dict in the object store once per version of the weights."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._ref: Any = None
        self.put_s = 0.0

    @property
    def latest(self) -> Any:
        """The object-store copy of the newest weights published (None: none yet)."""
        return self._ref

    def publish(self, named_tensors: Iterable[tuple[str, Any]]) -> Any:
        import ray

        items = list(named_tensors)
        key = tuple((n, t.data_ptr(), t._version) for n, t in items)
        if key != self._key:
            start = time.perf_counter()
            cpu = [(n, t.detach().to("cpu").contiguous()) for n, t in items]
            self._ref, self._key = ray.put(cpu), key
            self.put_s = time.perf_counter() - start
        return self._ref


class RayEngine:
    """The rollout `Engine` Protocol over one `EngineActor`."""

    def __init__(
        self,
        actor: Any,
        name: str,
        capacity: KVCapacity | None,
        publisher: WeightPublisher,
        progress: EngineProgress | None = None,
    ) -> None:
        self.actor = actor
        self.name = name
        self._capacity = capacity
        self._publisher = publisher
        self.last_load_s = 0.0
        self.can_sleep = False  # set by start_engines from the actor
        self.owns_actor = True  # False for a colocated rank's engine: the rank's group closes it
        self.sleeping = False
        self._progress = progress  # the newest report an answer (or the start) brought
        # coming back (module docstring); without `spawn` a lost actor is an error, as ever
        self.spawn: Callable[[], Any] | None = None
        self.health = EngineHealth()
        self.siblings: list[RayEngine] = []  # the placement's other engines
        self.pid: int | None = None  # the actor's process, when on the driver's host
        self.incarnation = 0  # actors started after the first
        self.restarts = 0
        self.turns_moved = 0
        self.alive = True  # False once the engine is given up
        self.needs_weights = False  # a new actor waiting for the next push
        self._weights = "model"  # where the serving weights came from
        self._reviving: asyncio.Task | None = None
        self._watching: asyncio.Task | None = None

    # -- serving, and coming back
    def serving(self) -> bool:
        """Whether this engine's actor takes turns now."""
        return self.alive and not self.needs_weights and not self._revival_running()

    def can_come_back(self) -> bool:
        """Whether a lost actor of this engine is (or will be) replaced."""
        if self.spawn is None or not self.alive:
            return False
        return self._revival_running() or self.restarts < self.health.max_restarts

    def _revival_running(self) -> bool:
        return self._reviving is not None and not self._reviving.done()

    async def _target(self) -> RayEngine:
        """The engine to send a turn to: this one when serving, else a serving sibling, else
        this one once its new actor is back."""
        if self.serving():
            return self
        for sibling in self.siblings:
            if sibling.serving():
                return sibling
        await self.ready()
        if self.serving():
            return self
        for sibling in self.siblings:
            if sibling.serving():
                return sibling
        if self.needs_weights:  # the push that would bring them waits for this rollout
            raise EngineLost(f"engine {self.name} waits for the weights and no engine serves")
        raise EngineLost(f"engine {self.name} is gone")

    async def ready(self) -> None:
        """Return once no new actor of this engine is starting."""
        while self._revival_running():
            assert self._reviving is not None
            await asyncio.shield(self._reviving)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        from ray.exceptions import RayError

        from rstar2_trainer.placement.engines import is_lost

        moves = 0
        while True:
            try:
                target = await self._target()
            except EngineLost as exc:
                return Generation([], finish_reason="error", error=str(exc))
            actor = target.actor
            ref = actor.generate.remote(list(prompt_ids), params, request_id)
            try:
                out, capacity, progress = await ref
            except asyncio.CancelledError:
                import ray

                ray.cancel(ref)
                raise
            except RayError as exc:
                if target.spawn is not None and is_lost(exc) and moves < MOVES_PER_TURN:
                    target.lost(actor, exc)
                    moves += 1
                    self.turns_moved += 1
                    continue
                reason = f"engine actor {target.name} failed: {type(exc).__name__}: {exc}"
                return Generation([], finish_reason="error", error=reason.splitlines()[0])
            target._capacity = capacity
            if progress is not None and (
                target._progress is None or progress.step >= target._progress.step
            ):
                target._progress = progress  # answers may arrive out of order: the newest
            return out

    def lost(self, actor: Any, why: BaseException | str, *, hung: bool = False) -> None:
        """`actor` (this engine's, unless already replaced) died or (`hung`) does not answer:
        bring the engine back, once however many callers noticed."""
        if actor is not self.actor or self._revival_running() or not self.alive:
            return
        reason = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
        revive = self._revive(reason[:200], hung)
        self._reviving = asyncio.get_running_loop().create_task(revive)

    async def _revive(self, reason: str, hung: bool) -> None:
        import ray

        self._kill(self.actor, by_pid=hung)
        if self.restarts >= self.health.max_restarts or self.spawn is None:
            log.warning("engine %s lost (%s); no restart left", self.name, reason)
            self.alive = False
            return
        self.restarts += 1
        log.warning("engine %s lost (%s); restart %d", self.name, reason, self.restarts)
        actor = None
        try:
            actor = self.spawn()
            capacity = await asyncio.wait_for(
                _awaited(actor.kv_capacity.remote()), self.health.start_timeout_s
            )
            pid, where = await asyncio.gather(actor.pid.remote(), actor.where.remote())
            ref = self._publisher.latest
            if ref is not None and self._weights not in ("channel", "adapter"):
                await actor.update_weights.remote(ref)
                capacity = await actor.kv_capacity.remote()
        except BaseException as exc:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if not isinstance(exc, Exception):  # cancelled: the engine is being closed
                raise
            log.warning("engine %s could not start again: %s", self.name, exc)
            self.alive = False
            return
        self.actor, self._capacity, self.sleeping = actor, capacity, False
        self.pid = pid if where["ip"] == _driver_ip() else None
        self.incarnation += 1
        self.needs_weights = self._weights in ("channel", "adapter")

    def _kill(self, actor: Any, *, by_pid: bool) -> None:
        """End `actor` for sure: Ray's kill, and for a hung one on this host SIGKILL by pid (a
        stopped process does not act on Ray's request; a dead one's pid is not ours)."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        if by_pid and self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
            self.pid = None

    async def watch(self) -> None:
        """Health checks until the engine is closed or gone (run as a task: `start_watch`)."""
        from ray.exceptions import RayError

        from rstar2_trainer.placement.engines import is_lost

        while self.alive:
            await asyncio.sleep(self.health.interval_s)
            if self._revival_running():
                continue
            actor = self.actor
            try:
                await asyncio.wait_for(_awaited(actor.kv_capacity.remote()), self.health.timeout_s)
            except TimeoutError:
                why = f"no answer to a health check in {self.health.timeout_s:g} s"
                self.lost(actor, why, hung=True)
            except RayError as exc:
                if is_lost(exc):
                    self.lost(actor, exc)

    async def start_watch(self) -> None:
        """Learn the actor's pid (on this host) and start the health checks."""
        pid, where = await asyncio.gather(self.actor.pid.remote(), self.actor.where.remote())
        self.pid = pid if where["ip"] == _driver_ip() else None
        self._watching = asyncio.get_running_loop().create_task(self.watch())

    def kv_capacity(self) -> KVCapacity | None:
        return self._capacity

    def progress(self) -> EngineProgress | None:
        """The progress report of the engine's last answer: old, and so safe (`ProgressEngine`)."""
        return self._progress

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self.load_weights_ref(self._publisher.publish(named_tensors))

    async def load_weights_ref(self, ref: Any) -> float:
        """Load weights already in the object store (a list of (name, tensor)); seconds."""
        await self.ready()
        self.last_load_s = await self.actor.update_weights.remote(ref)
        self._capacity = await self.actor.kv_capacity.remote()
        self._weights, self.needs_weights = "publisher", False
        return self.last_load_s

    async def load_adapter(self, adapter: Any) -> None:
        """The actor's engine loads the LoRA adapter (already in its dtype)."""
        await self.ready()
        self.last_load_s = await self.actor.load_adapter.remote(adapter)
        self._weights, self.needs_weights = "adapter", False

    async def weight_dtype_name(self) -> str:
        """The engine's weight dtype ("bfloat16"); a cheap call, so also a liveness check."""
        await self.ready()
        return await self.actor.weight_dtype.remote()

    async def receive_weights(
        self, address: str, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> dict[str, float]:
        """The actor joins the weight channel as `rank` and loads one sync; its report."""
        await self.ready()
        report = await self.actor.receive_weights.remote(
            address, rank, world_size, backend, timeout_s
        )
        self.last_load_s = report["seconds"]
        self._capacity = await self.actor.kv_capacity.remote()
        self._weights, self.needs_weights = "channel", False
        return report

    async def sleep(self, level: int = 1) -> None:
        await self.actor.sleep.remote(level)
        self.sleeping = True

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self.sleeping = not await self.actor.wake_up.remote(list(tags) if tags else None)
        self._capacity = await self.actor.kv_capacity.remote()

    async def close_channel(self) -> None:
        """The actor leaves its kept weight channel."""
        await self.actor.close_channel.remote()

    async def close(self) -> None:
        """Close the engine (a colocated one: only the engine, its rank's group kills the actor;
        an actor stuck in a collective is given `CLOSE_TIMEOUT_S`), then kill the actor."""
        import ray

        for task in (self._watching, self._reviving):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        close = self.actor.close.remote() if self.owns_actor else self.actor.close_engine.remote()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_awaited(close), CLOSE_TIMEOUT_S)
        if self.owns_actor:
            ray.kill(self.actor)


async def _awaited(ref: Any) -> Any:
    return await ref


def _driver_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()

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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rstar2_rollout.engine import EngineProgress, Generation, KVCapacity, SamplingParams

CLOSE_TIMEOUT_S = 10.0


class WeightPublisher:
    """Puts a state dict in the object store once per version of the weights."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._ref: Any = None
        self.put_s = 0.0

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

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        from ray.exceptions import RayError

        ref = self.actor.generate.remote(list(prompt_ids), params, request_id)
        try:
            out, self._capacity, progress = await ref
        except asyncio.CancelledError:
            import ray

            ray.cancel(ref)
            raise
        except RayError as exc:
            reason = f"engine actor {self.name} failed: {type(exc).__name__}: {exc}"
            return Generation([], finish_reason="error", error=reason.splitlines()[0])
        if progress is not None and (
            self._progress is None or progress.step >= self._progress.step
        ):
            self._progress = progress  # answers may arrive out of order: keep the newest
        return out

    def kv_capacity(self) -> KVCapacity | None:
        return self._capacity

    def progress(self) -> EngineProgress | None:
        """The progress report of the engine's last answer: old, and so safe (`ProgressEngine`)."""
        return self._progress

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self.load_weights_ref(self._publisher.publish(named_tensors))

    async def load_weights_ref(self, ref: Any) -> float:
        """Load weights already in the object store (a list of (name, tensor)); seconds."""
        self.last_load_s = await self.actor.update_weights.remote(ref)
        self._capacity = await self.actor.kv_capacity.remote()
        return self.last_load_s

    async def load_adapter(self, adapter: Any) -> None:
        """The actor's engine loads the LoRA adapter (already in its dtype)."""
        self.last_load_s = await self.actor.load_adapter.remote(adapter)

    async def weight_dtype_name(self) -> str:
        """The engine's weight dtype ("bfloat16"); a cheap call, so also a liveness check."""
        return await self.actor.weight_dtype.remote()

    async def receive_weights(
        self, address: str, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> dict[str, float]:
        """The actor joins the weight channel as `rank` and loads one sync; its report."""
        report = await self.actor.receive_weights.remote(
            address, rank, world_size, backend, timeout_s
        )
        self.last_load_s = report["seconds"]
        self._capacity = await self.actor.kv_capacity.remote()
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

        close = self.actor.close.remote() if self.owns_actor else self.actor.close_engine.remote()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_awaited(close), CLOSE_TIMEOUT_S)
        if self.owns_actor:
            ray.kill(self.actor)


async def _awaited(ref: Any) -> Any:
    return await ref

"""Where the weights move: one `WeightMover` per placement, the only owner of a weight sync.

The loop never chooses a transport. It asks the placement's mover (`Parts.mover`) for two
things and hands it what the policy exposes (`Policy.weights()`: the driver's `(name, tensor)`
pairs, or the `TrainGroup` of the FSDP2 ranks that hold them sharded):

    mover.sleep()           before anything that trains or runs collectives on the training
                            state (SFT, an update, a checkpoint save or restore, the export):
                            the engines free their accelerator memory and, colocated, the
                            training state comes back to the devices. Idempotent.
    mover.push(weights)     after the weights changed: the new weights into every live engine,
                            which are then awake; colocated, the training state goes back to
                            host memory around it. `needs_push` of a sleep's report says
                            whether the engines need one before they roll out again.
    mover.close()           at the end (a kept channel is closed)

Each returns one `SyncReport` (the only report of a sync), whose `as_metrics()` the loop logs.

| placement | mover | sleep | push |
|---|---|---|---|
| local engines in this process; or Ray engine actors with the driver training | `TensorMover` | engines that can sleep | `push_weights` per engine: streamed in the engine's dtype into in-process vLLM, one object-store copy to engine actors |
| split: FSDP2 ranks and engine actors on other devices | `channel.ChannelMover` | engines that can sleep | every rank gathers, rank 0 broadcasts over a weight channel kept from sync to sync |
| colocated: a rank and its engine in each actor | `ColocatedMover` | engines sleep, state onloaded | optimizer state offloaded, engines' weights woken, each rank gathers into its own engine, parameters offloaded, KV cache woken |
| remote rollout services | `RemoteMover` | nothing | safetensors pieces over rollout.v1 |

`Engines` (engines.py) keeps which engines are alive; a dropped engine is left out of every
later sleep and push. In colocated placement an engine lives in a training rank's process, so
a dropped engine stops the run with `RankError` naming the rank (the ranks cannot step without
it), instead of a collective waiting for NCCL's timeout.

Streaming into engines (`push_weights`, `stream_weights`): engines with the `StreamingEngine`
capability (vLLM) get the weights in buckets of at most `bucket_bytes` (None: the smallest
`weight_bucket_bytes` of the engines, 1 GiB by default; a larger single tensor travels alone),
each tensor cast to the engine's dtype as it is read (`rstar2_rollout.buckets.iter_buckets`):
a bf16 engine never sees fp32, and an engine in this process reads one cast tensor at a time.
All engines of one dtype load the same bucket at once. `bytes_moved` counts each bucket once:
for one engine it is the model's size in the engine's dtype. Engines without the capability
(transformers, HTTP, Ray engine actors) get `update_weights(all tensors)`. A sleeping engine is
woken in vLLM's RL order: weights, the load, then the KV cache.

Measured on CPU (`bench/weight_sync.py`, `bench/gpu_order.py`); the colocated hand-over is a
tensor passed inside one process (no CUDA IPC handle: no IPC code exists); not run on a GPU
with vLLM. Not covered: partial syncs (every tensor is sent).

A LoRA policy that syncs adapters (`model.lora.sync: adapter`) pushes an `rstar2_rollout.Adapter`
instead (the driver's `Policy.weights()`, or the ranks' `TrainGroup.adapter_sync`): every mover
sends only it, cast to each engine's dtype, and each engine (`AdapterEngine`: vLLM with LoRA
enabled, transformers through PEFT) makes it its current adapter (`push_adapter`);
`bytes_moved` is the adapter's size in the engine's dtype, in one bucket. With
`model.lora.sync: merged` a push is a full one: the driver's `Policy.weights()` and the ranks'
stream (`gather.FullTensors`) are the base's tensors with the adapter merged, under its names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rstar2_rollout.adapter import Adapter
from rstar2_rollout.buckets import DEFAULT_BUCKET_BYTES, iter_buckets
from rstar2_rollout.engine import Engine, SleepingEngine, StreamingEngine
from rstar2_trainer.placement.engines import EngineError, Engines
from rstar2_trainer.training.train_workers import RankError, TrainGroup


@dataclass
class SyncReport:
    """One `sleep` or `push` of a mover: what it moved and how long each part took."""

    call: Literal["sleep", "push"] = "push"
    total_s: float = 0.0
    bytes_moved: int = 0  # push: per engine, in the engine's dtype (the model once)
    buckets: int = 0  # push: buckets an engine loaded
    gathered_bytes: int = 0  # push from ranks: all-gathered, engine dtype, each parameter once
    load_s: float = 0.0  # push: gathering, casting and loading, slowest engine
    wake_s: float = 0.0  # push: waking weights and KV cache around the load
    connect_s: float | None = None  # push over a weight channel: building its group (0: kept)
    asleep: int = 0  # sleep: engines this call put to sleep
    state_bytes: float | None = None  # training state moved (sleep: on, push: off); None: none
    state_s: float = 0.0
    needs_push: bool = False  # sleep: the engines need a push before they roll out again

    def as_metrics(self) -> dict[str, float]:
        """The step's metrics: a push's `time_sync_s`, `sync_bytes`, ..., a sleep's onload."""
        if self.call == "sleep":
            if self.state_bytes is None:
                return {}
            return {"time_onload_s": self.state_s, "onload_bytes": self.state_bytes}
        out = {
            "time_sync_s": self.total_s,
            "time_sync_load_s": self.load_s,
            "time_wake_s": self.wake_s,
            "sync_bytes": float(self.bytes_moved),
            "sync_buckets": float(self.buckets),
        }
        if self.gathered_bytes:
            out["sync_gathered_bytes"] = float(self.gathered_bytes)
        if self.state_bytes is not None:
            out.update(time_offload_s=self.state_s, offload_bytes=self.state_bytes)
        if self.connect_s is not None:
            out["time_sync_connect_s"] = self.connect_s
        return out


class WeightMover(Protocol):
    """What every placement gives the loop to move weights (see the module docstring)."""

    engines: Engines

    async def sleep(self) -> SyncReport: ...

    async def push(self, weights: Any) -> SyncReport: ...

    async def close(self) -> None: ...


def _inner(engine: Any) -> Any:
    return getattr(engine, "inner", engine)  # an EngineMeter wraps the engine


def _alive(engine: Any) -> bool:
    return bool(getattr(_inner(engine), "alive", True))


async def stream_weights(
    engines: Sequence[StreamingEngine],
    named_tensors: Iterable[tuple[str, Any]],
    bucket_bytes: int | None = None,
) -> SyncReport:
    """Stream `named_tensors` into `engines` bucket by bucket, in each engine's dtype."""
    start = time.perf_counter()
    if bucket_bytes is None:
        bucket_bytes = min((e.weight_bucket_bytes for e in engines), default=DEFAULT_BUCKET_BYTES)
    by_dtype: dict[Any, list[StreamingEngine]] = {}
    for engine in engines:
        by_dtype.setdefault(engine.weight_dtype, []).append(engine)
    if len(by_dtype) > 1:
        named_tensors = list(named_tensors)  # read once per dtype (references, not copies)
    moved = count = 0
    for dtype, group in by_dtype.items():
        await asyncio.gather(*(e.begin_weights() for e in group))
        try:
            for bucket in iter_buckets(named_tensors, dtype, bucket_bytes):
                await asyncio.gather(*(e.load_weights(bucket) for e in group))
                moved, count = moved + bucket.nbytes, count + 1
        finally:
            await asyncio.gather(*(e.finish_weights() for e in group), return_exceptions=True)
    seconds = time.perf_counter() - start
    return SyncReport(total_s=seconds, load_s=seconds, bytes_moved=moved, buckets=count)


async def push_weights(
    engines: Sequence[Engine],
    named_tensors: Iterable[tuple[str, Any]],
    bucket_bytes: int | None = None,
) -> SyncReport:
    """Load `named_tensors` into every live engine (waking sleeping ones around it)."""
    start = time.perf_counter()
    live = [_inner(e) for e in engines if _alive(e)]
    streaming = [e for e in live if isinstance(e, StreamingEngine)]
    whole = [e for e in live if not isinstance(e, StreamingEngine)]
    if whole:
        named_tensors = list(named_tensors)  # read more than once (references, not copies)
    asleep = [
        e
        for e in live
        if isinstance(e, SleepingEngine) and e.can_sleep and getattr(e, "sleeping", False)
    ]
    wake = time.perf_counter()
    await asyncio.gather(*(e.wake_up(["weights"]) for e in asleep))
    wake_s = time.perf_counter() - wake
    load = time.perf_counter()
    report = SyncReport()
    if streaming:
        report = await stream_weights(streaming, named_tensors, bucket_bytes)
    await asyncio.gather(*(e.update_weights(named_tensors) for e in whole))
    report.load_s = time.perf_counter() - load
    wake = time.perf_counter()
    await asyncio.gather(*(e.wake_up(["kv_cache"]) for e in asleep))
    report.wake_s = wake_s + time.perf_counter() - wake
    report.total_s = time.perf_counter() - start
    return report


async def adapter_dtype(engine: Any) -> Any:
    """The dtype `engine` computes its adapters in (an engine actor is asked)."""
    import torch

    if hasattr(engine, "weight_dtype_name"):  # a Ray engine actor's face
        return getattr(torch, await engine.weight_dtype_name())
    dtype = getattr(engine, "adapter_dtype", None)
    if dtype is None:
        raise TypeError(
            f"engine {engine.name} cannot load LoRA adapters; set model.lora.sync: merged"
        )
    return dtype


def cast_adapter(adapter: Adapter, dtype: Any) -> Adapter:
    return Adapter([(n, t.to(dtype)) for n, t in adapter.tensors], adapter.config)


async def push_adapter(engines: Sequence[Engine], adapter: Adapter) -> SyncReport:
    """`adapter` into every live engine, in its dtype (waking sleeping ones around it)."""
    start = time.perf_counter()
    live = [_inner(e) for e in engines if _alive(e)]
    asleep = [
        e
        for e in live
        if isinstance(e, SleepingEngine) and e.can_sleep and getattr(e, "sleeping", False)
    ]
    await asyncio.gather(*(e.wake_up(["weights"]) for e in asleep))
    wake_s = time.perf_counter() - start
    load = time.perf_counter()
    report = SyncReport()
    for engine in live:
        cast = cast_adapter(adapter, await adapter_dtype(engine))
        await engine.load_adapter(cast)  # type: ignore[attr-defined]
        report.bytes_moved, report.buckets = cast.nbytes, 1
    report.load_s = time.perf_counter() - load
    wake = time.perf_counter()
    await asyncio.gather(*(e.wake_up(["kv_cache"]) for e in asleep))
    report.wake_s = wake_s + time.perf_counter() - wake
    report.total_s = time.perf_counter() - start
    return report


def _tensors(weights: Any) -> list[tuple[str, Any]]:
    if isinstance(weights, TrainGroup):
        raise TypeError("this placement pushes the driver's tensors, not a rank group")
    return list(weights)  # references: every engine reads the same tensors


class TensorMover:
    """The driver's weights (this process) into local engines or engine actors."""

    def __init__(self, engines: Engines, *, bucket_bytes: int | None = None) -> None:
        self.engines = engines
        self.bucket_bytes = bucket_bytes  # None: each engine's own weight_bucket_bytes

    async def sleep(self) -> SyncReport:
        start = time.perf_counter()
        slept = await self.engines.sleep()
        return SyncReport("sleep", total_s=time.perf_counter() - start, asleep=slept,
                          needs_push=slept > 0)  # fmt: skip

    async def push(self, weights: Any) -> SyncReport:
        start = time.perf_counter()
        if isinstance(weights, Adapter):  # a LoRA policy's adapter
            parts = await self.engines.each(
                self.engines.alive, lambda e: push_adapter([e], weights)
            )
        else:
            items = _tensors(weights)
            parts = await self.engines.each(
                self.engines.alive, lambda e: push_weights([e], items, self.bucket_bytes)
            )
        report = SyncReport(total_s=time.perf_counter() - start)
        if parts:
            report.bytes_moved, report.buckets = parts[0].bytes_moved, parts[0].buckets
            report.wake_s = max(p.wake_s for p in parts)
            report.load_s = max(p.load_s for p in parts)
        return report

    async def close(self) -> None:
        pass


class RemoteMover:
    """The driver's weights to remote rollout services (`remote.RemoteServices`)."""

    def __init__(self, engines: Engines, services: Any) -> None:
        self.engines = engines  # none: the services hold their engines
        self.services = services

    async def sleep(self) -> SyncReport:
        return SyncReport("sleep")

    async def push(self, weights: Any) -> SyncReport:
        if isinstance(weights, Adapter):
            raise TypeError("rollout services take full weights: set model.lora.sync: merged")
        seconds = await self.services.push_weights(_tensors(weights))
        return SyncReport(total_s=seconds, load_s=seconds)

    async def close(self) -> None:
        pass


class ColocatedMover:
    """Each rank's weights into the engine in its own process (`colocated.ColocatedGroup`).

    The order keeps the training state and the engine from both being whole on the device:
    sleep (engines free their memory), onload; after the update, offload the optimizer state,
    wake the engines' weights, each rank gathers and loads into its engine, offload the
    parameters, wake the KV cache. `offload` False keeps the state on the devices. The ranks'
    part of a sleep or a push that has not ended after `timeout_s` (`cluster.sync_timeout_s`: a
    rank stopped answering without Ray seeing its process die) stops the run with `RankError`."""

    def __init__(
        self,
        engines: Engines,
        ranks: TrainGroup,
        *,
        offload: bool,
        bucket_bytes: int,
        timeout_s: float = 300.0,
    ) -> None:
        self.engines = engines
        self.ranks = ranks
        self.offload = offload
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s

    async def _on_ranks(self, what: str, call: Any) -> Any:
        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except TimeoutError:
            raise RankError(
                f"the training ranks did not finish the {what} in {self.timeout_s:.0f} s "
                "(cluster.sync_timeout_s): a rank stopped answering"
            ) from None

    def _check_ranks(self) -> None:
        """A dropped engine took its rank's process with it: stop with the rank's name."""
        for rank, engine in enumerate(self.engines):
            if engine.name in self.engines.dropped:
                label = self.ranks.labels[rank] if rank < len(self.ranks.labels) else engine.name
                raise RankError(
                    f"training {label} is gone (its colocated engine {engine.name} died)"
                )

    async def _on_engines(self, call: Any) -> Any:
        """An `Engines` call; a rank whose engine it dropped stops the run (`RankError`, also
        when every engine is gone)."""
        try:
            result = await call
        except EngineError:
            self._check_ranks()
            raise
        self._check_ranks()
        return result

    async def sleep(self) -> SyncReport:
        start = time.perf_counter()
        slept = await self._on_engines(self.engines.sleep())
        report = SyncReport("sleep", asleep=slept, needs_push=True)
        if self.offload:
            moved = await self._on_ranks("onload", self.ranks.onload())
            report.state_bytes, report.state_s = moved["bytes"], moved["seconds"]
        report.total_s = time.perf_counter() - start
        return report

    async def push(self, weights: Any) -> SyncReport:
        if weights is not self.ranks:
            raise TypeError("a colocated push reads the weights of the placement's own ranks")
        start = time.perf_counter()
        report = SyncReport(state_bytes=0.0 if self.offload else None)
        if self.offload:  # the AdamW moments leave before the engine's weights come back
            moved = await self._on_ranks("offload", self.ranks.offload("optimizer"))
            report.state_bytes, report.state_s = moved["bytes"], moved["seconds"]
        report.wake_s = await self._on_engines(self.engines.wake(["weights"]))
        if len(self.engines):
            push = (
                self.ranks.push_adapter()  # type: ignore[attr-defined]
                if self.ranks.adapter_sync
                else self.ranks.push(self.bucket_bytes)  # type: ignore[attr-defined]
            )
            pushed = await self._on_ranks("push", push)
            report.bytes_moved, report.buckets = int(pushed["bytes_moved"]), int(pushed["buckets"])
            report.gathered_bytes = int(pushed["gathered_bytes"])
            report.load_s = pushed["seconds"]
        if self.offload:
            moved = await self._on_ranks("offload", self.ranks.offload("parameters"))
            report.state_bytes = (report.state_bytes or 0.0) + moved["bytes"]
            report.state_s += moved["seconds"]
        report.wake_s += await self._on_engines(self.engines.wake(["kv_cache"]))
        report.total_s = time.perf_counter() - start
        return report

    async def close(self) -> None:
        pass

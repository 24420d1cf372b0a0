"""Split placement's weight mover: the ranks' weights to engine actors over a weight channel.

`ChannelMover(engines, ranks, bucket_bytes=, timeout_s=)` is the `WeightMover` when FSDP2 ranks
(`train_workers.TrainGroup`) and engine actors (`EngineActor` behind `RayEngine`) hold devices
of their own. A push:

    check       every live engine answers (its weight dtype: a cheap call); a dead one is
                dropped before any collective waits for it
    channel     rank 0's store and one collective group (gloo between CPU processes, NCCL
                between GPUs) that the live engine actors join as ranks 1..E
                (`rstar2_rollout.weight_channel`). Built at the first push and KEPT: later
                pushes reuse it (slime builds its group once). It is rebuilt only when the
                engines it was built for changed (one was dropped, or its actor was started
                again: ray_engine.py) or a push over it failed.
    send        every rank gathers each tensor cast to the engines' dtype (`gather.FullTensors`),
                rank 0 broadcasts `bucket_bytes` buckets, each engine actor loads them
                (`receive_weights`); the engines' weights are woken before, their KV cache after
    retry       an engine lost during the send is dropped and the push is made again, once, for
                the survivors over a fresh channel (the failed one left them with a partial
                update); any other failure closes the channel and raises `EngineError`

The channel's set-up and collectives give up after `timeout_s` (`cluster.sync_timeout_s`, 300 s
by default). With turns in flight (partial rollouts) each engine actor finishes its running turns
on the old weights and holds new ones until its load ends; that wait counts against `timeout_s`.
`bytes_moved` is the model once in the engines' dtype; `connect_s` the group's build time (0 when
it was kept). `opened` counts the channels built.

Tested on real Ray actors (tests/test_split_sync.py): the channel kept across pushes, an engine
killed before a push (dropped at the check, the channel rebuilt for the survivor), and one killed
after the channel was opened for it (the send fails, the survivor is pushed again), all on gloo.
Not covered: NCCL (not run on a GPU). Read in torch 2.13 (`ProcessGroupNCCL.hpp`): with its
default `TORCH_NCCL_ASYNC_ERROR_HANDLING` (3) a timed-out or failed NCCL collective tears down
the process, so on GPUs an engine that dies mid-send ends rank 0 rather than being dropped, and
the run restarts from its newest checkpoint (`run.max_restarts`) instead of going on.

A LoRA policy that syncs adapters (`TrainGroup.adapter_sync`) uses no channel: every rank
gathers the adapter in the engines' dtype, rank 0's copy comes to the driver (megabytes) and
each live engine actor loads it (`weights.push_adapter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from rstar2_trainer.placement.engines import EngineError, Engines, is_lost
from rstar2_trainer.placement.weights import SyncReport, push_adapter
from rstar2_trainer.training.train_workers import TrainGroup


def _inner(engine: Any) -> Any:
    return getattr(engine, "inner", engine)  # an EngineMeter wraps the engine


@dataclass
class _Channel:
    """An open weight channel: its address, backend, and the engines it was built for."""

    address: str
    backend: str
    members: list[str]


class ChannelMover:
    """Rank 0 of `ranks` broadcasts the weights to every live engine actor (module docstring)."""

    def __init__(
        self, engines: Engines, ranks: TrainGroup, *, bucket_bytes: int, timeout_s: float
    ) -> None:
        self.engines = engines
        self.ranks = ranks
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.opened = 0  # channels built so far
        self._channel: _Channel | None = None

    async def sleep(self) -> SyncReport:
        start = time.perf_counter()
        slept = await self.engines.sleep()
        return SyncReport("sleep", total_s=time.perf_counter() - start, asleep=slept,
                          needs_push=slept > 0)  # fmt: skip

    async def push(self, weights: Any) -> SyncReport:
        if weights is not self.ranks:
            raise TypeError("a channel push reads the weights of the placement's own ranks")
        start = time.perf_counter()
        if not len(self.engines):
            return SyncReport()
        dtypes = await self.engines.each(
            self.engines.alive, lambda e: _inner(e).weight_dtype_name()
        )
        if self.ranks.adapter_sync:
            adapter = await self.ranks.adapter(dtypes[0])
            parts = await self.engines.each(
                self.engines.alive, lambda e: push_adapter([e], adapter)
            )
            report = parts[0] if parts else SyncReport()
            report.total_s = time.perf_counter() - start
            return report
        wake_s = await self.engines.wake(["weights"])
        sent, failed = await self._send(dtypes[0])
        if failed is not None and failed[1]:  # an engine died mid-sync: again, the survivors
            sent, failed = await self._send(dtypes[0])
        if failed is not None:
            await self._close()
            raise EngineError(f"weight sync over the channel failed: {failed[0]}")
        wake_s += await self.engines.wake(["kv_cache"])
        return SyncReport(
            total_s=time.perf_counter() - start,
            bytes_moved=int(sent["bytes_moved"]),
            buckets=int(sent["buckets"]),
            gathered_bytes=int(sent.get("gathered_bytes", 0)),
            load_s=float(sent["seconds"]),
            wake_s=wake_s,
            connect_s=float(sent["connect_s"]),
        )

    async def _open(self, targets: list[Any]) -> _Channel:
        """The kept channel when it serves exactly `targets`, else a new one."""
        names = [f"{e.name}.{getattr(_inner(e), 'incarnation', 0)}" for e in targets]
        if self._channel is not None and self._channel.members == names:
            return self._channel
        await self._close()
        opened = await self.ranks.open_channel(len(targets), self.timeout_s)
        self._channel = _Channel(opened["address"], opened["backend"], names)
        self.opened += 1
        return self._channel

    async def _send(self, dtype: str) -> tuple[dict[str, Any], tuple[str, bool] | None]:
        """One sync over the channel: rank 0's report, and (why, engines were lost) on failure
        (the channel is then closed)."""
        targets = self.engines.alive
        channel = await self._open(targets)
        world = len(targets) + 1
        send = asyncio.ensure_future(self.ranks.send_weights(dtype, self.bucket_bytes))
        receives = [
            _inner(e).receive_weights(channel.address, rank, world, channel.backend, self.timeout_s)
            for rank, e in enumerate(targets, start=1)
        ]
        results = await asyncio.gather(*receives, return_exceptions=True)
        sent = await send
        lost = failed = 0
        why = sent.get("error", "")
        for engine, result in zip(targets, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            if is_lost(result):
                self.engines.drop(engine, result)
                lost += 1
            else:
                failed += 1
                why = why or f"{engine.name}: {type(result).__name__}: {result}".splitlines()[0]
        self.engines.check_left()
        if lost or failed or "error" in sent:
            await self._close()
            return sent, (why or f"{lost} engine(s) lost", lost > 0)
        return sent, None

    async def _close(self) -> None:
        """Close the kept channel on rank 0 and on every live engine actor."""
        if self._channel is None:
            return
        self._channel = None
        with contextlib.suppress(Exception):  # a lost rank 0 holds no channel any more
            await self.ranks.close_channel()
        await asyncio.gather(
            *(_inner(e).close_channel() for e in self.engines.alive), return_exceptions=True
        )

    async def close(self) -> None:
        await self._close()

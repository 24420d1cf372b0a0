"""Weights from a trainer process to engine processes over a standalone collective group.

For split placement (training ranks and engines in different processes, on different devices):
one sender (rank 0 of training) and N receivers (one per engine process) form their own torch
process group from a TCPStore address: gloo on CPU, NCCL on GPUs. The group is built from the
backend's own class (`ProcessGroupGloo` / `ProcessGroupNCCL`) on a `PrefixStore`, so it never
touches, needs or initialises the default process group (the FSDP one): it works in a process
with or without `torch.distributed.init_process_group`.

API
- Sender (rank 0): `sender = WeightSender(receivers=N, host="127.0.0.1", port=0)` starts the
  store and knows its `sender.address` ("host:port") at once; hand that address to the engine
  processes, then `sender.connect()` (blocks until all N receivers have joined).
  `sender.send(named_tensors, dtype, bucket_bytes)` streams the tensors in buckets (one flat
  buffer of at most `bucket_bytes` in `dtype` a bucket, each tensor cast into it lazily; a larger
  tensor travels alone) and returns a `ChannelReport` (bytes, buckets, seconds). Call it once per
  sync; `close()` at the end.
- Receiver (engine process, rank 1..N): `receiver = WeightReceiver(address, rank, world_size)`,
  `receiver.connect()`, then per sync either `await receiver.receive_into(engine)` (a
  `StreamingEngine`: `begin_weights`, `load_weights(bucket)` for each bucket, `finish_weights`;
  returns the same `ChannelReport`) or iterate `receiver.receive()` (lists of `(name, tensor)`,
  views into the bucket's buffer, valid until the next bucket arrives).
- Every call to `send` must be matched by one `receive_into` / full `receive()` on every
  receiver. Each bucket is three broadcasts: its sizes, its header (names, shapes, dtype) and
  its flat buffer; an empty header ends the sync. The header is JSON (no pickle).
- Memory: the sender holds one bucket beside the weights it reads (plus the cast of one tensor
  when `device` differs); a receiver holds the bucket it is loading.

Tested with gloo and real processes (equal tensors after the cast). NCCL (`backend="nccl"`,
`device="cuda:K"`) is written to the same API but was not run on a GPU.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rstar2_rollout.buckets import DEFAULT_BUCKET_BYTES, tensor_bytes

_GROUP = "rstar2-weights"


@dataclass(frozen=True)
class ChannelReport:
    """One sync over the channel: bytes of the buckets (each once), buckets, seconds."""

    bytes_moved: int
    buckets: int
    seconds: float


def _dist() -> Any:
    import torch.distributed

    return torch.distributed  # typed Any: pyright sees TCPStore and PrefixStore as private


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"weight channel address must be host:port, not {address!r}")
    return host, int(port)


def _group(store: Any, rank: int, size: int, backend: str, timeout_s: float) -> Any:
    dist = _dist()

    prefixed = dist.PrefixStore(_GROUP, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    raise ValueError(f"weight channel backend must be gloo or nccl, not {backend!r}")


class _Member:
    """A member of the channel's group: broadcasts from rank 0."""

    def __init__(self, backend: str, device: str, timeout_s: float) -> None:
        self.backend = backend
        self.device = device
        self.timeout_s = timeout_s
        self._pg: Any = None

    def _broadcast(self, tensor: Any) -> None:
        dist = _dist()

        if self._pg is None:
            raise RuntimeError("weight channel: connect() first")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        self._pg.broadcast([tensor], options).wait()

    def close(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None and self.backend == "nccl":
            pg.shutdown()


class WeightSender(_Member):
    """Rank 0: the store's host and the source of every broadcast."""

    def __init__(
        self,
        receivers: int,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: str = "gloo",
        device: str = "cpu",
        timeout_s: float = 600.0,
    ) -> None:
        dist = _dist()

        if receivers < 1:
            raise ValueError(f"weight channel needs at least one receiver, not {receivers}")
        super().__init__(backend, device, timeout_s)
        self.world_size = receivers + 1
        self._store = dist.TCPStore(
            host,
            port,
            self.world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self.address = f"{host}:{self._store.port}"

    def connect(self) -> None:
        """Build the group (blocks until every receiver has called `connect`)."""
        self._pg = _group(self._store, 0, self.world_size, self.backend, self.timeout_s)

    def send(
        self,
        named_tensors: Iterable[tuple[str, Any]],
        dtype: Any,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> ChannelReport:
        """Broadcast every tensor, cast to `dtype`, in buckets of at most `bucket_bytes`."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
        start = time.perf_counter()
        moved = count = 0
        group: list[tuple[str, Any]] = []
        size = 0
        for name, tensor in named_tensors:
            nbytes = tensor_bytes(tensor, dtype)
            if group and size + nbytes > bucket_bytes:
                self._send_bucket(group, dtype, size)
                moved, count = moved + size, count + 1
                group, size = [], 0
            group.append((name, tensor))
            size += nbytes
        if group:
            self._send_bucket(group, dtype, size)
            moved, count = moved + size, count + 1
        self._send_sizes(0, 0)  # the end of this sync
        return ChannelReport(moved, count, time.perf_counter() - start)

    def _send_sizes(self, header_bytes: int, flat_bytes: int) -> None:
        import torch

        sizes = torch.tensor([header_bytes, flat_bytes], dtype=torch.int64, device=self.device)
        self._broadcast(sizes)

    def _send_bucket(self, group: list[tuple[str, Any]], dtype: Any, size: int) -> None:
        import torch

        header = [[name, list(t.shape)] for name, t in group]
        raw = json.dumps([str(dtype).removeprefix("torch."), header]).encode()
        flat = torch.empty(size // dtype.itemsize, dtype=dtype, device=self.device)  # [elements]
        offset = 0
        for _, tensor in group:
            n = tensor.numel()
            flat[offset : offset + n].view(tensor.shape).copy_(tensor.detach())  # casts
            offset += n
        self._send_sizes(len(raw), size)
        self._broadcast(torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(self.device))
        self._broadcast(flat.view(torch.uint8))


class WeightReceiver(_Member):
    """Rank 1..N: one engine process; receives the buckets rank 0 broadcasts."""

    def __init__(
        self,
        address: str,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        device: str = "cpu",
        timeout_s: float = 600.0,
    ) -> None:
        dist = _dist()

        if not 0 < rank < world_size:
            raise ValueError(f"receiver rank must be in 1..{world_size - 1}, not {rank}")
        super().__init__(backend, device, timeout_s)
        self.rank = rank
        self.world_size = world_size
        host, port = _split(address)
        self._store = dist.TCPStore(
            host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
        )

    def connect(self) -> None:
        """Join the group (blocks until the sender and every other receiver have joined)."""
        self._pg = _group(self._store, self.rank, self.world_size, self.backend, self.timeout_s)

    def receive(self) -> Iterator[list[tuple[str, Any]]]:
        """The buckets of one sync, in order: `(name, tensor)` views into the bucket's buffer."""
        while (bucket := self._receive_bucket()) is not None:
            yield bucket

    async def receive_into(self, engine: Any) -> ChannelReport:
        """Load one sync into a `StreamingEngine` bucket by bucket; what arrived."""
        start = time.perf_counter()
        moved = count = 0
        await engine.begin_weights()
        try:
            while (bucket := await asyncio.to_thread(self._receive_bucket)) is not None:
                await engine.load_weights(bucket)
                moved += sum(t.numel() * t.element_size() for _, t in bucket)
                count += 1
                del bucket
        finally:
            await engine.finish_weights()
        return ChannelReport(moved, count, time.perf_counter() - start)

    def _receive_bucket(self) -> list[tuple[str, Any]] | None:
        import torch

        sizes = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._broadcast(sizes)
        header_bytes, flat_bytes = (int(v) for v in sizes)
        if header_bytes == 0:
            return None
        raw = torch.empty(header_bytes, dtype=torch.uint8, device=self.device)
        self._broadcast(raw)
        dtype_name, header = json.loads(raw.cpu().numpy().tobytes())
        flat = torch.empty(flat_bytes, dtype=torch.uint8, device=self.device)
        self._broadcast(flat)
        values = flat.view(getattr(torch, dtype_name))  # [elements]
        bucket = []
        offset = 0
        for name, shape in header:
            n = 1
            for d in shape:
                n *= d
            bucket.append((name, values[offset : offset + n].view(shape)))
            offset += n
        return bucket

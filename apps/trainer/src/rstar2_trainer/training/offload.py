"""A rank's training state in host memory and back, and the rule every collective checks.

A colocated rank keeps its training state (parameters, AdamW moments) in host memory while its
engine rolls out, and must bring it back before any collective: NCCL runs collectives only on
device tensors, so an all-gather, a DCP save or an export of a host-resident shard fails on a
GPU (gloo on CPU would hide it).

Contract
- `Residency(device)` tracks one rank's state. `offload(model, optimizer, part)` moves
  "optimizer" (every AdamW state tensor) or "parameters" (the local shards, their gradients if
  any, and the buffers) to host memory; `onload(model, optimizer)` brings both back. Each
  returns `{"bytes", "seconds"}`: the bytes that changed place (optimizer state; parameters and
  gradients; buffers are not counted) and the wall time, synchronised. Moving to the host
  empties the CUDA caching allocator afterwards, so the freed memory is the engine's to take.
- The copies are real on every rank: on a CPU rank (tests, the bench without a GPU) host and
  device are both the CPU, and each move still makes a copy into new storage, so the bytes
  counted are what a GPU rank moves and the rule below can tell the two places apart.
- `require(model, optimizer, op)` raises `ResidencyError` (one line: the operation, the tensor,
  what to do) when a parameter, or with `optimizer=True` an optimizer state tensor, is not on
  the rank's device or is one of the host copies the last offload made. Every collective of a
  rank calls it first (`train_workers.TrainWorker`).
- Idempotent: offloading what is already in host memory, or onloading what is on the device,
  moves and counts nothing. Exact: the values that come back are the values that left.
- `move_train_state(model, optimizer, device)` moves everything to `device` at once (no copy
  when already there): the memory probe's measurement of the round trip.

Measured on one H200 by scripts/gpu_check.sh (docs/RESULTS.md) for `move_train_state`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

Part = Literal["optimizer", "parameters"]
PARTS: tuple[Part, ...] = ("optimizer", "parameters")


class ResidencyError(RuntimeError):
    """A collective was asked to run on training state that lives in host memory."""


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t  # an FSDP2 DTensor's shard


def _ptr(t: torch.Tensor) -> int:
    return _local(t).untyped_storage().data_ptr()


def _optimizer_tensors(optimizer: Any) -> Iterator[tuple[dict, str, torch.Tensor]]:
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                yield state, key, value


def _sync(target: torch.device) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # non_blocking copies: the byte counts are only now true
        if target.type == "cpu":
            torch.cuda.empty_cache()


def _move(
    model: Any, optimizer: Any, target: torch.device, parts: tuple[Part, ...], copy: bool
) -> tuple[int, list[torch.Tensor]]:
    """Move `parts` to `target` (a copy into new storage when `copy`); bytes and the new tensors."""
    moved = 0
    placed: list[torch.Tensor] = []

    def wanted(t: torch.Tensor) -> bool:
        return copy or _local(t).device != target

    def to(t: torch.Tensor) -> torch.Tensor:
        return t.to(target, non_blocking=True, copy=copy) if wanted(t) else t

    if "optimizer" in parts:
        for state, key, value in _optimizer_tensors(optimizer):
            if wanted(value):
                moved += _local(value).numel() * value.element_size()  # the shard's bytes
                state[key] = to(value)
                placed.append(state[key])
    if "parameters" in parts:
        params = list(model.parameters())
        for p in params:
            if wanted(p):
                local = _local(p)
                moved += local.numel() * local.element_size()
                if p.grad is not None:
                    moved += _local(p.grad).numel() * _local(p.grad).element_size()
        if any(wanted(p) for p in params):
            model._apply(to)  # FSDP2's _apply re-registers the sharded parameters after it
        placed += list(model.parameters())
    return moved, placed


class Residency:
    """Where one rank's training state lives, and the check its collectives make."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.host = torch.device("cpu")
        self.offloaded: set[Part] = set()
        self._host_storage: dict[Part, set[int]] = {p: set() for p in PARTS}

    def offload(self, model: Any, optimizer: Any, part: Part) -> dict[str, float]:
        """`part` to host memory, copied (see the module docstring); bytes and seconds."""
        start = time.perf_counter()
        if part in self.offloaded:
            return {"bytes": 0.0, "seconds": 0.0}
        moved, placed = _move(model, optimizer, self.host, (part,), copy=True)
        _sync(self.host)
        self.offloaded.add(part)
        self._host_storage[part] = {_ptr(t) for t in placed}
        return {"bytes": float(moved), "seconds": time.perf_counter() - start}

    def onload(self, model: Any, optimizer: Any) -> dict[str, float]:
        """Every offloaded part back on the device; bytes and seconds."""
        start = time.perf_counter()
        parts: tuple[Part, ...] = tuple(p for p in PARTS if p in self.offloaded)
        moved, _ = _move(model, optimizer, self.device, parts, copy=True) if parts else (0, [])
        _sync(self.device)
        self.offloaded.clear()
        self._host_storage = {p: set() for p in PARTS}
        return {"bytes": float(moved), "seconds": time.perf_counter() - start}

    def forget(self, part: Part) -> None:
        """`part` was replaced (a fresh optimizer): nothing of it is in host memory now."""
        self.offloaded.discard(part)
        self._host_storage[part] = set()

    def require(self, model: Any, optimizer: Any, op: str, *, optimizer_too: bool = True) -> None:
        """Raise `ResidencyError` unless the state `op` reads is on the device."""
        host = set().union(*self._host_storage.values())
        named: list[tuple[str, Callable[[], torch.Tensor]]] = [
            (n, lambda p=p: _local(p)) for n, p in model.named_parameters()
        ]
        if optimizer_too and optimizer is not None:
            named += [
                (f"optimizer {k}", lambda v=v: v) for _, k, v in _optimizer_tensors(optimizer)
            ]
        for name, get in named:
            tensor = get()
            if tensor.device != self.device or _ptr(tensor) in host:
                raise ResidencyError(
                    f"{op} needs the training state on {self.device}, but {name} is in host "
                    "memory (offloaded); the placement's mover onloads it before every collective"
                )


def move_train_state(model: Any, optimizer: Any, device: Any) -> dict[str, float]:
    """Parameters (their local shards), gradients and optimizer state to `device`; tensors
    already there are left alone and not counted."""
    start = time.perf_counter()
    target = torch.device(device)
    moved, _ = _move(model, optimizer, target, PARTS, copy=False)
    _sync(target)
    return {"bytes": float(moved), "seconds": time.perf_counter() - start}

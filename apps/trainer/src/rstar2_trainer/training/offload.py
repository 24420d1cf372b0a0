"""Training state to host memory and back: what a colocated rank does while its engine rolls out.

Contract
- `move_train_state(model, optimizer, device)` moves the model's parameters (under FSDP2 their
  local shards: `FSDPModule._apply` re-registers the sharded parameters after `model.to`), their
  gradients and every optimizer state tensor to `device`, and returns `{"bytes", "seconds"}`:
  the bytes that changed device and the wall time, synchronised. Moving to the CPU empties the
  CUDA caching allocator afterwards, so the freed memory is the engine's to take.
- Idempotent: tensors already on `device` are left alone and not counted.
- Exact: the values that come back are the values that left (a copy, no cast).

Measured on one H200 by scripts/gpu_check.sh (docs/RESULTS.md); on CPU it moves nothing.
"""

from __future__ import annotations

import time
from typing import Any


def move_train_state(model: Any, optimizer: Any, device: Any) -> dict[str, float]:
    """Move parameters (their local shards), gradients and optimizer state to `device`."""
    import torch

    start = time.perf_counter()
    target = torch.device(device)
    moved = 0

    def move(t: torch.Tensor) -> torch.Tensor:
        nonlocal moved
        if t.device == target:
            return t
        moved += t.numel() * t.element_size()
        return t.to(target, non_blocking=True)

    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.device != target:
            moved += local.numel() * local.element_size()
            if p.grad is not None:
                moved += p.grad.numel() * p.grad.element_size()
    if moved:  # non_blocking: device-to-host copies land in pinned memory, several in flight
        model.to(target, non_blocking=True)
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = move(value)
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # non_blocking copies: the numbers above are only now true
        if target.type == "cpu":
            torch.cuda.empty_cache()
    return {"bytes": float(moved), "seconds": time.perf_counter() - start}

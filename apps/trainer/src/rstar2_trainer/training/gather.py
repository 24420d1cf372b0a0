"""A rank's weights as full tensors in the engines' dtype, one parameter at a time.

Contract
- `FullTensors(model, dtype)` iterates `(name, full tensor in dtype)` in the model's
  `state_dict` order, every name the state dict holds. Under FSDP2 each parameter is a Shard(0)
  DTensor: its local shard is cast to `dtype` first and the cast shards are all-gathered
  (`DTensor.full_tensor`), so the bytes gathered are the engine-dtype size of the model, half
  the fp32 master weights' on a bf16 engine. Every rank must iterate the same stream at once
  (one all-gather per parameter, the same order on every rank).
- Tied parameters (one tensor under two names, a tied `lm_head`) are gathered once: the alias
  is yielded right after the first name with the same full tensor, so an engine that loads
  both names gets both without a second gather.
- Counts what it did: `gathered_bytes` (the full tensors' bytes, each parameter once),
  `tensors` (names yielded), `gathers` (parameters gathered or cast).
- At most one full tensor (and, in a world of one, its cast) exists beside the shards while a
  consumer holds the one yielded; the stream holds no reference to earlier ones.

- A LoRA model (PEFT's, `training/lora.py`) streams the merged weights instead, under the base
  model's own names (`lora.merged_tensors`): what an engine without LoRA loads
  (`model.lora.sync: merged`). Its `gathered_bytes` then counts the adapted weights in their
  own dtype and their A and B in fp32, the others in `dtype`.

Not covered: tensor-parallel shards (only FSDP2's data-parallel Shard(0)), quantised weights.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

from rstar2_trainer.training.lora import is_lora, merged_tensors


class FullTensors:
    """The model's weights as `(name, full tensor in dtype)`, gathered one parameter at a time."""

    def __init__(self, model: torch.nn.Module, dtype: str | torch.dtype) -> None:
        self.model = model
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.gathered_bytes = 0
        self.tensors = 0
        self.gathers = 0

    def _named(self) -> list[list[tuple[str, torch.Tensor]]]:
        """state_dict's names grouped by the tensor they name, in order of first appearance."""
        persistent = set(self.model.state_dict())
        by_tensor: dict[int, list[tuple[str, torch.Tensor]]] = {}
        named = [
            *self.model.named_parameters(remove_duplicate=False),
            *self.model.named_buffers(remove_duplicate=False),
        ]
        order = {name: i for i, name in enumerate(self.model.state_dict())}
        for name, tensor in sorted(named, key=lambda item: order.get(item[0], len(order))):
            if name in persistent:
                by_tensor.setdefault(id(tensor), []).append((name, tensor))
        return list(by_tensor.values())

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if any(is_lora(name) for name, _ in self.model.named_parameters()):
            yield from self._merged()
            return
        for names in self._named():
            value = names[0][1].detach()
            if isinstance(value, DTensor):
                cast: DTensor = value.to(self.dtype)  # type: ignore[assignment]
                full = cast.full_tensor()  # the shard cast first, then gathered
            else:
                full = value.to(self.dtype)
            self.gathers += 1
            self.gathered_bytes += full.numel() * full.element_size()
            for name, _ in names:
                self.tensors += 1
                yield name, full
            del full

    def _merged(self) -> Iterator[tuple[str, torch.Tensor]]:
        """A LoRA model's stream: the base's names, each adapted weight merged
        (`lora.merged_tensors`); the counts are what it gathered."""
        counts: dict[str, int] = {}
        for name, full in merged_tensors(self.model, self.dtype, counts):
            self.tensors += 1
            self.gathered_bytes, self.gathers = counts["gathered_bytes"], counts["gathers"]
            yield name, full

"""The training device and mixed precision of the single-process trainer (SFT and RL updates).

Contract
- `resolve_device("auto" | "cpu" | "cuda")`: auto is the first GPU when one is visible (CUDA, or
  ROCm, which torch also calls "cuda"), else the CPU; "cuda" without a GPU is an error that says
  what to set.
- `Precision(device, dtype)` is what the update loops take. bfloat16 is mixed precision: the
  parameters, their gradients and the AdamW state stay fp32 (the master weights), and
  `precision.autocast()` runs the forward pass (and so the backward of its ops) in bf16 on that
  device, on CPU as on GPU. Logprobs and losses are computed in fp32 from the bf16 logits
  (`batching.response_logprobs` upcasts before the softmax). float32 is plain fp32.
- `precision.batch(b)` moves a `TokenBatch` to the device.

FSDP2 training (`distributed.py`) has its own precision policy (`MixedPrecisionPolicy` with bf16
parameters and fp32 gradient reduction), configured from the same setting by
`distributed_config`. Not covered: fp16 (needs loss scaling), fp8.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rstar2_trainer.config import TrainSettings
from rstar2_trainer.training.batching import TokenBatch
from rstar2_trainer.training.distributed import DistributedConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(setting: Literal["auto", "cpu", "cuda"]) -> torch.device:
    """The torch device a `train.device` setting names on this machine."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is cuda but no GPU is visible; set train.device: auto")
    if setting == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


@dataclass(frozen=True)
class Precision:
    """Where the policy trains and in which compute dtype."""

    device: torch.device
    dtype: torch.dtype

    @classmethod
    def from_settings(cls, device: Literal["auto", "cpu", "cuda"], dtype: str) -> Precision:
        return cls(resolve_device(device), DTYPES[dtype])

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """bf16 autocast on the device for a bf16 precision; nothing for fp32."""
        if self.dtype == torch.float32:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def batch(self, batch: TokenBatch) -> TokenBatch:
        return TokenBatch(
            *(getattr(batch, f).to(self.device) for f in TokenBatch.__dataclass_fields__)
        )


FP32_CPU = Precision(torch.device("cpu"), torch.float32)  # the default: plain fp32 on the CPU


def distributed_config(settings: TrainSettings, **fields: Any) -> DistributedConfig:
    """The FSDP2 config for the same `train` settings: bf16 parameters, fp32 reduction."""
    return DistributedConfig(
        device=settings.device, param_dtype=settings.dtype, reduce_dtype="float32", **fields
    )

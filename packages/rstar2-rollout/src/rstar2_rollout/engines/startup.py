"""What a vLLM engine asks of its device when it starts: vLLM 0.32's rule and the share we pass.

vLLM's GPU worker (`vllm/v1/worker/gpu_worker.py`, `Worker.init_device`) brings up its process
groups, empties torch's cache, reads the device's free and total memory and calls
`vllm/v1/worker/utils.py`'s `request_memory`, which refuses to start when

    free < ceil(gpu_memory_utilization x total)

whatever `kv_cache_memory_bytes` says. With `kv_cache_memory_bytes` set (always, here) the share
sizes nothing else: the KV cache is that many bytes (`determine_available_memory` returns it
and skips the profile-based sizing). vLLM's default share is 0.92 (`vllm/config/cache.py`), so an
engine that shares its GPU with a training rank would be refused however small its own need.

Contract
- `requested_bytes(total, share)` is vLLM's arithmetic: ceil(total x share).
- `need_bytes(weights, kv, tensor_parallel_size)` is what the engine itself takes on one device:
  its share of the weights, its KV cache and `ENGINE_RESERVE_BYTES` for what vLLM allocates
  beside them (the profile run's activations, CUDA graphs, the sampler's buffers; modelled, not
  measured: no vLLM has run on a GPU here).
- `start_share(need, total)`: the share an engine passes when `gpu_memory_utilization` is None:
  its need over the device's total, rounded up to 0.001, so vLLM's check asks for the engine's
  own need (at most 0.1 % of the device more) and no more.
- `weight_bytes(folder, dtype)`: the model's weights in `dtype`, counted from its safetensors
  headers (no tensor is read); None where the folder has none (a hub id).

Not covered: quantised weights, speculative decoding's draft model, multimodal encoders.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

GIB = 1 << 30
ENGINE_RESERVE_BYTES = 2 * GIB  # activations, CUDA graphs, sampler buffers (modelled)
VLLM_DEFAULT_SHARE = 0.92  # vllm/config/cache.py, CacheConfig.gpu_memory_utilization

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_SAFETENSORS_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def requested_bytes(total_bytes: int, share: float) -> int:
    """What vLLM's start-up check asks to find free (`request_memory`)."""
    return math.ceil(total_bytes * share)


def need_bytes(
    weight_bytes: int,
    kv_bytes: int,
    tensor_parallel_size: int = 1,
    reserve_bytes: int = ENGINE_RESERVE_BYTES,
) -> int:
    """One device's part of an engine: weights / TP, the KV cache (per device), the reserve."""
    return math.ceil(weight_bytes / tensor_parallel_size) + kv_bytes + reserve_bytes


def start_share(need: int, total_bytes: int) -> float:
    """The smallest share of 0.001 steps whose request covers `need` (at most 1.0)."""
    return min(1.0, math.ceil(need / total_bytes * 1000) / 1000)


def weight_bytes(folder: str | Path, dtype: str = "auto") -> int | None:
    """Bytes of the model's tensors in `dtype` ("auto": each in its stored dtype), read from the
    safetensors headers of `folder`; None when it holds no safetensors file."""
    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        return None
    total = 0
    for path in files:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = math.prod(entry["shape"])
            size = _DTYPE_BYTES.get(dtype) or _SAFETENSORS_BYTES[entry["dtype"]]
            total += count * size
    return total

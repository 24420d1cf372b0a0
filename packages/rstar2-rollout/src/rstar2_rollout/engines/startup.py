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
- LoRA (`max_lora_rank` set): `lora_slot_rank(rank)` is the rank vLLM sizes its buffers for (the
  next of 1, 8, 16, 32, ...), `lora_buffer_bytes(config_json, rank, dtype_bytes)` what those
  buffers take on the device: read from vLLM 0.32's `lora/layers/base_linear.py`
  (`create_lora_weights`: per wrapped linear layer and slice, `max_loras` x [rank, in] for A and
  `max_loras` x [out, rank] for B, in the LoRA dtype, the model's), every linear layer of every
  block wrapped (q, k, v, o, gate, up, down; no `target_modules` is passed), `LORA_SLOTS`
  adapters at once. The punica kernels' per-step buffers ([tokens, rank] a slice) fall in the
  reserve; adapters kept in host memory (`max_cpu_loras`) are host RAM.

Not covered: quantised weights, speculative decoding's draft model, multimodal encoders.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

GIB = 1 << 30
LORA_SLOTS = 2  # adapters on the device at once: the version running requests use, and the new one
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py, MaxLoRARanks
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


def lora_slot_rank(rank: int) -> int:
    """The rank vLLM sizes its LoRA buffers for: the smallest of `VLLM_LORA_RANKS` >= `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest, {VLLM_LORA_RANKS[-1]}")


def lora_buffer_bytes(
    config_json: dict,
    rank: int,
    dtype_bytes: int = 2,
    slots: int = LORA_SLOTS,
    tensor_parallel_size: int = 1,
) -> int:
    """The device bytes of vLLM's LoRA buffers for a decoder's `config.json` (module docstring);
    the shards of tensor parallelism taken as an even split (not exact for A of column-parallel
    layers, which vLLM keeps whole)."""
    h = int(config_json["hidden_size"])
    heads = int(config_json["num_attention_heads"])
    head_dim = int(config_json.get("head_dim") or h // heads)
    q = heads * head_dim
    k = int(config_json.get("num_key_value_heads") or heads) * head_dim
    i = int(config_json["intermediate_size"])
    # (in, out) of every slice: q, k, v, o, gate, up, down
    slices = [(h, q), (h, k), (h, k), (q, h), (h, i), (h, i), (i, h)]
    r = lora_slot_rank(rank)
    per_layer = sum(r * (n_in + n_out) for n_in, n_out in slices)
    total = int(config_json["num_hidden_layers"]) * per_layer * slots * dtype_bytes
    return math.ceil(total / tensor_parallel_size)

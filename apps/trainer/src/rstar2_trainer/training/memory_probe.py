"""The measured peak memory of one real RL training step, on a CPU or a GPU, to check `memory.py`.

`measure(shape)` starts a fresh Python process (`python -m rstar2_trainer.training.memory_probe
SHAPE_JSON`) that builds a random Qwen3-shaped model of `shape`, shards it with FSDP2 in a world of
one (`distributed.shard_model`, fp32 master weights and the shape's compute dtype: bf16 as on a
GPU, or fp32, which this CPU runs five times faster), and runs `distributed.train_step` with the
RL loss (`update.RLTokenLoss`, GRPO-RoC, entropy on as the trainer computes it) on random
rows, packed as the trainer packs them (`packed=False`: padded). One warm-up step first, so the
AdamW state exists as it does in a run; then the high-water mark is reset
(`/proc/self/clear_refs`), a second step runs, and the child reports VmHWM minus the RSS it had
before the model was built: everything that step's peak holds (weights, gradients, optimizer
state, activations, the loss's tensors). The peak is also read apart for the forward and
backward (up to `optimizer.step()`, `backward_bytes`) and for the optimizer step itself
(`optimizer_bytes`), the moments `memory.py` models.

Honest measurement needs freed memory to leave the process: the child runs with glibc's
`MALLOC_MMAP_THRESHOLD_` at 64 KiB (every tensor of note is its own mapping, unmapped on free)
and `MALLOC_TRIM_THRESHOLD_` at 0, so RSS follows the live tensors instead of malloc's pools.
The reading includes what a GPU's caching allocator would not show (small allocations, thread
scratch); that is the model's `overhead_bytes`, zero here. Linux only (`/proc`).

With `device="cuda"` the model is built on the GPU and the reading is `max_memory_allocated` of
the second step minus the allocated bytes before the model (plus `reserved_peak_bytes`, what the
caching allocator held). `offload_cycle` then runs two offload/onload cycles of the training
state (`training.offload.move_train_state`), each checked exact, and the raw copy rates beside.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_trainer.training.memory import ModelShape, Setup


class ProbeShape(BaseModel):
    """One measured setup: a Qwen3 shape and the rows of one step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vocab: int = Field(gt=0)
    hidden: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    tied: bool = False
    prompt_tokens: int = Field(gt=0)
    response_lengths: list[int] = Field(min_length=1)  # one row each
    micro_batch_tokens: int = Field(gt=0)
    checkpointing: bool = False
    param_dtype: Literal["float32", "bfloat16"] = "float32"  # FSDP2's compute dtype
    device: Literal["cpu", "cuda"] = "cpu"
    packed: bool = True  # the trainer's packed rows; False: rows padded to the longest
    offload_cycle: bool = False  # after the measured step: offload, onload, one more step
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True


def probe_setup(shape: ProbeShape) -> Setup:
    """The memory model's `Setup` of a probe shape: its training phase is the prediction.

    Padded rows of equal length need no mask (transformers skips an all-ones one), so they are
    modelled as one pack of rows x length tokens; packed rows as their largest micro-batch,
    grouped by the trainer's own `token_budget_chunks`."""
    from rstar2_trainer.training.batching import token_budget_chunks

    lengths = [shape.prompt_tokens + n for n in shape.response_lengths]
    chunks = token_budget_chunks(lengths, shape.micro_batch_tokens, packed=shape.packed)
    largest = max(
        sum(lengths[i] for i in c) if shape.packed else len(c) * max(lengths[i] for i in c)
        for c in chunks
    )
    padded = not shape.packed and len(set(lengths)) > 1
    return Setup(
        model=ModelShape(
            layers=shape.layers,
            hidden=shape.hidden,
            intermediate=shape.intermediate,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            vocab=shape.vocab,
            tied=shape.tied,
        ),
        world_size=1,
        compute_bytes=2 if shape.param_dtype == "bfloat16" else 4,
        checkpointing=shape.checkpointing,
        micro_batch_tokens=shape.micro_batch_tokens,
        row_tokens=shape.prompt_tokens + max(shape.response_lengths),
        response_tokens=max(shape.response_lengths),
        padded=padded,
        pack_tokens=None if padded else largest,
        placement="split",
        kv_bytes=0,
        engine_reserve_bytes=0,
        overhead_bytes=0,
    )


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _run(shape: ProbeShape) -> dict[str, Any]:
    import ctypes
    import gc

    import torch

    from rstar2_algos.config import GrpoRocConfig
    from rstar2_trainer.training.distributed import (
        DistributedConfig,
        init_distributed,
        shard_model,
        train_step,
    )
    from rstar2_trainer.training.update import RLTokenLoss, make_optimizer

    cuda = shape.device == "cuda"
    libc = ctypes.CDLL("libc.so.6")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = DistributedConfig(
        device=shape.device,
        param_dtype=shape.param_dtype,
        activation_checkpointing=shape.checkpointing,
        micro_batch_tokens=shape.micro_batch_tokens,
    )
    world = init_distributed(config)

    def used() -> int:  # bytes: the GPU's allocated memory, or this process's RSS
        if cuda:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        gc.collect()
        libc.malloc_trim(0)
        return _rss_kib("VmRSS") * 1024

    import transformers.models.qwen3.modeling_qwen3  # noqa: F401  # its ~70 MiB before `before`

    before = used()
    with world.device:  # on a GPU the random model is built there, as fast as it gets
        model = _random_model(shape)
    shard_model(model, config, world)
    optimizer = make_optimizer(model, 1e-6, (0.9, 0.999), 0.01)
    rows = _random_rows(shape)
    loss = RLTokenLoss(GrpoRocConfig())

    def step():
        return train_step(
            model,
            optimizer,
            rows,
            loss,
            pad_id=0,
            micro_batch_tokens=shape.micro_batch_tokens,
            max_grad_norm=1.0,
            device=world.device,
            normalize_by=loss.normalize_by,
            with_entropy=True,
            packed=shape.packed,
        )

    step()  # the AdamW state now exists, as in every step of a run but the first

    def reset_peak() -> None:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS

    def peak_now() -> int:
        if cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return _rss_kib("VmHWM") * 1024

    moments: dict[str, int] = {}
    optimizer_step = optimizer.step

    def step_marked(*args: Any, **kwargs: Any) -> Any:  # the two moments apart: see memory.py
        moments["backward"] = peak_now()
        reset_peak()
        result = optimizer_step(*args, **kwargs)
        moments["optimizer"] = peak_now()
        return result

    state = used()
    optimizer.step = step_marked
    reset_peak()
    start = time.perf_counter()
    result = step()
    peak = max(peak_now(), moments["backward"])
    optimizer.step = optimizer_step
    out: dict[str, Any] = {
        "baseline_bytes": before,
        "state_bytes": state - before,
        "state_tensor_bytes": _state_tensor_bytes(model, optimizer),
        "measured_bytes": peak - before,
        "backward_bytes": moments["backward"] - before,  # forward and backward, to optimizer.step
        "optimizer_bytes": moments["optimizer"] - before,  # inside optimizer.step
        "step_s": time.perf_counter() - start,
        "tokens": result.tokens,
        "micro_batches": result.micro_batches,
        "params": sum(p.numel() for p in model.parameters()),
    }
    if cuda:
        out["reserved_peak_bytes"] = torch.cuda.max_memory_reserved()
        out["device_name"] = torch.cuda.get_device_name(world.device)
        out["torch"] = torch.__version__
    if shape.offload_cycle:
        out["offload"] = _offload_cycle(model, optimizer, world.device, used, before, step)
    return out


def _state_tensor_bytes(model: Any, optimizer: Any) -> int:
    """The resting training state counted from its tensors (parameters, gradients, optimizer
    state), each storage once: what `state_bytes` measures through RSS, without the host's
    allocator, swap or page-cache behaviour in it."""
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if t is None or not hasattr(t, "untyped_storage"):
            return
        if isinstance(t, DTensor):
            t = t.to_local()
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            total += storage.nbytes()

    for p in model.parameters():
        add(p)
        add(p.grad)
    for state in optimizer.state.values():
        for v in state.values():
            if getattr(v, "dim", lambda: 0)() > 0:  # `step` counters are scalars
                add(v)
    return total


def _random_model(shape: ProbeShape) -> Any:
    """A randomly initialised Qwen3 of `shape`, built on the current default device."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=shape.vocab,
            hidden_size=shape.hidden,
            intermediate_size=shape.intermediate,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            tie_word_embeddings=shape.tied,
            max_position_embeddings=shape.prompt_tokens + max(shape.response_lengths),
        )
    )


def _random_rows(shape: ProbeShape) -> list[Any]:
    """One RL row per response length: random tokens, advantages alternating -1 and +1."""
    import torch

    from rstar2_trainer.training.distributed import Row

    gen = torch.Generator().manual_seed(1)
    rows = []
    for i, n in enumerate(shape.response_lengths):
        ids = torch.randint(0, shape.vocab, (shape.prompt_tokens + n,), generator=gen).tolist()
        adv = 1.0 if i % 2 else -1.0
        rows.append(
            Row(
                ids[: shape.prompt_tokens],
                ids[shape.prompt_tokens :],
                [1] * n,
                {"advantage": [adv] * n},
            )
        )
    return rows


def _offload_cycle(
    model: Any, optimizer: Any, device: Any, used: Any, before: int, step: Any
) -> dict[str, Any]:
    """Two cycles of offload and onload (the first pays for pinning host memory), each checked
    exact, then one more step; and the raw copy rates they compare with."""
    import torch

    from rstar2_trainer.training.offload import move_train_state

    def checksum() -> list[float]:
        with torch.no_grad():
            tensors = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
            tensors += [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
            return [float(t.sum(dtype=torch.float64)) for t in tensors]

    out: dict[str, Any] = {"copy_gb_per_s": _copy_rates(device)}
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the copy test's 4 GiB back to the device
    kept = checksum()
    for cycle in (1, 2):
        away = move_train_state(model, optimizer, "cpu")
        left = used() - before
        back = move_train_state(model, optimizer, device)
        out[f"cycle{cycle}"] = {
            "offload_bytes": away["bytes"],
            "offload_s": away["seconds"],
            "offload_gb_per_s": away["bytes"] / away["seconds"] / 1e9,
            "left_on_device_bytes": left,
            "onload_s": back["seconds"],
            "onload_gb_per_s": back["bytes"] / back["seconds"] / 1e9,
            "exact": checksum() == kept,
        }
    out["loss_after_onload"] = step().loss  # FSDP2 still trains on the onloaded shards
    return out


def _copy_rates(device: Any, gib: int = 4) -> dict[str, float]:
    """GB/s of one `gib`-GiB copy each way: pageable, pinned on the fly, pinned and reused."""
    import torch

    if torch.device(device).type != "cuda":
        return {}
    x = torch.empty(gib << 28, dtype=torch.float32, device=device)  # [gib GiB / 4]
    pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)

    def rate(fn: Any) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return x.numel() * 4 / (time.perf_counter() - t) / 1e9

    rates = {
        "d2h_pageable": rate(lambda: x.to("cpu")),
        "d2h_pinned_new": rate(lambda: x.to("cpu", non_blocking=True)),
        "d2h_pinned_reused": rate(lambda: pinned.copy_(x, non_blocking=True)),
        "h2d_pinned": rate(lambda: x.copy_(pinned, non_blocking=True)),
    }
    return rates


def measure(shape: ProbeShape, *, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run `shape` in a fresh process and return its measurement (see the module docstring)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    if shape.expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    proc = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.training.memory_probe", shape.model_dump_json()],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"memory probe {shape.name} failed ({proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    out = _run(ProbeShape.model_validate_json(sys.argv[1]))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # gloo threads of a sharded model can abort Python's finalisation

"""The measured peak memory of one real RL training step on this CPU, to check `memory.py`.

`measure(shape)` starts a fresh Python process (`python -m rstar2_trainer.training.memory_probe
SHAPE_JSON`) that builds a random Qwen3-shaped model of `shape`, shards it with FSDP2 in a world of
one (`distributed.shard_model`, fp32 master weights and the shape's compute dtype: bf16 as on a
GPU, or fp32, which this CPU runs five times faster), and runs
`distributed.train_step` with the RL loss (`update.WorkerPolicyLoss`, GRPO-RoC, entropy on as the
trainer computes it) on random rows. One warm-up step first, so the AdamW state exists as it does
in a run; then the high-water mark is reset (`/proc/self/clear_refs`), a second step runs, and
the child reports VmHWM minus the RSS it had before the model was built: everything that step's
peak holds (weights, gradients, optimizer state, activations, the loss's tensors).

Honest measurement needs freed memory to leave the process: the child runs with glibc's
`MALLOC_MMAP_THRESHOLD_` at 64 KiB (every tensor of note is its own mapping, unmapped on free)
and `MALLOC_TRIM_THRESHOLD_` at 0, so RSS follows the live tensors instead of malloc's pools.
The reading includes what a GPU's caching allocator would not show (small allocations, thread
scratch); that is the model's `overhead_bytes`, zero here. Linux only (`/proc`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def probe_setup(shape: ProbeShape) -> Setup:
    """The memory model's `Setup` of a probe shape: its training phase is the prediction."""
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
        padded=len(set(shape.response_lengths)) > 1,
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
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rstar2_algos.config import GrpoRocConfig
    from rstar2_trainer.training.distributed import (
        DistributedConfig,
        Row,
        init_distributed,
        shard_model,
        train_step,
    )
    from rstar2_trainer.training.update import WorkerPolicyLoss, make_optimizer

    libc = ctypes.CDLL("libc.so.6")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = DistributedConfig(
        device="cpu",
        param_dtype=shape.param_dtype,
        activation_checkpointing=shape.checkpointing,
        micro_batch_tokens=shape.micro_batch_tokens,
    )
    world = init_distributed(config)
    gc.collect()
    libc.malloc_trim(0)
    before = _rss_kib("VmRSS")
    model = Qwen3ForCausalLM(
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
    shard_model(model, config, world)
    optimizer = make_optimizer(model, 1e-6, (0.9, 0.999), 0.01)
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
    loss = WorkerPolicyLoss(GrpoRocConfig())

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
        )

    step()  # the AdamW state now exists, as in every step of a run but the first
    gc.collect()
    libc.malloc_trim(0)
    state = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    result = step()
    peak = _rss_kib("VmHWM")
    return {
        "baseline_bytes": before * 1024,
        "state_bytes": (state - before) * 1024,
        "measured_bytes": (peak - before) * 1024,
        "micro_batches": result.micro_batches,
        "params": sum(p.numel() for p in model.parameters()),
    }


def measure(shape: ProbeShape, *, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run `shape` in a fresh process and return its measurement (see the module docstring)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
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

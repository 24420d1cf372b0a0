"""One LoRA training step of a Qwen3-shaped model: time, peak memory and the model's prediction.

    uv run python bench/lora_step.py                          # toy size on the CPU
    python3 bench/lora_step.py --device cuda --hidden 4096 --intermediate 12288 --layers 4 \
        --tokens 8192 --out bench/results/lora_step.json      # the 8B's width on one GPU

A random Qwen3 model (torch + transformers) wrapped by the trainer's own `lora.apply_lora`
(PEFT; the base frozen in bf16, rank-R adapters on every linear layer in fp32), then three
steps of the token-mean cross-entropy on one row through `distributed.train_step` (a world of
one, FSDP2, activation checkpointing, the chunked head), AdamW on the adapters. Reports the
seconds of the last step, the peak allocated memory of the last step (`max_memory_allocated`
on a GPU; the process's high-water mark is not read on the CPU), the memory model's training
prediction for the same shape (`memory.peak_bytes`, overhead 0), the adapter's bytes in bf16
(what an adapter sync moves), that the base did not move and the loss went down. Writes JSON.
Part of scripts/gpu_check.sh (the `lora` stage).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one LoRA step of a Qwen3-shaped model")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--tokens", type=int, default=512, help="one row: prompt 64 + response")
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rstar2_trainer.config import LoraSettings
    from rstar2_trainer.training import lora
    from rstar2_trainer.training.distributed import (
        DistributedConfig,
        Row,
        init_distributed,
        shard_model,
        train_step,
    )
    from rstar2_trainer.training.memory import GIB, ModelShape, Setup, peak_bytes

    head_dim = args.hidden // args.heads
    hf = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    config = DistributedConfig(
        device=args.device, param_dtype=dtype, activation_checkpointing=True,
        micro_batch_tokens=args.tokens,
    )  # fmt: skip
    world = init_distributed(config)
    model = lora.apply_lora(
        Qwen3ForCausalLM(hf), LoraSettings(rank=args.rank), base_dtype=getattr(torch, dtype)
    )
    model = shard_model(model, config, world).to(world.device)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    response = args.tokens - 64
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.tokens,), generator=g).tolist()
    rows = [Row(ids[:64], ids[64:], [1] * response)]
    losses, seconds, peak = [], 0.0, None
    for _ in range(3):
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        result = train_step(
            model, optimizer, rows, lambda lp, mb: -lp, pad_id=0,
            micro_batch_tokens=args.tokens, max_grad_norm=1.0, device=world.device,
        )  # fmt: skip
        if args.device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()  # the step's peak, the state included
        seconds = time.perf_counter() - start
        losses.append(result.loss)
    moved = any(not torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    shape = ModelShape(
        layers=args.layers, hidden=args.hidden, intermediate=args.intermediate,
        heads=args.heads, kv_heads=args.kv_heads, head_dim=head_dim, vocab=args.vocab,
    )  # fmt: skip
    setup = Setup(
        model=shape, compute_bytes=2 if dtype == "bfloat16" else 4, micro_batch_tokens=args.tokens,
        row_tokens=args.tokens, response_tokens=response, padded=False, overhead_bytes=0,
        lora_rank=args.rank, kv_bytes=0,
    )  # fmt: skip
    predicted = peak_bytes(setup).training
    out = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "shape": vars(args) | {"out": None},
        "step_s": seconds,
        "losses": losses,
        "loss_went_down": losses[-1] < losses[0],
        "base_unchanged": not moved,
        "adapter_bytes_bf16": lora.adapter_bytes(model, 2),
        "peak_allocated_gib": None if peak is None else peak / GIB,
        "predicted_training_gib": predicted / GIB,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    ok = out["loss_went_down"] and out["base_unchanged"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

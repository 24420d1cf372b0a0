"""A Qwen3-4B-shaped RL training step on stage-3 rows, packed and padded: tokens/s and MFU.

    python bench/train_speed.py --json OUT                  # one GPU (scripts/gpu_check.sh)
    uv run python bench/train_speed.py --device cpu --tiny --json /tmp/speed.json  # a smoke run

The step is the training ranks' own: a random Qwen3-4B-shaped model (36 blocks, width 2,560,
32/8 heads, tied 151,936-token embeddings), FSDP2 in a world of one (`distributed.shard_model`:
fp32 master weights, bf16 compute, activation checkpointing), AdamW, `distributed.train_step`
with GRPO-RoC's loss (`update.RLTokenLoss`, entropy on) in the 14B recipe's 32,768-token
micro-batches. The rows are `--rows` draws of bench/capacity.py's stage-3 lengths (bench/padding.py
`stage3_lengths`). Each layout runs one warm-up step and `--steps` timed ones:
- tokens/s: the rows' own tokens (prompt + response) over the step's seconds, either layout;
- MFU: 6 x parameters x those tokens / seconds / the device's dense bf16 peak (`PEAK_FLOPS`, by
  device name; null where the device is not in the table, and on a CPU). The 6 counts forward
  and backward once: checkpointing's recomputed forward is not credited, as MFU conventionally
  does not;
- the peak memory of each layout, and the attention kernel the packed layout ran
  (`attention.attention_kernel`);
- first, `kernel_check`: that kernel against one fp32 SDPA per row on the 4B's heads (output and
  gradients), so a kernel that is wrong on this device shows before any step.
`--tiny` shrinks the model and the rows (a CPU smoke run of the same code). Writes JSON; prints
one table. Not covered: more than one rank, the old-logprob forward, sequence parallelism.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from padding import stage3_lengths

# Dense bf16 peak FLOP/s by a substring of torch's device name (vendor data sheets, no sparsity).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "MI300X": 1307e12}

QWEN3_4B = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": True,
}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None for a CPU or a device not in `PEAK_FLOPS`."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def mfu(params: int, tokens: int, seconds: float, peak: float | None) -> float | None:
    return None if peak is None or seconds <= 0 else 6 * params * tokens / seconds / peak


def kernel_check(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The packed attention on this device (`attention.packed_attention`, the kernel it picks)
    against one fp32 SDPA per row: the largest differences of the output and of the gradients
    of q, k and v, on four rows of 700, 1, 2,300 and 129 tokens with the 4B's heads (32/8, 128)."""
    from rstar2_trainer.training.attention import attention_kernel, packed_attention

    lengths, heads, kv_heads, dim = [700, 1, 2300, 129], 32, 8, 128
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, h, sum(lengths), dim, generator=gen) for h in (heads, kv_heads, kv_heads)]
    bounds = [0, *itertools.accumulate(lengths)]
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    got = [t.to(device, dtype).requires_grad_() for t in qkv]
    q, k, v = got
    out, _ = packed_attention(
        torch.nn.Module(), q, k, v, None, scaling=dim**-0.5, cu_seq_lens_q=cu, max_length_q=2300
    )  # [1, M, Hq, D]
    weight = torch.randn(out.shape, generator=gen).to(device)
    (out.float() * weight).sum().backward()
    ref = [t.to(device).requires_grad_() for t in qkv]
    rq, rk, rv = ref
    rows = [
        F.scaled_dot_product_attention(
            rq[:, :, s:e], rk[:, :, s:e], rv[:, :, s:e], is_causal=True, scale=dim**-0.5,
            enable_gqa=True,
        )
        for s, e in itertools.pairwise(bounds)
    ]  # fmt: skip
    want = torch.cat(rows, dim=2).transpose(1, 2)  # [1, M, Hq, D]
    (want * weight).sum().backward()
    errors = {"out": float((out.detach().float() - want.detach()).abs().max())}
    for name, g, r in zip("qkv", got, ref, strict=True):
        assert g.grad is not None and r.grad is not None
        errors[f"grad_{name}"] = float((g.grad.float() - r.grad).abs().max())
    scale = float(want.detach().abs().max())
    kernel = attention_kernel(got[0], kv_heads, dim**-0.5)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return {"kernel": kernel, "dtype": str(dtype), "max_abs": errors, "out_scale": scale,
            "ok": all(v <= tol * max(1.0, scale) for v in errors.values())}  # fmt: skip


def _rows(shape: dict, count: int, tiny: bool, seed: int) -> list[Any]:
    from rstar2_trainer.training.distributed import Row

    responses, prompt = stage3_lengths(count, seed=seed)
    if tiny:  # the same spread of lengths, a hundredth of the size
        responses, prompt = [max(1, n // 100) for n in responses], max(1, prompt // 100)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i, n in enumerate(responses):
        ids = torch.randint(1, shape["vocab_size"], (prompt + n,), generator=gen).tolist()
        adv = [1.0 if i % 2 else -1.0] * n
        rows.append(Row(ids[:prompt], ids[prompt:], [1] * n, {"advantage": adv}))
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rstar2_algos import GrpoRocConfig
    from rstar2_trainer.training.attention import attention_kernel
    from rstar2_trainer.training.distributed import (
        DistributedConfig,
        init_distributed,
        shard_model,
        train_step,
    )
    from rstar2_trainer.training.update import RLTokenLoss, make_optimizer

    cuda = args.device == "cuda"
    shape = TINY if args.tiny else QWEN3_4B
    budget = args.micro_batch_tokens // (100 if args.tiny else 1)
    config = DistributedConfig(
        device=args.device,
        param_dtype="bfloat16" if cuda else "float32",
        activation_checkpointing=True,
        micro_batch_tokens=budget,
    )
    world = init_distributed(config)
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        check = kernel_check(world.device, dtype)
    except Exception as exc:  # a kernel this device cannot run: the result, not a traceback
        check = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    if not check["ok"]:  # no model and no step on a kernel that is wrong here
        return {"kernel_check": check, "device": str(world.device), "torch": torch.__version__}
    torch.manual_seed(0)
    with world.device:
        model = Qwen3ForCausalLM(Qwen3Config(**shape, max_position_embeddings=16384))
    shard_model(model, config, world)
    params = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, 1e-6, (0.9, 0.999), 0.01)
    loss = RLTokenLoss(GrpoRocConfig())
    rows = _rows(shape, args.rows, args.tiny, args.seed)
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    peak = peak_flops(world.device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    out: dict[str, Any] = {
        "kernel_check": check,
        "device": torch.cuda.get_device_name(world.device) if cuda else "cpu",
        "torch": torch.__version__,
        "params": params,
        "rows": len(rows),
        "tokens": tokens,
        "longest_row": max(len(r.prompt_ids) + len(r.response_ids) for r in rows),
        "micro_batch_tokens": budget,
        "peak_flops": peak,
    }
    probe = torch.empty(1, shape["num_attention_heads"], 2, shape["head_dim"], dtype=dtype)
    out["attention_kernel"] = attention_kernel(
        probe.to(world.device), shape["num_key_value_heads"], shape["head_dim"] ** -0.5
    )
    for layout in ("packed", "padded"):
        times, result = [], None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for step in range(args.steps + 1):
            sync()
            start = time.perf_counter()
            result = train_step(
                model,
                optimizer,
                rows,
                loss,
                pad_id=0,
                micro_batch_tokens=budget,
                max_grad_norm=1.0,
                device=world.device,
                normalize_by=loss.normalize_by,
                with_entropy=True,
                packed=layout == "packed",
            )
            sync()
            if step:  # the first is the warm-up
                times.append(time.perf_counter() - start)
        assert result is not None
        seconds = sum(times) / len(times)
        out[layout] = {
            "step_s": seconds,
            "tokens_per_s": tokens / seconds,
            "mfu": mfu(params, tokens, seconds, peak),
            "micro_batches": result.micro_batches,
            "loss": result.loss,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        }
    out["speedup"] = out["padded"]["step_s"] / out["packed"]["step_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="a toy model and rows (a smoke run)")
    p.add_argument("--rows", type=int, default=8, help="stage-3 rows in the step")
    p.add_argument("--steps", type=int, default=2, help="timed steps per layout")
    p.add_argument("--micro-batch-tokens", type=int, default=32768)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("train_speed: --device cuda but no GPU is visible", file=sys.stderr)
        return 2
    if args.rows < 1 or args.steps < 1:
        print("train_speed: --rows and --steps must be at least 1", file=sys.stderr)
        return 2
    out = run(args)
    if not out["kernel_check"]["ok"]:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"train_speed: the packed attention kernel is wrong here: {out['kernel_check']}")
        sys.stdout.flush()
        os._exit(1)
    print(f"{out['device']}: {out['params'] / 1e9:.2f}B parameters, {out['rows']} rows, "
          f"{out['tokens']:,} tokens (longest {out['longest_row']:,}), attention kernel "
          f"{out['attention_kernel']}")  # fmt: skip
    print(f"{'layout':8} {'step s':>8} {'tokens/s':>10} {'MFU':>7} {'micro-batches':>14} "
          f"{'peak GiB':>9}")  # fmt: skip
    for layout in ("packed", "padded"):
        r = out[layout]
        share = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        print(f"{layout:8} {r['step_s']:>8.2f} {r['tokens_per_s']:>10,.0f} {share:>7} "
              f"{r['micro_batches']:>14} {peak:>9}")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    sys.stdout.flush()
    os._exit(0)  # gloo/nccl threads of a sharded model can abort Python's finalisation


if __name__ == "__main__":
    sys.exit(main())

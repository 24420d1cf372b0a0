"""GPU check: the RL policy step at a real vocabulary, an FSDP2 step under torchrun, and a vLLM
engine's generate, weight sync and sleep/wake, timed on one GPU; prints one table, writes JSON.

  uv run python bench/gpu_step.py                         # a Qwen3-shaped model built here
  uv run python bench/gpu_step.py --model /models/qwen3-1.7b-base-nonreasoning-sft

The built model has Qwen's 151,936-token vocabulary and the batch 4,096-token sequences, so the
loss's logit memory is what a real run sees. Phases (each timed after one warm-up):
1. policy   `distributed.train_step` with the GRPO-RoC loss (`update.RLTokenLoss`, entropy on
            as the trainer computes it), bf16 autocast, fp32 master weights and AdamW state;
            tokens/s and peak memory.
2. fsdp     `distributed.train_step` in a `torchrun --nproc-per-node 1` child (nccl, FSDP2 with
            bf16 params / fp32 reduce, activation checkpointing); tokens/s and peak memory.
3. vllm     `VLLMEngine` (bf16, sleep mode on): a batch of concurrent greedy requests (decode
            tokens/s); then the sync check: one GRPO-RoC step of the policy on the GPU, the
            colocated cycle (sleep and the memory it freed, wake weights, push the stepped
            weights, wake the KV cache); greedy output must change and equal transformers' bf16
            greedy output of the stepped policy.

On a machine without a CUDA/ROCm GPU it prints one line and exits with status 2. The model folder
must hold a Hugging Face causal LM with untied embeddings (vLLM's reload leaves a tied head
stale). Not covered: multi-GPU runs (scripts/gpu_check.sh runs a colocated `rstar2-train`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

GIB = 1 << 30


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="HF model folder; unset: build one")
    p.add_argument("--hidden-size", type=int, default=1024, help="built model: width")
    p.add_argument("--layers", type=int, default=8, help="built model: transformer blocks")
    p.add_argument("--vocab", type=int, default=151936, help="built model: vocabulary (Qwen's)")
    p.add_argument("--rows", type=int, default=8, help="sequences in a training batch")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per training sequence")
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    p.add_argument("--requests", type=int, default=64, help="concurrent vLLM requests")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens each request decodes")
    p.add_argument("--kv-gib", type=float, default=4.0, help="vLLM KV-cache size")
    p.add_argument("--sleep-level", type=int, choices=(1, 2), default=1)
    p.add_argument("--skip", nargs="*", default=[], choices=("policy", "fsdp", "vllm"))
    p.add_argument("--out", type=Path, default=Path("bench/results/gpu_step.json"))
    p.add_argument("--fsdp-worker", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def _sync() -> None:
    torch.cuda.synchronize()


def _rows(vocab: int, rows: int, seq_len: int, seed: int) -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rows):
        ids = torch.randint(3, vocab, (seq_len,), generator=gen).tolist()
        out.append((ids[: seq_len // 4], ids[seq_len // 4 :]))  # prompt, response
    return out


def build_model(args: argparse.Namespace, folder: Path) -> Path:
    if args.model is not None:
        return args.model
    from rstar2_rollout.tiny import build_tiny_model

    heads = args.hidden_size // 64
    return build_tiny_model(
        folder / "model",
        seed=0,
        vocab_size=args.vocab,
        hidden_size=args.hidden_size,
        layers=args.layers,
        heads=heads,
        kv_heads=max(1, heads // 2),
        max_position_embeddings=8192,
    )


def policy_phase(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from rstar2_algos import GrpoRocConfig
    from rstar2_rollout.trajectory import Trajectory
    from rstar2_trainer.training.distributed import train_step
    from rstar2_trainer.training.precision import Precision
    from rstar2_trainer.training.update import RLTokenLoss, make_optimizer, policy_rows

    precision = Precision(torch.device("cuda", 0), torch.bfloat16)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to("cuda")
    vocab = model.config.vocab_size
    kept = [
        Trajectory(
            group_id=f"p{i // 2}",
            sample_index=i % 2,
            prompt_ids=p,
            response_ids=r,
            loss_mask=[1] * len(r),
        )
        for i, (p, r) in enumerate(_rows(vocab, args.rows, args.seq_len, seed=0))
    ]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(kept))])  # [K]
    optimizer = make_optimizer(model, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
    loss = RLTokenLoss(GrpoRocConfig())
    rows = policy_rows(kept, advantages)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps + 1):
        _sync()
        start = time.perf_counter()
        with precision.autocast():  # the driver policy's step (policy.DriverPolicy)
            result = train_step(
                model,
                optimizer,
                rows,
                loss,
                pad_id=0,
                micro_batch_tokens=args.micro_batch_tokens,
                max_grad_norm=1.0,
                device=precision.device,
                normalize_by=loss.normalize_by,
                with_entropy=True,
            )
        _sync()
        if step:  # the first step is the warm-up
            times.append(time.perf_counter() - start)
    tokens = args.rows * args.seq_len
    step_s = sum(times) / len(times)
    out = {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "peak_gib": torch.cuda.max_memory_allocated() / GIB,
        "loss": result.loss,
        "master_dtype": str(next(model.parameters()).dtype),
    }
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return out


def fsdp_worker(args: argparse.Namespace, model_dir: Path) -> None:
    """Runs inside torchrun: one FSDP2 rank; rank 0 writes its timings to `args.fsdp_worker`."""
    from transformers import AutoModelForCausalLM

    from rstar2_trainer.training.distributed import (
        DistributedConfig,
        Row,
        close_distributed,
        init_distributed,
        partition_rows,
        shard_model,
        train_step,
    )

    config = DistributedConfig(
        device="cuda",
        param_dtype="bfloat16",
        reduce_dtype="float32",
        activation_checkpointing=True,
        micro_batch_tokens=args.micro_batch_tokens,
    )
    world = init_distributed(config)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = model.config.vocab_size
    model = shard_model(model.to(world.device), config, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = [
        Row(prompt_ids=p, response_ids=r, loss_mask=[1] * len(r))
        for p, r in _rows(vocab, args.rows, args.seq_len, seed=1)
    ]
    mine = partition_rows(rows, world.world_size)[world.rank]
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps + 1):
        _sync()
        start = time.perf_counter()
        result = train_step(
            model,
            optimizer,
            mine,
            lambda logp, mb: -logp,
            pad_id=0,
            micro_batch_tokens=config.micro_batch_tokens,
            max_grad_norm=1.0,
            device=world.device,
        )
        _sync()
        if step:
            times.append(time.perf_counter() - start)
    step_s = sum(times) / len(times)
    if world.rank == 0:
        report = {
            "world_size": world.world_size,
            "step_s": step_s,
            "tokens_per_s": result.tokens / step_s,
            "peak_gib": torch.cuda.max_memory_allocated() / GIB,
            "loss": result.loss,
            "micro_batches": result.micro_batches,
        }
        args.fsdp_worker.write_text(json.dumps(report))
    close_distributed()


def fsdp_phase(args: argparse.Namespace, model_dir: Path, folder: Path) -> dict[str, Any]:
    out = folder / "fsdp.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"),
        *("--master-addr", "127.0.0.1", "--master-port", str(port)),
        __file__,
        *("--model", str(model_dir), "--fsdp-worker", str(out)),
        *("--rows", str(args.rows), "--seq-len", str(args.seq_len)),
        *("--micro-batch-tokens", str(args.micro_batch_tokens), "--steps", str(args.steps)),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"error": f"torchrun exited {done.returncode}: " + " | ".join(tail)}
    return json.loads(out.read_text())


async def vllm_phase(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from rstar2_rollout import SamplingParams, VLLMEngineConfig
    from rstar2_rollout.engines.vllm import VLLMEngine
    from rstar2_trainer.placement.engines import Engines
    from rstar2_trainer.placement.weights import TensorMover

    policy: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = policy.to("cuda")
    vocab = policy.config.vocab_size
    prompts = [p for p, _ in _rows(vocab, args.requests, 128, seed=2)]
    start = time.perf_counter()
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=str(model_dir),
            dtype="bfloat16",
            kv_cache_memory_bytes=int(args.kv_gib * GIB),
            max_model_len=4096,
            max_num_seqs=max(args.requests, 1),
            enable_sleep_mode=True,
        )
    )
    out: dict[str, Any] = {"start_s": time.perf_counter() - start}
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, logprobs=False)

    async def batch(tag: str) -> tuple[float, list[list[int]]]:
        t = time.perf_counter()
        gens = await asyncio.gather(
            *(engine.generate(p, greedy, f"{tag}-{i}") for i, p in enumerate(prompts))
        )
        errors = [g.error for g in gens if g.finish_reason == "error"]
        if errors:
            raise RuntimeError(f"generate failed: {errors[0]}")
        return time.perf_counter() - t, [g.token_ids for g in gens]

    try:
        await batch("warmup")
        seconds, before = await batch("gen")
        out["generate_s"] = seconds
        out["decode_tokens_per_s"] = sum(map(len, before)) / seconds
        rl_step(policy, vocab)  # the weights now differ from the engine's
        free_awake = torch.cuda.mem_get_info()[0]
        mover = TensorMover(Engines([engine], sleep_level=args.sleep_level))  # the trainer's
        out["sleep_s"] = (await mover.sleep()).total_s
        out["sleep_freed_gib"] = (torch.cuda.mem_get_info()[0] - free_awake) / GIB
        times = await mover.push(policy.state_dict().items())
        out["wake_s"] = times.wake_s  # weights before the load, KV cache after
        out["cycle_sync_s"] = times.total_s
        _, after = await batch("after")
        out["greedy_changed_after_sync"] = after != before
        reference = reference_greedy(policy, prompts[:4], max_tokens=32)
        out["greedy_equals_transformers_bf16"] = [a[:32] for a in after[:4]] == reference
    finally:
        await engine.close()
    return out


def rl_step(policy: Any, vocab: int) -> None:
    """One GRPO-RoC step of `policy` on random rows (lr 1e-4: a visible change)."""
    from rstar2_algos import GrpoRocConfig
    from rstar2_rollout.trajectory import Trajectory
    from rstar2_trainer.training.distributed import train_step
    from rstar2_trainer.training.precision import Precision
    from rstar2_trainer.training.update import RLTokenLoss, make_optimizer, policy_rows

    kept = [
        Trajectory(f"p{i // 2}", i % 2, p, r, [1] * len(r))
        for i, (p, r) in enumerate(_rows(vocab, 8, 512, seed=3))
    ]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(kept))])  # [K]
    optimizer = make_optimizer(policy, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0)
    loss = RLTokenLoss(GrpoRocConfig())
    precision = Precision(torch.device("cuda", 0), torch.bfloat16)
    with precision.autocast():
        train_step(
            policy,
            optimizer,
            policy_rows(kept, advantages),
            loss,
            pad_id=0,
            micro_batch_tokens=8192,
            max_grad_norm=1.0,
            device=precision.device,
            normalize_by=loss.normalize_by,
            with_entropy=True,
        )
    policy.eval()
    del optimizer


def reference_greedy(policy: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt with a bf16 copy of `policy`."""
    import copy

    model = copy.deepcopy(policy).to(torch.bfloat16).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], device="cuda")
            gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
            out.append(gen[0, len(prompt) :].tolist())
    del model
    torch.cuda.empty_cache()
    return out


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(f"{'phase':8}  {'metric':26}  value")
    for phase, metrics in results.items():
        for key, value in metrics.items():
            shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
            print(f"{phase:8}  {key:26}  {shown}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_step: no CUDA or ROCm GPU is visible; run it on a GPU machine", file=sys.stderr)
        return 2
    if args.fsdp_worker is not None:
        fsdp_worker(args, args.model)
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu_step-") as tmp:
        folder = Path(tmp)
        model_dir = build_model(args, folder)
        results: dict[str, dict[str, Any]] = {}
        if "policy" not in args.skip:
            results["policy"] = policy_phase(args, model_dir)
        if "fsdp" not in args.skip:
            results["fsdp"] = fsdp_phase(args, model_dir, folder)
        if "vllm" not in args.skip:
            results["vllm"] = asyncio.run(vllm_phase(args, model_dir))
    results["device"] = {
        "name": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "hip": str(torch.version.hip),
        "cuda": str(torch.version.cuda),
    }
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": _jsonable(vars(args)), "results": results}, indent=2))
    print(f"wrote {args.out}")
    return 0


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

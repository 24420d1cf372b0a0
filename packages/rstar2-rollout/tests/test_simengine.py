"""The simulated engine behaves like vLLM V1 where the scheduler comparisons depend on it: block
allocation, LIFO preemption one request at a time, prefix-cache credit, max_num_seqs and the
per-step token budget."""

from __future__ import annotations

import asyncio

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.research.simengine import EngineModel, SimEngine, run_virtual

TINY = EngineModel(kv_tokens=1024, base_step_s=0.01, per_request_step_s=0.0)  # 64 blocks


def play(engine: SimEngine, calls: list[tuple[str, int, int]]) -> list[tuple[str, float, int]]:
    """Start every (request id, prompt, tokens) at once; (id, finish time, tokens) by finish."""
    done: list[tuple[str, float, int]] = []

    async def one(rid: str, prompt: int, n: int) -> None:
        out = await engine.generate(range(prompt), SamplingParams(max_tokens=n), rid)
        assert out.finish_reason == "length"
        done.append((rid, asyncio.get_running_loop().time(), len(out.token_ids)))

    async def main() -> None:
        await asyncio.gather(*(one(*c) for c in calls))
        await engine.close()

    run_virtual(main())
    return done


def test_out_of_blocks_preempts_the_newest_request_and_credits_its_cached_prefix() -> None:
    engine = SimEngine("e", TINY)
    done = play(engine, [("a/0", 16, 600), ("b/0", 16, 600)])  # 2 x 616 > 1024 tokens
    assert [d[0] for d in done] == ["a/0", "b/0"]  # b joined last, so b was preempted
    assert [d[2] for d in done] == [600, 600]  # and still wrote all of its tokens
    s = engine.stats
    assert s.preempted_requests >= 1 and s.decoded_tokens == 1200
    # b had ~512 tokens when preempted; part of them stayed cached, so less was recomputed
    assert 0 < s.recomputed_tokens < 512
    assert s.peak_kv_tokens <= 1024


def test_a_request_that_fits_is_never_preempted() -> None:
    engine = SimEngine("e", TINY)
    play(engine, [("a/0", 100, 400), ("b/0", 100, 400)])  # 2 x 500 <= 1024
    assert engine.stats.preempted_requests == 0 and engine.stats.recomputed_tokens == 0


def test_max_num_seqs_queues_the_rest() -> None:
    model = EngineModel(kv_tokens=100_000, base_step_s=0.01, per_request_step_s=0.0, max_num_seqs=2)
    engine = SimEngine("e", model)
    done = play(engine, [(f"r{i}/0", 10, 100) for i in range(4)])
    times = sorted(t for _, t, _ in done)
    assert times[2] > 1.9 * times[0]  # two at a time: the last two ran after the first two


def test_prefill_is_chunked_by_the_token_budget() -> None:
    model = EngineModel(
        kv_tokens=100_000, base_step_s=0.01, per_request_step_s=0.0, max_num_batched_tokens=256
    )
    engine = SimEngine("e", model)
    play(engine, [("a/0", 1000, 1)])
    assert engine.stats.prefill_tokens == 1000
    assert engine.stats.steps >= 4  # 1000 prompt tokens, 256 a step

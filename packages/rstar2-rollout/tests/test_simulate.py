"""The simulator: virtual clock, engine model, workload, determinism."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from rstar2_rollout.config import KVAwarePolicy, LeastRequestsPolicy, SchedulerConfig
from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.research.config import ResearchSchedulerConfig, StaticPolicy
from rstar2_rollout.research.simulate import (
    EngineModel,
    Scenario,
    SimEngine,
    draw_workload,
    makespan_lower_bound,
    order_workload,
    run_virtual,
    simulate,
)

SMALL = Scenario(engines=2, prompts=8, samples_per_prompt=8, engine=EngineModel(kv_tokens=60_000))


def test_virtual_clock_skips_waiting() -> None:
    async def main() -> float:
        await asyncio.sleep(3_600)
        await asyncio.wait_for(asyncio.sleep(1), timeout=10)
        return asyncio.get_running_loop().time()

    start = time.perf_counter()
    assert run_virtual(main()) == 3_601
    assert time.perf_counter() - start < 1


def test_batching_raises_throughput_but_slows_each_step() -> None:
    def tokens_per_s(batch: int) -> tuple[float, float]:
        engine = SimEngine("e", EngineModel())

        async def main() -> float:
            params = SamplingParams(max_tokens=1_000)
            await asyncio.gather(
                *(engine.generate(range(100), params, f"r{i}/0") for i in range(batch))
            )
            return asyncio.get_running_loop().time()

        elapsed = run_virtual(main())
        return batch * 1_000 / elapsed, elapsed

    one, one_s = tokens_per_s(1)
    many, many_s = tokens_per_s(64)
    assert many > 20 * one  # decode is memory-bound: a batch is almost free
    assert many_s > one_s  # but every step gets a little slower


def test_workload_is_long_tailed_and_inside_its_budgets() -> None:
    s = Scenario(prompts=64, samples_per_prompt=32)
    specs = draw_workload(s, seed=3)
    assert len(specs) == 64 * 32
    totals = sorted(sum(t.turn_tokens) + sum(t.tool_tokens) for t in specs)
    assert totals[-1] <= s.max_response_tokens
    assert totals[len(totals) // 2] < s.max_response_tokens / 2  # median well below the cap
    assert sum(t == s.max_response_tokens for t in totals) > 0.05 * len(totals)  # a clipped tail
    turns = [len(t.turn_tokens) for t in specs]
    assert min(turns) == 1 and max(turns) == s.max_turns
    for t in specs:  # a tool output may use up the budget, ending the trajectory after it
        assert len(t.tool_tokens) in (len(t.turn_tokens) - 1, len(t.turn_tokens))
        assert len(t.tool_latency_s) == len(t.tool_tokens)
    assert draw_workload(s, seed=3) == specs
    assert draw_workload(s, seed=4) != specs


def test_simulation_is_deterministic_for_a_seed() -> None:
    cfg = SchedulerConfig(policy=KVAwarePolicy())
    first = simulate(SMALL, cfg, seed=7)
    assert simulate(SMALL, cfg, seed=7) == first
    assert simulate(SMALL, cfg, seed=8) != first
    assert first.failed == 0 and first.trajectories == 64
    assert 0 <= first.idle_share < 1


def test_static_split_overflows_a_tight_cache_and_recomputes() -> None:
    tight = Scenario(
        engines=2, prompts=16, samples_per_prompt=8, engine=EngineModel(kv_tokens=40_000)
    )
    kv = simulate(tight, SchedulerConfig(policy=KVAwarePolicy()), seed=1)
    static = simulate(tight, ResearchSchedulerConfig(policy=StaticPolicy()), seed=1)
    assert kv.preemption_events == 0 and kv.recomputed_tokens == 0
    assert static.preemption_events > 0 and static.recomputed_tokens > 0
    assert kv.decoded_tokens == static.decoded_tokens  # the same work, placed differently


def test_a_turn_barrier_only_adds_waiting() -> None:
    cfg = ResearchSchedulerConfig(policy=StaticPolicy())
    free = simulate(SMALL, cfg, seed=2)
    synced = simulate(SMALL, cfg, seed=2, turn_barrier=True)
    assert synced.makespan_s > free.makespan_s
    assert synced.decoded_tokens == free.decoded_tokens


def test_engine_model_derives_tensor_parallel_engines_from_the_hardware() -> None:
    assert EngineModel.qwen3_14b_mi300x(1) == EngineModel()  # the defaults are TP=1
    tp4 = EngineModel.qwen3_14b_mi300x(4)
    # 1/4 of the weights and 1/4 of each token's KV heads per rank: more than 4x the tokens
    assert 4 * EngineModel().kv_tokens < tp4.kv_tokens < 5 * EngineModel().kv_tokens
    assert tp4.per_kv_token_step_s == pytest.approx(EngineModel().per_kv_token_step_s / 4)
    assert EngineModel().base_step_s / 4 < tp4.base_step_s < EngineModel().base_step_s / 2
    with pytest.raises(ValueError, match="tp must divide"):
        EngineModel.qwen3_14b_mi300x(3)


def test_oracle_orders_sort_by_drawn_lengths() -> None:
    specs = draw_workload(SMALL, seed=5)
    longest = order_workload(specs, "oracle_longest_first")
    assert sorted(longest, key=lambda s: s.key) == sorted(specs, key=lambda s: s.key)
    assert [s.response_tokens for s in longest] == sorted(
        (s.response_tokens for s in specs), reverse=True
    )
    by_group = order_workload(specs, "oracle_group_longest_first")
    groups = [s.group for s in by_group]
    assert len(set(groups)) == SMALL.prompts
    for g in set(groups):  # the samples of one problem stay together, hardest problem first
        at = [i for i, x in enumerate(groups) if x == g]
        assert at == list(range(at[0], at[0] + len(at)))
    total = {g: sum(s.response_tokens for s in specs if s.group == g) for g in set(groups)}
    assert total[groups[0]] == max(total.values())
    assert order_workload(specs, "submitted") == specs


@pytest.mark.parametrize(
    "order", ["submitted", "oracle_longest_first", "oracle_group_longest_first"]
)
def test_kv_aware_never_preempts_in_any_order(order) -> None:
    tight = Scenario(
        engines=2, prompts=16, samples_per_prompt=8, engine=EngineModel(kv_tokens=40_000)
    )
    r = simulate(tight, SchedulerConfig(policy=KVAwarePolicy()), seed=1, order=order)
    assert r.preemption_events == 0 and r.recomputed_tokens == 0 and r.failed == 0
    assert r.order == order
    assert 0 < r.tool_wait_share < 0.2  # tools take a small share of a trajectory's life


@pytest.mark.parametrize(
    "policy",
    [StaticPolicy(), StaticPolicy(split="round_robin"), KVAwarePolicy(), LeastRequestsPolicy()],
)
def test_no_policy_beats_the_makespan_lower_bound(policy) -> None:
    tight = dataclasses.replace(SMALL, engine=EngineModel(kv_tokens=20_000))
    for scenario in (SMALL, tight):
        bound = makespan_lower_bound(scenario, seed=5)
        result = simulate(scenario, ResearchSchedulerConfig(policy=policy), seed=5)
        assert 0 < bound.makespan_s <= result.makespan_s


def test_the_lower_bound_is_the_makespan_of_a_lone_trajectory() -> None:
    alone = dataclasses.replace(SMALL, engines=1, prompts=1, samples_per_prompt=1)
    bound = makespan_lower_bound(alone, seed=2)
    result = simulate(alone, SchedulerConfig(), seed=2)
    assert bound.path_s == bound.makespan_s
    # a batch of one pays every step alone; the engine settles a turn that ends inside a chunk
    # of identical steps at the chunk's end, so each turn may end up to a chunk late
    (spec,) = draw_workload(alone, seed=2)
    m = alone.engine
    longest_step = m.scheduler_step_s + m.base_step_s + m.per_request_step_s
    longest_step += m.per_kv_token_step_s * (spec.prompt_tokens + spec.response_tokens)
    late = len(spec.turn_tokens) * m.max_chunk_steps * longest_step
    assert bound.path_s <= result.makespan_s <= bound.path_s + late


def test_forced_lengths_ask_for_each_turn_exactly() -> None:
    asked = simulate(SMALL, SchedulerConfig(policy=LeastRequestsPolicy()), seed=1)
    forced = simulate(
        SMALL, SchedulerConfig(policy=LeastRequestsPolicy()), seed=1, forced_lengths=True
    )
    assert forced.decoded_tokens == asked.decoded_tokens  # the same tokens either way
    assert forced.failed == asked.failed == 0

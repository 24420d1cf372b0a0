"""The gRPC rollout service end to end on 127.0.0.1:0: a real server and client, over simulated
engines (an Engine implementation, on the real clock here) with a scripted produce coroutine that
runs generate turns and awaits a tool between them, and over the transformers engine with a tiny
model, the agent loop and the real LocalSandbox."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rstar2_rollout.client import RolloutClient, RolloutError
from rstar2_rollout.config import KVAwarePolicy, SchedulerConfig
from rstar2_rollout.engine import Engine, SamplingParams
from rstar2_rollout.loop import RolloutTask
from rstar2_rollout.research.config import KVProgressPolicy, ResearchSchedulerConfig
from rstar2_rollout.research.simulate import EngineModel, SimEngine
from rstar2_rollout.scheduler import Scheduler
from rstar2_rollout.server import start_server
from rstar2_rollout.service import (
    RolloutResult,
    RolloutSampling,
    RolloutService,
    WeightsUnsupported,
)
from rstar2_rollout.trajectory import ToolCallRecord, Trajectory

FAST = EngineModel(
    kv_tokens=4_000, base_step_s=1e-4, per_request_step_s=0.0, per_kv_token_step_s=0.0
)
TOOL_S = 0.05
PROBLEMS = [RolloutTask(f"q{i}", f"What is {i} + {i}?") for i in range(3)]


def prompt_ids(problem: RolloutTask) -> list[int]:
    return list(problem.question.encode())


async def produce(
    problem: RolloutTask, index: int, engine: Engine, sampling: RolloutSampling, request_id: str
) -> Trajectory:
    """A scripted agent: 1 + index % 3 turns of generation with a tool call between turns."""
    loop = asyncio.get_running_loop()
    traj = Trajectory(group_id=problem.id, sample_index=index, prompt_ids=prompt_ids(problem))
    turns = min(sampling.max_turns, 1 + index % 3)
    for turn in range(turns):
        budget = sampling.max_response_tokens - len(traj.response_ids)
        params = SamplingParams(max_tokens=min(32, budget), seed=sampling.seed)
        out = await engine.generate(
            traj.prompt_ids + traj.response_ids, params, f"{request_id}/{turn}"
        )
        if out.finish_reason == "error":
            raise RuntimeError(out.error)
        traj.turns += 1
        traj.append(out.token_ids, sampled=True, logprobs=out.logprobs)
        if turn < turns - 1:
            start = loop.time()
            await asyncio.sleep(TOOL_S)
            traj.record(
                ToolCallRecord(turn, "python", "print(1+1)", "", "ok", wall_s=loop.time() - start)
            )
            traj.append([10, 50, 10], sampled=False)
    traj.answer_blocks, traj.final_answer = 1, str(2 * int(problem.id[1:]))
    traj.finish_reason = "answered"
    return traj


def with_worker(
    body: Callable[[RolloutClient, list[SimEngine], Scheduler[Any]], Awaitable[Any]],
    engines: int = 2,
    model: EngineModel = FAST,
    config: SchedulerConfig | None = None,
) -> Any:
    async def main() -> Any:
        sims = [SimEngine(f"engine-{i}", model) for i in range(engines)]
        scheduler: Scheduler[Any] = Scheduler(sims, config)
        service = RolloutService(scheduler, produce, lambda p: len(prompt_ids(p)))
        server = await start_server(service)
        try:
            async with RolloutClient(server.target) as client:
                return await body(client, sims, scheduler)
        finally:
            await server.stop(None)
            for e in sims:
                await e.close()

    return asyncio.run(main())


def test_trajectories_stream_back_in_completion_order() -> None:
    async def body(client: RolloutClient, sims, scheduler) -> list[RolloutResult]:
        sampling = RolloutSampling(n=4, max_response_tokens=300, seed=11)
        return [r async for r in client.generate(PROBLEMS, sampling)]

    results = with_worker(body)
    got = [r.trajectory for r in results]
    assert sorted((t.group_id, t.sample_index) for t in got) == [
        (p.id, i) for p in PROBLEMS for i in range(4)
    ]
    # one-turn trajectories finish first, three-turn ones (two tool waits) last
    assert [t.turns for t in got] == sorted(t.turns for t in got)
    assert {r.engine for r in results} == {"engine-0", "engine-1"}
    for t in got:
        t.validate()  # lengths, mask values, logprobs only where sampled, outcome counts
        assert t.finish_reason == "answered"
        assert sum(t.loss_mask) == 32 * t.turns and len(t.tool_calls) == t.turns - 1
        assert t.final_answer == str(2 * int(t.group_id[1:]))
        assert all(c.outcome == "ok" and c.wall_s >= TOOL_S for c in t.tool_calls)


@pytest.mark.parametrize("policy", [KVProgressPolicy(), KVAwarePolicy()], ids=lambda p: p.kind)
def test_jobs_wait_for_kv_and_info_reports_it(policy) -> None:
    tight = EngineModel(
        kv_tokens=704, base_step_s=2e-4, per_request_step_s=0.0, per_kv_token_step_s=0.0
    )

    async def body(client: RolloutClient, sims, scheduler):
        before = await client.info()
        sampling = RolloutSampling(n=4, max_response_tokens=300)
        stream = client.generate(PROBLEMS, sampling)
        first = await anext(stream)
        during = await client.info()
        rest = [r async for r in stream]
        return before, first, during, rest

    before, first, during, rest = with_worker(
        body, model=tight, config=ResearchSchedulerConfig(policy=policy)
    )
    assert before.policy == policy.kind
    assert [(e.name, e.healthy, e.running) for e in before.engines] == [
        ("engine-0", True, 0),
        ("engine-1", True, 0),
    ]
    # 44 blocks of 16 tokens
    assert all(e.capacity and e.capacity.total_tokens == 704 for e in before.engines)
    if policy.kind == "kv_aware":  # each engine holds two ~320-token reservations at most
        assert all(e.reserved_tokens <= 704 and e.running <= 2 for e in during.engines)
    else:  # the bound on what the running turns can reach stays within the planned 697
        assert all(0 < e.reserved_tokens <= 697 for e in during.engines)
    results = [first, *rest]
    assert len(results) == 12
    assert all(r.trajectory.finish_reason == "answered" for r in results)
    # the later ones waited for room (under kv_progress jobs also wait turn by turn)
    assert max(r.queued_s for r in results) > (TOOL_S if policy.kind == "kv_aware" else 0)


@pytest.mark.parametrize(
    ("problems", "sampling", "message"),
    [
        ([], RolloutSampling(n=2), "no problems"),
        (PROBLEMS, RolloutSampling(n=0), "n must be > 0"),
        (PROBLEMS, RolloutSampling(n=-3), "n must be > 0"),
        (
            PROBLEMS,
            RolloutSampling(n=1, max_response_tokens=-5),
            "max_response_tokens must be >= 0",
        ),
        (PROBLEMS, RolloutSampling(n=1, temperature=-1.0), "temperature"),
        ([PROBLEMS[0], PROBLEMS[0]], RolloutSampling(n=1), "appears more than once"),
        (PROBLEMS, RolloutSampling(n=1, max_response_tokens=100_000), "lower max_response_tokens"),
    ],
)
def test_bad_requests_are_invalid_argument(problems, sampling, message) -> None:
    async def body(client: RolloutClient, sims, scheduler) -> RolloutError:
        with pytest.raises(RolloutError) as info:
            async for _ in client.generate(problems, sampling):
                pass
        return info.value

    err = with_worker(body)
    assert err.code == "INVALID_ARGUMENT" and message in err.message


def test_no_healthy_engine_is_unavailable() -> None:
    async def body(client: RolloutClient, sims: list[SimEngine], scheduler):
        for e in sims:
            e.fail("out of memory")
        with pytest.raises(RolloutError) as info:
            async for _ in client.generate(PROBLEMS, RolloutSampling(n=1)):
                pass
        return info.value, await client.info()

    err, info = with_worker(body)
    assert err.code == "UNAVAILABLE" and "out of memory" in err.message
    assert [e.healthy for e in info.engines] == [False, False]


def test_an_engine_dying_mid_stream_fails_only_its_trajectories() -> None:
    async def body(client: RolloutClient, sims: list[SimEngine], scheduler):
        asyncio.get_running_loop().call_later(TOOL_S / 2, sims[0].fail, "segfault in attention")
        sampling = RolloutSampling(n=4, max_response_tokens=300)
        return [r async for r in client.generate(PROBLEMS, sampling)]

    got = with_worker(body)
    failed = [r for r in got if r.trajectory.finish_reason == "error"]
    assert len(got) == 12 and failed
    assert all(
        r.engine == "engine-0" and "segfault in attention" in r.trajectory.error for r in failed
    )
    # what engine-0 finished before it died was one-turn work; everything longer failed there
    done_on_0 = [r for r in got if r.engine == "engine-0" and r not in failed]
    assert all(r.trajectory.turns == 1 for r in done_on_0)
    assert all(r.trajectory.finish_reason == "answered" for r in got if r.engine == "engine-1")


def test_hanging_up_cancels_the_rest_on_the_worker() -> None:
    async def body(client: RolloutClient, sims, scheduler: Scheduler[Any]):
        stream = client.generate(PROBLEMS, RolloutSampling(n=8, max_response_tokens=300))
        first = await anext(stream)
        await stream.aclose()
        for _ in range(100):
            if all(s.running == 0 for s in scheduler.status()):
                break
            await asyncio.sleep(0.02)
        return first, scheduler.status()

    first, status = with_worker(body)
    assert first.trajectory.finish_reason == "answered"
    assert all(s.running == 0 and s.reserved_tokens == 0 for s in status)


@pytest.mark.slow  # builds a tiny model and starts the sandbox: ~20 s on an idle 2-core machine
def test_real_engines_agent_loop_and_sandbox_behind_the_worker(
    runner: asyncio.Runner, sandbox, tiny_model, tokenizer
) -> None:
    from transformers import AutoModelForCausalLM

    from rstar2_rollout.config import KVAwarePolicy, RolloutConfig, SchedulerConfig
    from rstar2_rollout.engines.hf import HFEngine
    from rstar2_rollout.service import agent_producer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    engines = [HFEngine(model, tokenizer, name=f"hf-{i}") for i in range(2)]
    produce, prompt_tokens = agent_producer(sandbox, tokenizer, RolloutConfig())
    # transformers reports no KV cache: say what each engine may hold (two trajectories here)
    problems = [RolloutTask("a", "What is 6*7?"), RolloutTask("b", "Sum 1..10?")]
    longest = max(prompt_tokens(p) for p in problems)
    config = SchedulerConfig(policy=KVAwarePolicy(kv_tokens_fallback=2 * (longest + 24)))

    async def main():
        scheduler: Scheduler[Trajectory] = Scheduler(engines, config)
        server = await start_server(RolloutService(scheduler, produce, prompt_tokens))
        try:
            async with RolloutClient(server.target) as client:
                sampling = RolloutSampling(n=3, max_response_tokens=24, max_turns=2, seed=5)
                first = [r async for r in client.generate(problems, sampling)]
                again = [r async for r in client.generate(problems, sampling)]
                return first, again, await client.info()
        finally:
            await server.stop(None)

    first, again, info = runner.run(main())
    assert sorted((r.trajectory.group_id, r.trajectory.sample_index) for r in first) == [
        (p, i) for p in "ab" for i in range(3)
    ]
    for r in first:
        t = r.trajectory
        t.validate()
        assert r.engine in {"hf-0", "hf-1"}
        assert t.finish_reason in {"answered", "no_tool_call", "max_turns", "max_length"}
        assert len(t.response_ids) <= 24 and t.turns >= 1 and sum(t.loss_mask) > 0
        assert len(t.prompt_ids) == prompt_tokens(problems["ab".index(t.group_id)])
        assert t.timings.generate_s > 0
        # the weights version of every sampled token crosses the wire (no update yet: 0)
        assert {v for v, m in zip(t.versions, t.loss_mask, strict=True) if m} == {0}
    # each engine holds two trajectories at most: the six spread over both
    assert {r.engine for r in first} == {"hf-0", "hf-1"}
    assert len(again) == 6
    assert {e.name for e in info.engines} == {"hf-0", "hf-1"}
    assert all(e.healthy and e.running == 0 and e.capacity is None for e in info.engines)


def test_a_service_that_cannot_take_weights_says_why_and_one_that_can_states_its_cap() -> None:
    from rstar2_rollout.weights import TensorInfo, WeightSpec

    payload = {"w": TensorInfo("F32", (2, 2))}
    sims = [SimEngine("engine-0", FAST)]
    no_engines = RolloutService(Scheduler(sims), produce, lambda p: 0)
    no_spec = RolloutService(Scheduler(sims), produce, lambda p: 0, engines=sims)
    for service, why in ((no_engines, "given no engines"), (no_spec, "knows no weight names")):
        with pytest.raises(WeightsUnsupported, match=why):
            service.check_weights(payload)
        with pytest.raises(WeightsUnsupported, match=why):
            service.max_weight_bytes()
    spec = WeightSpec(payload)
    able = RolloutService(Scheduler(sims), produce, lambda p: 0, engines=sims, weights=spec)
    able.check_weights(payload)
    assert able.max_weight_bytes() == spec.max_payload_bytes() > 16


def test_a_weight_update_waits_for_running_generations_and_holds_new_ones() -> None:
    import torch

    from rstar2_rollout.weights import InvalidWeights, TensorInfo, WeightSpec

    spec = WeightSpec({"w": TensorInfo("F32", (2, 2))})

    async def main():
        sims = [SimEngine(f"engine-{i}", FAST) for i in range(2)]
        service = RolloutService(
            Scheduler(sims), produce, lambda p: len(prompt_ids(p)), engines=sims, weights=spec
        )
        events: list[str] = []
        sampling = RolloutSampling(n=4, max_response_tokens=300)

        async def generate(tag: str) -> None:
            async for _ in service.generate(PROBLEMS, sampling):
                pass
            events.append(tag)

        first = asyncio.create_task(generate("first generation done"))
        await asyncio.sleep(TOOL_S / 2)  # the first generation is running
        update = asyncio.create_task(service.update_weights([("w", torch.ones(2, 2))]))
        await asyncio.sleep(0)
        second = asyncio.create_task(generate("second generation done"))
        done = await update
        events.append("update done")
        await asyncio.gather(first, second)
        with pytest.raises(InvalidWeights, match=r"'w' has shape \[3\]; the model's is \[2, 2\]"):
            await service.update_weights([("w", torch.ones(3))])
        return events, done

    events, done = asyncio.run(main())
    assert events == ["first generation done", "update done", "second generation done"]
    assert done.tensors == 1 and done.engines == ["engine-0", "engine-1"]

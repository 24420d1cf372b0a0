"""The transformers reference engine, and the whole loop on a real model and the real sandbox."""

from __future__ import annotations

import pytest

from rstar2_rollout import (
    Engine,
    HFEngineConfig,
    RolloutConfig,
    RolloutTask,
    SamplingParams,
    build_engine,
    run_agent,
)
from rstar2_rollout.chat import ChatFormat
from rstar2_rollout.engines.hf import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_model) -> HFEngine:
    built = build_engine(HFEngineConfig(model=str(tiny_model)))
    assert isinstance(built, HFEngine) and isinstance(built, Engine)
    return built


def test_greedy_is_deterministic_and_reports_logprobs(runner, engine, tokenizer):
    prompt = ChatFormat(tokenizer).prompt_ids("What is 1+1?")
    params = SamplingParams(max_tokens=12, temperature=0)
    a = runner.run(engine.generate(prompt, params, "a"))
    b = runner.run(engine.generate(prompt, params, "b"))
    assert a == b and len(a.token_ids) == len(a.logprobs) and a.finish_reason == "length"
    assert len(a.token_ids) == 12 and all(lp <= 0 for lp in a.logprobs)
    assert engine.kv_capacity() is None


def test_seeded_sampling_is_reproducible(runner, engine, tokenizer):
    prompt = ChatFormat(tokenizer).prompt_ids("q")
    run = lambda seed: runner.run(  # noqa: E731
        engine.generate(prompt, SamplingParams(max_tokens=16, seed=seed), "s")
    )
    assert run(1) == run(1) and run(1).token_ids != run(2).token_ids


def test_stops_at_a_stop_token_and_keeps_it(runner, engine, tokenizer):
    prompt = ChatFormat(tokenizer).prompt_ids("q")
    greedy = runner.run(engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0), "g"))
    stop = greedy.token_ids[3]
    params = SamplingParams(max_tokens=8, temperature=0, stop_token_ids=(stop,))
    cut = runner.run(engine.generate(prompt, params, "c"))
    first = greedy.token_ids.index(stop)
    assert cut.token_ids == greedy.token_ids[: first + 1] and cut.finish_reason == "stop"


def test_sampled_logprobs_are_the_tempered_ones_the_trainer_scores(
    runner, engine, tokenizer, score
):
    import torch

    prompt = ChatFormat(tokenizer).prompt_ids("Find 7! mod 11.")
    params = SamplingParams(max_tokens=24, temperature=0.7, seed=5, ignore_eos=True)
    got = runner.run(engine.generate(prompt, params, "t"))
    assert len(got.logprobs) == len(got.token_ids) == 24
    tempered = score(engine.model, prompt, got.token_ids, 0.7)  # [N]
    untempered = score(engine.model, prompt, got.token_ids, 1.0)  # [N]
    assert torch.tensor(got.logprobs) == pytest.approx(tempered, abs=1e-4)
    assert (torch.tensor(got.logprobs) - untempered).abs().max() > 0.05


def _full_distribution(model, prompt, tokens):  # [N, V] log-probabilities at temperature 1
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)])  # [1, P + N]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()  # [P + N, V]
    start = len(prompt) - 1
    return torch.log_softmax(logits[start : start + len(tokens)], dim=-1)


def test_samples_the_whole_distribution_and_reports_the_one_it_sampled(runner, engine, tokenizer):
    """On the random tiny model (2048 tokens, nearly flat) sampling at temperature 1 lands
    outside the 50 likeliest tokens as often as the full distribution says (transformers' default
    top_k of 50 would keep every token inside), and the logprobs are that distribution's; with
    top_p < 1 every token is in the nucleus and its logprob is renormalised over it."""
    import torch

    prompt = ChatFormat(tokenizer).prompt_ids("What is 2+2?")
    outside = expected = variance = 0.0
    for seed in range(4):
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, ignore_eos=True)
        got = runner.run(engine.generate(prompt, params, f"flat{seed}"))
        full = _full_distribution(engine.model, prompt, got.token_ids)  # [N, V]
        tokens = torch.tensor(got.token_ids)[:, None]  # [N, 1]
        top = full.topk(50, dim=-1)
        p_out = 1 - top.values.exp().sum(-1)  # [N]: the mass outside the top 50
        outside += float((top.indices != tokens).all(-1).sum())
        expected += float(p_out.sum())
        variance += float((p_out * (1 - p_out)).sum())
        assert torch.tensor(got.logprobs) == pytest.approx(full.gather(1, tokens)[:, 0], abs=1e-4)
    assert expected > 200  # the model is flat: most of the mass lies outside the top 50
    assert abs(outside - expected) < 4 * variance**0.5 + 1

    top_p = 0.3
    params = SamplingParams(max_tokens=60, temperature=1.0, top_p=top_p, seed=9, ignore_eos=True)
    got = runner.run(engine.generate(prompt, params, "nucleus"))
    full = _full_distribution(engine.model, prompt, got.token_ids)  # [N, V]
    probs, order = full.exp().sort(dim=-1, descending=True)  # [N, V]
    size = (probs.cumsum(-1) < top_p).sum(-1) + 1  # [N]: the smallest set holding top_p
    for row, token in enumerate(got.token_ids):
        nucleus = order[row, : size[row]]
        assert token in nucleus.tolist()
        mass = float(probs[row, : size[row]].sum())
        want = float(full[row, token]) - torch.log(torch.tensor(mass)).item()
        assert got.logprobs[row] == pytest.approx(want, abs=1e-4)


def test_update_weights_changes_the_output_and_back(runner, engine, tokenizer, tmp_path):
    import torch

    prompt = ChatFormat(tokenizer).prompt_ids("q")
    params = SamplingParams(max_tokens=10, temperature=0)
    before = runner.run(engine.generate(prompt, params, "x")).token_ids
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    shifted = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    version = engine.weights_version
    runner.run(engine.update_weights(shifted.items()))
    after = runner.run(engine.generate(prompt, params, "x"))
    runner.run(engine.update_weights(original.items()))
    assert after.token_ids != before and after.weights_version == version + 1
    back = runner.run(engine.generate(prompt, params, "x"))
    assert back.token_ids == before and back.weights_version == version + 2
    with pytest.raises(KeyError, match="no weight named 'nope'"):
        runner.run(engine.update_weights([("nope", torch.zeros(1))]))


def test_the_loop_end_to_end_on_the_real_model(runner, engine, sandbox, tokenizer, roll_out):
    config = RolloutConfig(n=2, max_turns=2, max_response_tokens=48, temperature=1.0, seed=3)
    trajs = runner.run(
        roll_out(engine, sandbox, tokenizer, config, [RolloutTask("p1", "What is 2+3?")])
    )
    for traj in trajs:
        traj.validate()
        assert traj.finish_reason in ("no_tool_call", "max_length", "answered", "max_turns")
        assert 0 < traj.sampled_tokens <= 48 and traj.timings.generate_s > 0
        sampled = {v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m}
        assert sampled == {engine.weights_version} == {traj.oldest_version}
    again = runner.run(
        roll_out(engine, sandbox, tokenizer, config, [RolloutTask("p1", "What is 2+3?")])
    )
    assert [t.response_ids for t in again] == [t.response_ids for t in trajs]  # seeded


def test_a_closed_engine_fails_its_requests_with_a_reason(runner, engine, sandbox, tokenizer):
    closed = HFEngine(engine.model, name="hf-closed")
    runner.run(closed.close())
    traj = runner.run(
        run_agent(closed, sandbox, tokenizer, RolloutTask("p", "q"), RolloutConfig(n=1))
    )
    assert (traj.finish_reason, traj.error) == ("error", "engine hf-closed closed")

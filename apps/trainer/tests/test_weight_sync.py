"""`push_weights` streams the policy's fp32 weights into a bf16 vLLM engine in bounded buckets.

The sync is checked by what the engine computes, not by reading its parameters (vLLM's CPU
backend may repack or drop a linear layer's `.weight` for its own kernels): the engine's
logprobs of its greedy tokens equal those of the policy's bf16 cast, and differ from them before
the sync."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

TOLERANCE = 0.1  # bf16 compute in vLLM against fp32 compute on the same bf16 weights


def _logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """`model`'s logprobs of `ids` after `prompt`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + j, t] for j, t in enumerate(ids)])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_bucketed_push_moves_the_bf16_size_and_the_engine_computes_the_bf16_cast(tmp_path):
    from transformers import AutoModelForCausalLM

    from rstar2_rollout import SamplingParams, VLLMEngineConfig
    from rstar2_rollout.buckets import iter_buckets
    from rstar2_rollout.engines.vllm import VLLMEngine
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.weights import push_weights

    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    state = policy.state_dict()
    bound = 100_000  # bytes: the tiny model's 2048x128 embedding (512 KiB in bf16) travels alone
    config = VLLMEngineConfig(
        model=str(model_dir), dtype="bfloat16", kv_cache_memory_bytes=32 << 20, max_model_len=512
    )
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=True)
    prompt = list(range(20, 40))

    async def scenario():
        engine = VLLMEngine(config)
        try:
            before = await engine.generate(prompt, params, "before")
            times = await push_weights([engine], state.items(), bucket_bytes=bound)
            after = await engine.generate(prompt, params, "after")
            return before, after, times
        finally:
            await engine.close()

    before, after, times = asyncio.run(scenario())
    assert times.bytes_moved == sum(t.numel() * 2 for t in state.values())  # bf16, not fp32
    expected = list(iter_buckets(state.items(), torch.bfloat16, bound))
    assert times.buckets == len(expected) > 2
    for bucket in expected:
        assert sum(t.numel() * 2 for _, t in bucket) <= bound or len(bucket) == 1
    assert after.token_ids != before.token_ids
    cast: Any = policy
    cast = cast.to(torch.bfloat16).float().eval()  # the engine's weights, computed in fp32
    engine_after = torch.tensor(after.logprobs)
    assert (engine_after - _logprobs(cast, prompt, after.token_ids)).abs().max() < TOLERANCE
    engine_before = torch.tensor(before.logprobs)
    assert (engine_before - _logprobs(cast, prompt, before.token_ids)).abs().max() > TOLERANCE
    metrics = times.as_metrics()
    assert metrics["sync_bytes"] == times.bytes_moved and metrics["time_sync_load_s"] > 0

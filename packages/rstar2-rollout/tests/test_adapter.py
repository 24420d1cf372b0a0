"""LoRA adapters (`Adapter`, `write_adapter`): the transformers engine through PEFT, vLLM's sizes.

The transformers engine after `load_adapter` must answer as the base with the adapter merged
(PEFT's `merge_and_unload`, an independent path); `lora_slot_rank` and `lora_buffer_bytes`
follow vLLM 0.32's rules (`vllm/config/lora.py`, `lora/layers/base_linear.py`).
"""

from __future__ import annotations

import pytest

from rstar2_rollout import Adapter, AdapterEngine, SamplingParams
from rstar2_rollout.adapter import is_adapter_folder, read_adapter, write_adapter
from rstar2_rollout.engines.hf import HFEngine
from rstar2_rollout.engines.startup import lora_buffer_bytes, lora_slot_rank

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _peft_adapter(tiny_model, rank=4):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    config = model.peft_config["default"].to_dict()
    config = {
        k: sorted(v) if isinstance(v, set) else getattr(v, "value", v) for k, v in config.items()
    }
    tensors = sorted(get_peft_model_state_dict(model).items())
    return Adapter([(n, t.clone()) for n, t in tensors], config), model.merge_and_unload()


def test_an_adapter_folder_round_trips(tmp_path, tiny_model):
    adapter, _ = _peft_adapter(tiny_model)
    folder = write_adapter(adapter, tmp_path / "a")
    assert is_adapter_folder(folder) and not is_adapter_folder(tmp_path)
    back = read_adapter(folder)
    assert back.config == adapter.config and back.nbytes == adapter.nbytes
    assert all(
        torch.equal(a, b) for (_, a), (_, b) in zip(adapter.tensors, back.tensors, strict=True)
    )


def test_the_transformers_engine_with_an_adapter_answers_as_the_merged_model(tiny_model):
    adapter, merged = _peft_adapter(tiny_model)
    engine = HFEngine(merged)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    prompt = [5, 17, 33, 40, 99, 100, 7]
    want = engine.generate_sync(prompt, params)
    from transformers import AutoModelForCausalLM

    served = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32))
    assert isinstance(served, AdapterEngine)
    before = served.generate_sync(prompt, params)
    served._load_adapter(adapter)
    got = served.generate_sync(prompt, params)
    assert got.token_ids == want.token_ids != before.token_ids
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    assert got.weights_version == 1


def test_vllm_lora_sizes_follow_its_rules():
    assert [lora_slot_rank(r) for r in (1, 2, 8, 9, 32, 300)] == [1, 8, 8, 16, 32, 320]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        lora_slot_rank(513)
    hf = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "num_hidden_layers": 3}  # fmt: skip
    # per layer and slot rank: q 64+64, k and v 64+32 each, o 64+64, gate and up 64+128 each,
    # down 128+64; two adapters, 2 bytes
    per_rank = 128 + 96 + 96 + 128 + 192 + 192 + 192
    assert lora_buffer_bytes(hf, 5) == 3 * 8 * per_rank * 2 * 2


def test_adapter_versions_go_to_shared_memory_only_where_three_fit(tmp_path, monkeypatch):
    """vLLM loads an adapter from a folder; /dev/shm keeps that in memory, but a container's is
    often 64 MB, and two versions live plus one being written must fit."""
    import shutil
    from collections import namedtuple

    from rstar2_rollout.engines._lora import adapter_dir_base

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(64 << 20, 0, 64 << 20))
    assert adapter_dir_base(tmp_path, 20 << 20) == str(tmp_path)  # 3 x 20 MB fit in 64 MB
    assert adapter_dir_base(tmp_path, 257 << 20) is None  # a 14B rank-32 adapter: the temp dir
    assert adapter_dir_base(tmp_path / "absent", 1) is None

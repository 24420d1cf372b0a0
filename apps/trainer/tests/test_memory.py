"""The per-device memory model: its arithmetic, the recipes it admits, and one real step."""

from __future__ import annotations

import pytest

from rstar2_trainer.config import load_config
from rstar2_trainer.training.memory import (
    GIB,
    MOMENTS,
    ModelShape,
    Setup,
    check_fits,
    fits,
    peak_bytes,
    setup_from_config,
    training_moments,
)

SMALL = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=32)
QWEN3_14B_JSON = {
    "model_type": "qwen3",
    "num_hidden_layers": 40,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
MI300X = 205_822_885_888
H100 = 81_559 * (1 << 20)


def test_parameter_count_equals_a_real_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # By hand: q 8x8, k and v 8x4 each, o 8x8, q/k norms 4 + 4, MLP 3 x 8 x 16, two norms 8 each.
    assert SMALL.block_params == 64 + 32 + 32 + 64 + 8 + 384 + 16 == 600
    assert SMALL.params == 2 * 600 + 2 * 32 * 8 + 8 == 1720
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=32,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=4,
            tie_word_embeddings=False,
        )
    )
    assert sum(p.numel() for p in model.parameters()) == SMALL.params


def test_training_terms_by_hand():
    s = Setup(
        model=SMALL,
        world_size=2,
        compute_bytes=2,
        checkpointing=False,
        micro_batch_tokens=40,
        row_tokens=20,
        response_tokens=16,
        padded=True,
        loss_chunk_tokens=8,
        kv_bytes=0,
        overhead_bytes=0,
    )
    t = peak_bytes(s).training_terms
    assert s.rows == 2
    assert (t["master"], t["grads"], t["adam"]) == (4 * 860, 4 * 860, 8 * 860)
    assert t["root_params"] == 2 * 520
    assert t["block_params"] == 2 * 2 * 600 + 6 * 600
    # A token of one block: norms 2 x (32 + 32), q norm 32 + 32, k norm 16 + 16, v 8,
    # RoPE 2 x 2 x 12, attention out 2 x 16, repeat_kv 2 x 16, MLP 4 x 2 x 16.
    per_token = 128 + 64 + 32 + 8 + 48 + 32 + 32 + 128
    assert t["activations"] == 2 * 40 * per_token
    assert t["attention_mask"] == 2 * 20 * 20
    assert t["final_norm"] == 40 * 8 * 8
    assert t["block_backward"] == 40 * 2 * (48 + 16)
    # Kept: 32 scored tokens x (2 x 8 + 24); chunk 8 x 32 x 12; fp32 + bf16 head gradient.
    assert t["loss"] == 32 * 40 + 8 * 32 * 12 + 6 * 32 * 8
    assert t["head_grad"] == 2 * 32 * 8 and t["recompute"] == 0
    assert t["optimizer_step"] == 4 * 860  # foreach AdamW: one fp32 tensor per parameter
    ckpt = peak_bytes(s.model_copy(update={"checkpointing": True})).training_terms
    assert ckpt["activations"] == 2 * 40 * 2 * 8 and ckpt["recompute"] == 40 * per_token


def test_the_training_peak_is_the_largest_moment_not_the_sum_of_terms():
    """The head's chunks, a recomputed block and AdamW's temporaries are never live together."""
    q14 = ModelShape.from_hf(QWEN3_14B_JSON)
    long = Setup(model=q14, world_size=8, row_tokens=13312, response_tokens=12288, kv_bytes=0)
    b = peak_bytes(long)
    moments = training_moments(b.training_terms)
    assert b.moment == "block_backward" and b.training == moments["block_backward"] + 8 * GIB
    state = sum(b.training_terms[k] for k in ("master", "grads", "adam"))
    assert moments["optimizer_step"] == state + b.training_terms["optimizer_step"]
    assert b.training < sum(b.training_terms.values())  # the old model summed them all
    assert {k for k, _ in b.largest(20)} <= {*MOMENTS["block_backward"], "overhead"}
    # One rank holding the whole state with short rows: AdamW's step is the peak.
    short = long.model_copy(update={"world_size": 1, "row_tokens": 1024, "response_tokens": 512})
    assert peak_bytes(short).moment == "optimizer_step"


def test_colocated_peak_is_the_larger_phase_and_offload_matters():
    s = Setup(
        model=ModelShape.from_hf(QWEN3_14B_JSON),
        world_size=8,
        row_tokens=13312,
        response_tokens=12288,
        kv_bytes=40 * GIB,
    )
    b = peak_bytes(s)
    assert b.peak == max(b.training, b.rollout)
    assert b.rollout_terms["training_state"] == 0  # offload on by default when colocated
    kept = peak_bytes(s.model_copy(update={"offload": False}))
    assert kept.rollout_terms["training_state"] == 16 * s.model.params // 8
    assert not fits(s.model_copy(update={"offload": False}), H100)


def test_the_paper_setups_fit_and_the_driver_alone_does_not():
    q14 = ModelShape.from_hf(QWEN3_14B_JSON)
    assert 14.7e9 < q14.params < 14.8e9  # Qwen3-14B: 14.8B parameters
    common = {"model": q14, "row_tokens": 1024 + 12288, "response_tokens": 12288}
    mi300x = Setup(world_size=64, micro_batch_tokens=32768, kv_bytes=96 * GIB, **common)
    h100 = Setup(world_size=8, micro_batch_tokens=32768, kv_bytes=40 * GIB, **common)
    assert fits(mi300x, MI300X) and fits(h100, H100)
    one_rank = h100.model_copy(update={"world_size": 1})
    assert not fits(one_rank, H100)  # 16 bytes x 14.8B of training state alone is 220 GiB


def test_check_fits_refuses_in_one_line_with_the_numbers():
    config = load_config("node-8gpu", ["cluster.train_workers=1"])  # one rank holds everything
    setup = setup_from_config(config, QWEN3_14B_JSON)
    assert setup.world_size == 1 and setup.placement == "colocated"
    with pytest.raises(ValueError) as err:
        check_fits(setup, H100, name="node-8gpu")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("node-8gpu needs ")
    assert "79.6 GiB" in line and "adam" in line


def test_setup_from_the_mi300x_recipe():
    setup = setup_from_config(load_config("qwen3-14b-mi300x"), QWEN3_14B_JSON)
    assert setup.micro_batch_tokens == 32768 and setup.response_tokens == 12288
    assert setup.kv_bytes == 96 * GIB and setup.compute_bytes == 2
    check_fits(setup, MI300X)  # fits: no error


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind",
    # The real vocabulary, and a small bf16 model where a fixed host cost inside the probe's
    # window (an import after its baseline added ~70 MiB once) is half the peak.
    ["v152k-h128-l2", "v8k-h128-l2-bf16"],
)
def test_a_real_steps_memory_above_its_state_is_within_15_percent_of_the_model(kind):
    """What a step adds above the state it starts from (AdamW's state exists after the warm-up
    step), predicted against measured. On the CPU the resting RSS also holds 20-40 MiB the model
    does not name (the allocator's and autograd's own), half of a small bf16 shape's peak; on a
    GPU the allocated bytes hold none of it (docs/RESULTS.md, "second GPU run")."""
    from rstar2_trainer.training.memory_probe import ProbeShape, measure, probe_setup

    small = kind == "v8k-h128-l2-bf16"
    shape = ProbeShape(  # about 220 s and 70 s on the shared 2-core machine
        name=kind,
        vocab=8192 if small else 151936,
        hidden=128,
        intermediate=384,
        layers=2,
        heads=2,
        kv_heads=1,
        head_dim=64,
        prompt_tokens=32,
        response_lengths=[224, 200, 224, 210],
        micro_batch_tokens=512,
        param_dtype="bfloat16" if small else "float32",
    )
    m = measure(shape)
    b = peak_bytes(probe_setup(shape))
    state = sum(b.training_terms[k] for k in ("master", "grads", "adam"))
    predicted, measured = b.training - state, m["measured_bytes"] - m["state_bytes"]
    assert abs(predicted / measured - 1) < 0.15, (predicted, measured)
    # The resting state, counted from its tensors, is what the model counts (RSS is not used
    # here: a host's allocator and swap move it by 100+ MiB either way at this size).
    resting = state - b.training_terms["grads"]  # freed after each step (set_to_none)
    assert abs(m["state_tensor_bytes"] / resting - 1) < 0.02, (m["state_tensor_bytes"], resting)


def test_a_gpu_run_that_does_not_fit_is_refused_before_anything_starts(tmp_path):
    """`placement.cluster.check_memory`: the recipe's peak against the GPU's memory, one line."""
    import json

    from rstar2_trainer.placement.cluster import ClusterError, check_memory

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_14B_JSON))
    config = load_config("node-8gpu", ["cluster.device_memory_gib=40"])
    assert config.cluster is not None
    with pytest.raises(ClusterError) as err:
        check_memory(config, tmp_path, config.cluster)
    assert "\n" not in str(err.value) and "but the device has 40.0 GiB" in str(err.value)
    roomy = load_config("node-8gpu", ["cluster.device_memory_gib=192"])
    assert roomy.cluster is not None
    check_memory(roomy, tmp_path, roomy.cluster)  # fits: nothing raised


def test_gpu1_on_a_40_gb_card_holds_with_the_recipes_lowered_allowance(tmp_path):
    """On one H200 the `gpu-1` step (Qwen3-1.7B, tied head, 6K) allocated 32.4 GiB and the
    allocator reserved 34.2 (padded rows): a 40 GB card holds it with the 4 GiB allowance the
    recipe ships (`cluster.memory_overhead_gib: 4`), though the default 8 GiB asks 40.2 for
    packed rows, which fill the 16,384-token budget (two padded 7K rows held 14,336 tokens and
    a 2 x 7K^2 mask: 40.1)."""
    import json

    from rstar2_trainer.placement.cluster import ClusterError, check_memory

    qwen3_17b = {
        **QWEN3_14B_JSON,
        "num_hidden_layers": 28,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(qwen3_17b))
    a100 = ["cluster.device_memory_gib=39.4"]  # torch's total_memory of an A100 40 GB
    config = load_config("gpu-1", a100)
    assert config.cluster is not None and config.cluster.memory_overhead_gib == 4
    check_memory(config, tmp_path, config.cluster)  # 36.2 GiB: fits
    default = load_config("gpu-1", [*a100, "cluster.memory_overhead_gib=8"])
    assert default.cluster is not None
    with pytest.raises(ClusterError, match=r"needs 40\.2 GiB"):
        check_memory(default, tmp_path, default.cluster)

"""Training packs its rows: the same loss and gradients as padded rows, and no pack-sized mask
(one of the GPU rules' topic files: test_gpu_rules.py lists them).

A packed micro-batch is one sequence of the rows concatenated, each row attending only to
itself; padded rows are the reference path (`packed=False`). On the tiny recipe's model shape
(fp32, CPU) the trainer's own `train_step` / `row_logprobs` give the same loss, metrics,
gradient norm and gradients either way within 1e-5, with the RL loss and with SFT's, in this
process and under FSDP2 with activation checkpointing (a gloo world of one; the two-rank
comparison is test_distributed.py's slow test, whose reference step runs padded rows). The
gradients are read as the change of the weights under SGD (lr 1024, so the change dwarfs the
weights' rounding), so the check does not depend on gradients outliving the step.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_algos import GrpoRocConfig
from rstar2_trainer.training.batching import (
    longest_first_chunks,
    pack_batch,
    response_logprobs,
    token_budget_chunks,
)
from rstar2_trainer.training.distributed import (
    DistributedConfig,
    Row,
    close_distributed,
    init_distributed,
    partition_indices,
    row_logprobs,
    shard_model,
    train_step,
)
from rstar2_trainer.training.sft import sft_loss
from rstar2_trainer.training.update import RLTokenLoss

TOL = 1e-5
LR = 1024.0
VOCAB = 2048


def tiny_model() -> Qwen3ForCausalLM:
    """The tiny recipe's model shape (configs/tiny.yaml, `build_tiny_model`), random weights."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).float()


def rl_rows(seed: int = 0) -> list[Row]:
    """Rows of very unequal lengths (3 to 150 tokens), tool output masked out of the loss,
    advantages of both signs, old and sampler logprobs (the ratio and the correction move)."""
    rng = random.Random(seed)
    rows = []
    for i, n in enumerate([150, 3, 40, 97, 12, 120, 66, 25]):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 20))]
        response = [rng.randrange(1, VOCAB) for _ in range(n)]
        mask = [0 if 5 <= j < 5 + i % 9 else 1 for j in range(n)]
        values = {
            "advantage": [(-1.0) ** i * (0.5 + 0.1 * i)] * n,
            "old_logp": [-7.6 + 0.2 * rng.random() for _ in range(n)],
            "behaviour_logp": [-7.6 + 0.2 * rng.random() for _ in range(n)],
        }
        rows.append(Row(prompt, response, mask, values))
    return rows


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p  # FSDP2's shards: the whole
        out[name] = full.detach().clone()
    return out


def _step(model: torch.nn.Module, rows: list[Row], loss, *, packed: bool, **kw):
    """One `train_step` under SGD: (result, gradient by parameter name)."""
    before = _weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    result = train_step(model, optimizer, rows, loss, pad_id=0, packed=packed, **kw)
    after = _weights(model)
    return result, {k: (before[k] - after[k]) / LR for k in before}


def _assert_same_step(packed, padded) -> None:
    (got, grads), (want, ref) = packed, padded
    assert got.tokens == want.tokens
    assert got.loss == pytest.approx(want.loss, rel=TOL, abs=TOL)
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=TOL)
    assert got.metrics.keys() == want.metrics.keys()
    for key, value in want.metrics.items():
        if key == "mismatch_ratio_max":  # a mean of per-micro-batch maxima: the grouping's own
            continue
        assert got.metrics[key] == pytest.approx(value, rel=TOL, abs=TOL), key
    scale = max(float(g.abs().max()) for g in ref.values())
    assert scale > 0
    for name, g in ref.items():
        assert float((grads[name] - g).abs().max()) <= TOL * scale, name


def test_packed_rl_step_equals_the_padded_step() -> None:
    """GRPO-RoC's loss (`RLTokenLoss`), entropy on, tempered, several micro-batches."""
    rows = rl_rows()
    loss = RLTokenLoss(GrpoRocConfig())
    kw = {
        "micro_batch_tokens": 256,
        "with_entropy": True,
        "temperature": 0.7,
        "normalize_by": loss.normalize_by,
    }
    packed = _step(tiny_model(), rows, loss, packed=True, **kw)
    padded = _step(tiny_model(), rows, loss, packed=False, **kw)
    assert packed[0].micro_batches > 1 and padded[0].micro_batches > packed[0].micro_batches
    _assert_same_step(packed, padded)
    assert "mismatch_kl" in packed[0].metrics  # the off-policy path ran on the pack too


def test_packed_sft_step_equals_the_padded_step() -> None:
    ids = [[*r.prompt_ids, *r.response_ids] for r in rl_rows(1)]
    rows = [Row(i[:1], i[1:], [1] * (len(i) - 1)) for i in ids]  # as `sft.sft_rows` makes them
    kw = {"micro_batch_tokens": 200, "grouping": longest_first_chunks}
    packed = _step(tiny_model(), rows, sft_loss, packed=True, **kw)
    padded = _step(tiny_model(), rows, sft_loss, packed=False, **kw)
    _assert_same_step(packed, padded)


def test_packed_row_logprobs_equal_the_padded_ones() -> None:
    model, rows = tiny_model(), rl_rows(2)
    packed = row_logprobs(model, rows, pad_id=0, micro_batch_tokens=300, temperature=0.7)
    padded = row_logprobs(
        model, rows, pad_id=0, micro_batch_tokens=300, temperature=0.7, packed=False
    )
    for got, want, row in zip(packed, padded, rows, strict=True):
        assert len(got) == len(want) == len(row.response_ids)
        for g, w, m in zip(got, want, row.loss_mask, strict=True):
            assert g == pytest.approx(w, abs=TOL) if m else g == w == 0.0


def test_packed_fsdp2_step_with_checkpointing_equals_the_padded_step() -> None:
    """FSDP2 (gloo, a world of one) with each block recomputed in backward: the recompute runs
    the same per-row attention as the forward (the attention is chosen by the model's config,
    not by the call)."""
    config = DistributedConfig(device="cpu", activation_checkpointing=True)
    world = init_distributed(config)
    try:
        loss = RLTokenLoss(GrpoRocConfig())
        kw = {"micro_batch_tokens": 256, "with_entropy": True, "normalize_by": "tokens"}
        packed = _step(
            shard_model(tiny_model(), config, world), rl_rows(3), loss, packed=True, **kw
        )
        padded = _step(
            shard_model(tiny_model(), config, world), rl_rows(3), loss, packed=False, **kw
        )
    finally:
        close_distributed()
    _assert_same_step(packed, padded)


class _Shapes(TorchDispatchMode):
    """Records every op's output shapes and the inputs of every attention kernel call."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.attention: list[tuple[tuple[int, ...], bool]] = []  # (query shape, has a mask)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if "scaled_dot_product" in name and "backward" not in name:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.attention.append((tuple(args[0].shape), isinstance(mask, torch.Tensor)))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def _square(shapes: list[tuple[int, ...]], size: int) -> list[tuple[int, ...]]:
    """Shapes whose last two dimensions are both at least `size` (an L x L mask or scores)."""
    return [s for s in shapes if len(s) >= 2 and min(s[-2:]) >= size]


def test_a_pack_never_builds_a_pack_sized_mask_and_attends_row_by_row() -> None:
    rows = rl_rows(4)
    batch = pack_batch(
        [r.prompt_ids for r in rows],
        [r.response_ids for r in rows],
        [r.loss_mask for r in rows],
        0,
    )
    m, longest = batch.input_ids.shape[1], batch.longest
    assert m > 2 * longest  # the pack is much longer than its longest row
    model = tiny_model()
    with _Shapes() as seen:
        logp, _ = response_logprobs(model, batch, with_entropy=True)
        logp.sum().backward()
    assert _square(seen.shapes, m) == []  # no [.., M, M] tensor in forward or backward
    assert seen.attention and all(not mask for _, mask in seen.attention)
    assert max(shape[2] for shape, _ in seen.attention) <= longest  # one row at a time
    assert len(seen.attention) == 4 * len(rows)  # every row, in each of the four blocks
    # The detector works: transformers' own packed-sequence path (sdpa, position ids that
    # restart, no cu_seq_lens) builds the [1, 1, M, M] block-diagonal mask a pack must not.
    plain = tiny_model()
    with _Shapes() as sdpa, torch.no_grad():
        plain(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    assert plain.config._attn_implementation == "sdpa"
    assert (1, 1, m, m) in _square(sdpa.shapes, m)


def test_a_pack_holds_at_most_its_budget_and_ranks_stay_balanced() -> None:
    """Stage-3-like lengths (hundreds of tokens to the 12K cap) over 8 ranks: every row once,
    each pack within the budget (a longer row alone), packed micro-batches no more than padded
    ones on any rank, and the ranks' counts within one of each other (the zero-weighted
    repeats that even them out are then at most one per rank)."""
    rng = random.Random(0)
    lengths = [min(12288, int(rng.lognormvariate(8.6, 0.7))) + 300 for _ in range(768)]
    rows = [Row([1] * 300, [1] * (n - 300), [1] * (n - 300)) for n in lengths]
    budget = 32768
    counts = {True: [], False: []}
    for part in partition_indices(rows, 8):
        own = [lengths[i] for i in part]
        for packed in (True, False):
            chunks = list(token_budget_chunks(own, budget, packed=packed))
            assert sorted(i for c in chunks for i in c) == list(range(len(own)))
            counts[packed].append(len(chunks))
            if packed:
                for c in chunks:
                    assert len(c) == 1 or sum(own[i] for i in c) <= budget
    assert max(counts[True]) - min(counts[True]) <= 1
    assert all(p <= q for p, q in zip(counts[True], counts[False], strict=True))
    assert sum(counts[True]) < sum(counts[False])


def test_the_memory_model_counts_a_pack_without_mask_or_repeated_heads() -> None:
    """By hand, on test_memory.py's small shape: a pack fills the budget with its rows' own
    tokens, keeps no mask and no copied k/v heads; recipes are modelled packed."""
    from rstar2_trainer.config import load_config
    from rstar2_trainer.training.memory import ModelShape, Setup, setup_from_config, training_terms

    small = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4,
                       vocab=32)  # fmt: skip
    common = {"model": small, "compute_bytes": 2, "checkpointing": False, "kv_bytes": 0}
    padded = Setup(micro_batch_tokens=50, row_tokens=20, response_tokens=16, padded=True, **common)
    packed = padded.model_copy(update={"padded": False})
    assert (padded.tokens, padded.scored) == (40, 32)  # two rows of 20, a third does not fit
    assert (packed.tokens, packed.scored) == (50, 40)  # the budget, its scored share
    pad, pack = training_terms(padded), training_terms(packed)
    assert pad["attention_mask"] == 2 * 20 * 20 and pack["attention_mask"] == 0
    # A token of one block: padded 472 bytes (test_memory.py), packed less repeat_kv's 2 x 2 x 8.
    assert pad["activations"] == 2 * 40 * 472 and pack["activations"] == 2 * 50 * (472 - 32)
    assert packed.model_copy(update={"pack_tokens": 45}).tokens == 45  # a known largest pack
    long_row = packed.model_copy(update={"row_tokens": 80, "response_tokens": 64})
    assert long_row.tokens == 80  # a row over the budget is a micro-batch alone
    recipe = setup_from_config(load_config("qwen3-14b-mi300x"), {
        "num_hidden_layers": 40, "hidden_size": 5120, "intermediate_size": 17408,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936})  # fmt: skip
    assert not recipe.padded and recipe.tokens == recipe.micro_batch_tokens == 32768


def test_the_mask_function_skips_a_whole_forward_in_either_calling_convention() -> None:
    """transformers 5.19 passes q_length/q_offset, older releases cache_position: a forward over
    a whole sequence without a padding mask gets no mask either way; a padded batch gets sdpa's."""
    from transformers.masking_utils import causal_mask_function

    from rstar2_trainer.training.attention import packed_mask

    common = {"batch_size": 1, "kv_length": 6, "kv_offset": 0, "attention_mask": None,
              "mask_function": causal_mask_function, "device": torch.device("cpu")}  # fmt: skip
    assert packed_mask(q_length=6, q_offset=0, **common) is None
    assert packed_mask(cache_position=torch.arange(6), **common) is None
    padding = torch.tensor([[True, True, True, True, False, False]])
    mask = packed_mask(q_length=6, q_offset=0, **{**common, "attention_mask": padding})
    assert mask is not None and mask.shape == (1, 1, 6, 6) and not bool(mask[0, 0, 5, 5])

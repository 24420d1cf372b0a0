"""The chunked head gives the losses and gradients of the plain log-softmax, and keeps little.

`reference_logprobs` is the formula `response_logprobs` used before the chunked head: the model's
[B, P, V] logits, an fp32 log-softmax over every scored token, the entropy from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_trainer.training.batching import TokenBatch, make_batch, response_logprobs
from rstar2_trainer.training.distributed import MicroBatch, Row, train_step
from rstar2_trainer.training.head_logprobs import head_logprobs


def reference_logprobs(
    model: torch.nn.Module, batch: TokenBatch, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:  # [B, T], [B, T]
    b, t = batch.response_ids.shape
    offsets = batch.response_start[:, None] - 1 + torch.arange(t)[None, :]  # [B, T]
    offsets = offsets.clamp(min=0, max=batch.input_ids.shape[1] - 1)
    keep = batch.response_mask > 0  # [B, T]
    rows = torch.arange(b)[:, None].expand(b, t)[keep]  # [N]
    cols = offsets[keep]  # [N]
    positions = torch.unique(cols)  # [P]
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=positions
    ).logits  # [B, P, V]
    picked_logits = logits[rows, torch.searchsorted(positions, cols)]  # [N, V]
    if temperature != 1.0:
        picked_logits = picked_logits / temperature
    logp_all = torch.log_softmax(picked_logits.float(), dim=-1)  # [N, V]
    picked = logp_all.gather(1, batch.response_ids[keep][:, None]).squeeze(1)  # [N]
    ent = -(logp_all.exp() * logp_all).sum(-1)  # [N]
    logp = torch.zeros((b, t)).masked_scatter(keep, picked)
    entropy = torch.zeros((b, t)).masked_scatter(keep, ent)
    return logp, entropy


def _model(tied: bool = False) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=tied,
    )
    model = Qwen3ForCausalLM(config).float()
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def _batch() -> TokenBatch:
    prompts = [[1, 2, 3], [4, 5], [7, 8, 9, 10]]
    responses = [[6, 7, 8, 9, 11, 12], [10, 11], [40, 50, 60, 70, 80]]
    masks = [[1, 0, 1, 1, 1, 1], [1, 1], [1, 1, 0, 0, 1]]
    return make_batch(prompts, responses, masks, pad_id=0)


def _loss_and_grads(model, batch, logprobs_fn, **kw) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp, entropy = logprobs_fn(model, batch, **kw)
    assert entropy is not None
    weights = torch.linspace(-1.0, 2.0, logp.numel()).reshape(logp.shape)  # [B, T]
    # A policy-gradient-like term plus an entropy bonus: both gradients are exercised.
    loss = (logp * weights).sum() - 0.3 * (entropy * batch.response_mask).sum()
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    return loss.detach(), grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied", [False, True])
def test_chunked_head_equals_the_plain_log_softmax(temperature: float, tied: bool) -> None:
    model, batch = _model(tied), _batch()
    ref_loss, ref_grads = _loss_and_grads(model, batch, reference_logprobs, temperature=temperature)
    loss, grads = _loss_and_grads(
        model,
        batch,
        response_logprobs,
        with_entropy=True,
        temperature=temperature,
        chunk_tokens=4,  # 13 scored tokens: several chunks and a ragged last one
    )
    assert _rel(loss, ref_loss) < 1e-5
    assert len(grads) == len(ref_grads) == len(list(model.parameters()))
    for g, ref in zip(grads, ref_grads, strict=True):
        assert _rel(g, ref) < 1e-5


def test_logprobs_match_and_the_head_is_restored() -> None:
    model, batch = _model(), _batch()
    with torch.no_grad():
        logp, entropy = response_logprobs(model, batch, with_entropy=True, chunk_tokens=5)
        ref_logp, ref_entropy = reference_logprobs(model, batch)
        plain = model(input_ids=batch.input_ids).logits  # the head is an ordinary Linear again
    assert entropy is not None
    assert _rel(logp, ref_logp) < 1e-5 and _rel(entropy, ref_entropy) < 1e-5
    assert plain.shape == (*batch.input_ids.shape, 96)
    assert "forward" not in model.lm_head.__dict__


def test_a_head_with_bias_gets_exact_gradients() -> None:
    torch.manual_seed(1)
    hidden = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)  # [N, H]
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)  # [V, H]
    bias = torch.randn(11, dtype=torch.float64, requires_grad=True)  # [V]
    targets = torch.randint(0, 11, (7,))

    def f(h, w, b) -> tuple[torch.Tensor, torch.Tensor]:
        logp, entropy = head_logprobs(h, w, b, targets, temperature=0.8, chunk_tokens=3)
        assert entropy is not None
        return logp, entropy

    assert torch.autograd.gradcheck(f, (hidden, weight, bias))


@pytest.mark.slow  # ~15 s alone, 35 s on a loaded machine
def test_a_real_vocabulary_keeps_under_two_bytes_per_vocab_entry_a_token() -> None:
    """Qwen's 151,936-token vocabulary, 1,024 loss tokens, bf16: what autograd keeps per token."""
    vocab, tokens = 151_936, 1024
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16)  # pyright: ignore[reportArgumentType]
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(0, vocab, (tokens // 2,), generator=g).tolist() for _ in range(2)]
    batch = make_batch([[5, 6, 7]] * 2, responses, [[1] * (tokens // 2)] * 2, pad_id=0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, entropy = response_logprobs(model, batch, with_entropy=True)
    assert entropy is not None and logp.requires_grad
    assert bool((entropy[batch.response_mask > 0] > 11.0).all())  # ~log V at random init
    per_token = sum(kept.values()) / tokens
    assert per_token <= 2 * vocab  # the [N, V] fp32 log-softmax alone would be 4 x V


@dataclass(frozen=True)
class _EntropyBonus:
    """A loss that is only an entropy bonus: its gradient exists only through the entropy."""

    entropy_grad: bool = True

    def __call__(self, logp: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        assert mb.entropy is not None
        return -0.5 * mb.entropy + 0.0 * logp  # [B, T]


def test_train_step_gives_an_entropy_bonus_its_gradient() -> None:
    batch = _batch()
    rows = [
        Row(p, r, m)
        for p, r, m in zip(
            [[1, 2, 3], [4, 5], [7, 8, 9, 10]],
            [[6, 7, 8, 9, 11, 12], [10, 11], [40, 50, 60, 70, 80]],
            [[1, 0, 1, 1, 1, 1], [1, 1], [1, 1, 0, 0, 1]],
            strict=True,
        )
    ]
    model = _model()
    _, entropy = reference_logprobs(model, batch)
    (-0.5 * (entropy * batch.response_mask).sum() / batch.response_mask.sum()).backward()
    want = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    got = _step_grads(model, lambda: train_step(
        model, optimizer, rows, _EntropyBonus(), pad_id=0, micro_batch_tokens=16, with_entropy=True
    ))  # fmt: skip
    assert len(got) == len(want) > 0
    for g, ref in zip(got, want, strict=True):
        assert _rel(g, ref) < 1e-5
    # Detached (the entropy as a metric), the bonus gives no gradient at all.
    detached = _step_grads(model, lambda: train_step(
        model, optimizer, rows, _EntropyBonus(entropy_grad=False), pad_id=0,
        micro_batch_tokens=16, with_entropy=True,
    ))  # fmt: skip
    assert len(detached) == len(want) and all(float(g.abs().max()) == 0.0 for g in detached)


def _step_grads(model: torch.nn.Module, run: Any) -> list[torch.Tensor]:
    """The gradients `run()` (a `train_step`) accumulated, parameter by parameter, as they
    land: the step frees them right after its optimizer step."""
    seen: dict[int, torch.Tensor] = {}
    params = list(model.parameters())
    handles = [
        p.register_post_accumulate_grad_hook(
            lambda p, i=i: seen.__setitem__(i, p.grad.detach().clone())  # pyright: ignore[reportOptionalMemberAccess]
        )
        for i, p in enumerate(params)
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return [seen[i] for i in sorted(seen)]


def test_without_the_entropy_the_logprobs_and_gradients_are_unchanged() -> None:
    model, batch = _model(), _batch()

    def nll_and_grads(**kw) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logp, entropy = response_logprobs(model, batch, chunk_tokens=4, **kw)
        assert (entropy is None) == (not kw["with_entropy"])
        loss = -(logp * batch.response_mask).sum()  # the SFT loss
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]  # pyright: ignore[reportOptionalMemberAccess]

    loss, grads = nll_and_grads(with_entropy=False)
    ref_loss, ref_grads = nll_and_grads(with_entropy=True)
    assert _rel(loss, ref_loss) < 1e-6
    for g, ref in zip(grads, ref_grads, strict=True):
        assert _rel(g, ref) < 1e-6

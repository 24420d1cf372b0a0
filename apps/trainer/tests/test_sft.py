"""SFT micro-batches: grouping a step's examples by length changes the cost, not the loss."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.sft import loss_sum, micro_batches, sft_batches, train_sft
from rstar2_trainer.training.precision import FP32_CPU


def _examples() -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in (7, 19, 4, 30, 12):
        ids = torch.randint(3, 500, (n,), generator=gen).tolist()
        mask = [0] * (n // 3) + [1] * (n - n // 3)  # a prompt, then the assistant's tokens
        out.append((ids, mask))
    return out


def test_micro_batches_respect_the_budget_and_keep_every_example():
    examples = _examples()
    groups = micro_batches(examples, max_tokens=40)
    assert sorted(len(e[0]) for g in groups for e in g) == sorted(len(e[0]) for e in examples)
    assert all(len(g) * max(len(e[0]) for e in g) <= 40 for g in groups if len(g) > 1)
    assert len(groups) < len(examples)
    assert [len(g) for g in micro_batches(examples, max_tokens=1)] == [1] * 5  # each alone


def test_grouping_gives_the_loss_and_gradient_of_each_example_alone(tmp_path):
    model_dir = build_tiny_model(tmp_path / "m", seed=0, vocab_size=512, layers=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    examples = _examples()
    alone = torch.stack([loss_sum(model, [e], FP32_CPU) for e in examples]).sum()
    alone.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    groups = micro_batches(examples, max_tokens=64)
    assert len(groups) < len(examples)  # the examples really share forward passes
    grouped = torch.stack([loss_sum(model, g, FP32_CPU) for g in groups]).sum()
    grouped.backward()
    got, expected = float(grouped.detach()), float(alone.detach())
    assert abs(got - expected) < 1e-5 * expected
    for name, grad in want.items():
        now = dict(model.named_parameters())[name].grad
        assert now is not None
        assert (now - grad).abs().max() <= 1e-4 * grad.abs().max() + 1e-7, (
            name,
            (now - grad).abs().max(),
            grad.abs().max(),
        )


def test_train_sft_lowers_the_loss_with_fewer_forwards_than_examples(tmp_path):
    model_dir = build_tiny_model(tmp_path / "m", seed=0, vocab_size=512, layers=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    examples = _examples() * 4
    result = train_sft(
        model,
        examples,
        epochs=3,
        batch_size=10,
        lr=3e-3,
        warmup_ratio=0.1,
        seed=0,
        micro_batch_tokens=128,
    )
    assert result.steps == 6 and result.micro_batches < 3 * len(examples)
    assert result.last_loss < result.first_loss


def test_sft_batches_are_seeded_epochs_and_a_small_tail_joins_the_last_batch():
    plain = sft_batches(9, epochs=2, batch_size=4, seed=0)
    assert [len(b) for b in plain] == [4, 4, 1, 4, 4, 1]
    assert sorted(i for b in plain[:3] for i in b) == list(range(9))
    assert plain == sft_batches(9, epochs=2, batch_size=4, seed=0)
    assert plain != sft_batches(9, epochs=2, batch_size=4, seed=1)
    ranks = sft_batches(9, epochs=2, batch_size=4, seed=0, min_size=2)
    assert [len(b) for b in ranks] == [4, 5, 4, 5]  # each of 2 ranks needs one example
    assert [set(b) for b in ranks] == [
        set(plain[0]),
        set(plain[1] + plain[2]),
        set(plain[3]),
        set(plain[4] + plain[5]),
    ]

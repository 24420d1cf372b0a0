"""SFT runs through `train_step`: the same losses and weights as the driver's old loop."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.training.sft import cosine_with_warmup, sft_batches, sft_rows, train_sft


def _examples() -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in (7, 19, 4, 30, 12):
        ids = torch.randint(3, 500, (n,), generator=gen).tolist()
        mask = [0] * (n // 3) + [1] * (n - n // 3)  # a prompt, then the assistant's tokens
        out.append((ids, mask))
    return out


def _old_loop(model, examples, *, epochs, batch_size, lr, warmup_ratio, seed, micro_batch_tokens):
    """The driver's SFT loop before it ran through `train_step` (its own micro-batching, longest
    first; each micro-batch's summed NLL over the step's loss tokens; clip; AdamW + LambdaLR):
    the losses the tiny default recipe was measured with."""
    from rstar2_trainer.training.batching import make_batch, response_logprobs

    def groups(picked):
        out, width = [], 0
        for ids, mask in sorted(picked, key=lambda e: -len(e[0])):
            if out and (len(out[-1]) + 1) * width <= micro_batch_tokens:
                out[-1].append((ids, mask))
            else:
                out.append([(ids, mask)])
                width = len(ids)
        return out

    batches = sft_batches(len(examples), epochs=epochs, batch_size=batch_size, seed=seed)
    total, warmup = len(batches), max(1, int(len(batches) * warmup_ratio))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_with_warmup(s, total, warmup)
    )
    model.train()
    losses = []
    for indices in batches:
        picked = [examples[i] for i in indices]
        n = sum(sum(mask[1:]) for _, mask in picked)
        optimizer.zero_grad(set_to_none=True)
        value = 0.0
        for rows in groups(picked):
            batch = make_batch(
                [i[:1] for i, _ in rows], [i[1:] for i, _ in rows], [m[1:] for _, m in rows], 0
            )
            logp, _ = response_logprobs(model, batch)  # [B, T]
            loss = -(logp * batch.response_mask).sum() / n
            loss.backward()
            value += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(value)
    return losses


def test_sft_through_train_step_keeps_the_old_loops_losses_and_weights(tmp_path):
    model_dir = build_tiny_model(tmp_path / "m", seed=0, vocab_size=512, layers=2)
    examples = _examples() * 3
    settings: dict = {"epochs": 3, "batch_size": 6, "lr": 3e-3, "warmup_ratio": 0.2, "seed": 0}
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    want = _old_loop(old, examples, micro_batch_tokens=64, **settings)
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    got: list[float] = []
    result = train_sft(
        new, examples, micro_batch_tokens=64, on_step=lambda s, t, loss: got.append(loss),
        **settings,
    )  # fmt: skip
    assert result.steps == len(want) == 9 and result.micro_batches < 9 * 6  # grouped forwards
    # Packed rows, grouped by their own tokens, against the old loop's padded rows: equal up to
    # float reassociation, which nine AdamW steps at lr 3e-3 carry to ~1e-6 of the loss and
    # 2.5e-5 of a weight (one step moves a weight by up to 3e-3).
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert result.last_loss < result.first_loss - 0.5
    for (name, p), q in zip(new.named_parameters(), old.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-5, msg=name)


def test_a_mask_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="one loss-mask entry per token"):
        sft_rows([([1, 2, 3], [1, 1])])


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

"""Non-reasoning SFT: teach the chat and tool-call format on (input ids, loss mask) examples.

Token-level cross-entropy over the assistant tokens only (loss mask 1), AdamW with linear warm-up
and cosine decay (the paper's SFT schedule, scaled down). The examples are conversations encoded
by the rollout package's chat template (`encode_conversation`), so the model learns exactly the
token stream the agent loop will later produce.

One optimizer step takes `batch_size` examples. They are grouped by length into micro-batches of
at most `micro_batch_tokens` padded tokens (an example longer than that is a micro-batch of its
own); each micro-batch is one forward and backward (gradient accumulation), and the step's loss
is the token mean over all of its loss tokens, so the grouping changes the cost (less padding,
bounded memory), not the loss. Examples are not packed into one row: transformers' packed-sequence
path (position ids restarting, no attention mask) did not keep examples apart in our check (an
example's logits moved by up to 1.06 beside a neighbour), so each example keeps its own row.

The model must already be on `precision.device`; bf16 runs the forward under autocast with fp32
master weights (see `precision`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rstar2_trainer.training.batching import make_batch, response_logprobs
from rstar2_trainer.training.precision import FP32_CPU, Precision

Example = tuple[list[int], list[int]]  # token ids, loss mask (1: an assistant token to learn)
OnStep = Callable[[int, int, float], None]  # (step, total steps, the step's loss)
MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class SFTResult:
    steps: int
    first_loss: float
    last_loss: float
    tokens: int
    micro_batches: int  # forward passes


def micro_batches(examples: Sequence[Example], max_tokens: int) -> list[list[Example]]:
    """`examples` grouped longest first into micro-batches of at most `max_tokens` padded tokens."""
    out: list[list[Example]] = []
    width = 0
    for i in sorted(range(len(examples)), key=lambda i: -len(examples[i][0])):
        ids, mask = examples[i]
        if len(mask) != len(ids):
            raise ValueError("every example needs one loss-mask entry per token")
        if out and (len(out[-1]) + 1) * width <= max_tokens:
            out[-1].append(examples[i])
        else:
            out.append([examples[i]])
            width = len(ids)  # the longest of the new micro-batch
    return out


def loss_sum(model: torch.nn.Module, rows: Sequence[Example], precision: Precision) -> torch.Tensor:
    """The summed negative log-likelihood of the loss tokens of `rows` (a 0-dim tensor)."""
    # Score every token after the first as a "response" of a one-token prompt.
    batch = precision.batch(
        make_batch(
            [ids[:1] for ids, _ in rows],
            [ids[1:] for ids, _ in rows],
            [mask[1:] for _, mask in rows],
            0,
        )
    )
    with precision.autocast():
        logp, _ = response_logprobs(model, batch)  # [B, T]
    return -(logp * batch.response_mask).sum()


def cosine_with_warmup(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def sft_batches(
    count: int, *, epochs: int, batch_size: int, seed: int, min_size: int = 1
) -> list[list[int]]:
    """The example indices of every SFT step: each epoch a seeded shuffle cut into `batch_size`
    pieces; a last piece smaller than `min_size` (the training ranks: each needs one example)
    joins the piece before it."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    for _ in range(epochs):
        order = list(range(count))
        rng.shuffle(order)
        pieces = [order[i : i + batch_size] for i in range(0, count, batch_size)]
        if len(pieces) > 1 and len(pieces[-1]) < min_size:
            tail = pieces.pop()
            pieces[-1] += tail
        out += pieces
    return out


def train_sft(
    model: torch.nn.Module,
    examples: Sequence[Example],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup_ratio: float,
    seed: int,
    micro_batch_tokens: int = 4096,
    on_step: OnStep | None = None,
    precision: Precision = FP32_CPU,
) -> SFTResult:
    """Train `model` in place on `examples`; return the loss trajectory."""
    batches = sft_batches(len(examples), epochs=epochs, batch_size=batch_size, seed=seed)
    total = len(batches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, int(total * warmup_ratio))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_with_warmup(s, total, warmup)
    )
    model.train()
    step, first, last, tokens, forwards = 0, float("nan"), float("nan"), 0, 0
    for indices in batches:
        picked = [examples[i] for i in indices]
        groups = micro_batches(picked, micro_batch_tokens)
        n = sum(sum(mask[1:]) for _, mask in picked)
        optimizer.zero_grad(set_to_none=True)
        value = 0.0
        for rows in groups:
            loss = loss_sum(model, rows, precision) / max(1, n)
            loss.backward()
            value += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        first = value if step == 0 else first
        last = value
        tokens += n
        forwards += len(groups)
        step += 1
        if on_step is not None:
            on_step(step, total, value)
    model.eval()
    return SFTResult(
        steps=step, first_loss=first, last_loss=last, tokens=tokens, micro_batches=forwards
    )

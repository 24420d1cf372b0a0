"""Non-reasoning SFT: teach the chat and tool-call format on (input ids, loss mask) examples.

Token-level cross-entropy over the assistant tokens only (loss mask 1), AdamW with linear warm-up
and cosine decay (the paper's SFT schedule, scaled down). The examples are conversations encoded
by the rollout package's chat template (`encode_conversation`), so the model learns exactly the
token stream the agent loop will later produce.

One SFT loop, `sft_loop(step, examples, ...)`, for the driver and the FSDP2 ranks alike: the
seeded batches (`sft_batches`), the cosine schedule, and for each batch one call of `step(rows,
lr)`, which is `distributed.train_step` with `sft_loss` (in this process as a world of one, or
on the ranks). Each example is a row whose "response" is every token after the first; the step's
loss is the token mean over all of the batch's loss tokens, the gradient norm clipped to
`MAX_GRAD_NORM`. `train_step` groups rows longest first (`longest_first_chunks`) into
micro-batches of at most `micro_batch_tokens` of their own tokens (a longer example is a
micro-batch of its own), each packed into one sequence, one forward and backward each (gradient
accumulation), so the grouping changes the cost, not the loss. A pack keeps its examples apart:
attention runs within each example (`training/attention.py`), without the [M, M] mask that
transformers' own packed-sequence path builds from position ids that restart.

`train_sft(model, examples, ...)` runs that loop on a model in this process (already on
`precision.device`; bf16 runs the forward under autocast with fp32 master weights).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rstar2_trainer.training.distributed import Row, StepResult, longest_first_chunks, train_step
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


def sft_loss(logp: torch.Tensor, mb: Any) -> torch.Tensor:
    """The SFT cross-entropy as a per-token loss: -log p of each response token."""
    return -logp  # [B, T]


def sft_rows(examples: Sequence[Example]) -> list[Row]:
    """Each example as a row: every token after the first is scored, as a one-token prompt's
    response, and enters the loss where its mask is 1."""
    for ids, mask in examples:
        if len(mask) != len(ids):
            raise ValueError("every example needs one loss-mask entry per token")
    return [Row(ids[:1], ids[1:], mask[1:]) for ids, mask in examples]


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


SFTStep = Callable[[list[Row], float], Awaitable[StepResult]]  # (rows, lr) -> one step


async def sft_loop(
    step: SFTStep,
    examples: Sequence[Example],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup_ratio: float,
    seed: int,
    min_size: int = 1,
    on_step: OnStep | None = None,
) -> SFTResult:
    """SFT's steps: each seeded batch (at least `min_size` examples, one per rank) one `step`
    at the scheduled learning rate; the loss trajectory."""
    batches = sft_batches(
        len(examples), epochs=epochs, batch_size=batch_size, seed=seed, min_size=min_size
    )
    if not batches or len(batches[0]) < min_size:
        raise ValueError(
            f"{len(examples)} SFT examples cannot give each of {min_size} training workers one; "
            "raise sft.batch_size or add examples"
        )
    total = len(batches)
    warmup = max(1, int(total * warmup_ratio))
    first = last = float("nan")
    tokens = forwards = 0
    for k, indices in enumerate(batches):
        rows = sft_rows([examples[i] for i in indices])
        result = await step(rows, lr * cosine_with_warmup(k, total, warmup))
        first = result.loss if k == 0 else first
        last = result.loss
        tokens += result.tokens
        forwards += result.micro_batches
        if on_step is not None:
            on_step(k + 1, total, result.loss)
    return SFTResult(total, first, last, tokens, forwards)


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
    pad_id: int = 0,
) -> SFTResult:
    """Train `model` in place on `examples` (`sft_loop` in this process, its own AdamW)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    step = driver_sft_step(model, optimizer, micro_batch_tokens, precision, pad_id=pad_id)
    result = asyncio.run(
        sft_loop(
            step,
            examples,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            warmup_ratio=warmup_ratio,
            seed=seed,
            on_step=on_step,
        )
    )
    model.eval()
    return result


def driver_sft_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batch_tokens: int,
    precision: Precision,
    *,
    pad_id: int,
) -> SFTStep:
    """`train_step` with `sft_loss` on `model` in this process (a world of one)."""

    async def step(rows: list[Row], lr: float) -> StepResult:
        for group in optimizer.param_groups:
            group["lr"] = lr
        with precision.autocast():
            return train_step(
                model,
                optimizer,
                rows,
                sft_loss,
                pad_id=pad_id,
                micro_batch_tokens=micro_batch_tokens,
                max_grad_norm=MAX_GRAD_NORM,
                device=precision.device,
                normalize_by="tokens",
                grouping=longest_first_chunks,
            )

    return step

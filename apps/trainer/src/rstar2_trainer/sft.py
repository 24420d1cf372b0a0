"""Non-reasoning SFT: teach the chat and tool-call format on (input ids, loss mask) examples.

Token-level cross-entropy over the assistant tokens only (loss mask 1), AdamW with linear warm-up
and cosine decay (the paper's SFT schedule, scaled down). The examples come from the curriculum's
conversations encoded by the rollout package's chat template, so the model learns exactly the
token stream the agent loop will later produce. The model must already be on `precision.device`;
bf16 runs the forward under autocast with fp32 master weights (see `precision`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rstar2_trainer.batching import make_batch, response_logprobs
from rstar2_trainer.precision import FP32_CPU, Precision


@dataclass(frozen=True)
class SFTResult:
    steps: int
    first_loss: float
    last_loss: float
    tokens: int


def cosine_with_warmup(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_sft(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup_ratio: float,
    seed: int,
    pad_id: int,
    on_step: Callable[[int, int, float], None] | None = None,
    precision: Precision = FP32_CPU,
) -> SFTResult:
    """Train `model` in place on `examples` ((ids, mask) pairs); return the loss trajectory."""
    rng = random.Random(seed)
    total = epochs * math.ceil(len(examples) / batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, int(total * warmup_ratio))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_with_warmup(s, total, warmup)
    )
    model.train()
    step, first, last, tokens = 0, float("nan"), float("nan"), 0
    for _ in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            rows = [examples[i] for i in order[start : start + batch_size]]
            # Score every token after the first as a "response" of a one-token prompt.
            batch = precision.batch(
                make_batch(
                    [ids[:1] for ids, _ in rows],
                    [ids[1:] for ids, _ in rows],
                    [mask[1:] for _, mask in rows],
                    pad_id,
                )
            )
            with precision.autocast():
                logp, _ = response_logprobs(model, batch)  # [B, T]
            n = batch.response_mask.sum().clamp(min=1)
            loss = -(logp * batch.response_mask).sum() / n
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            value = float(loss.detach())
            first = value if step == 0 else first
            last = value
            tokens += int(n)
            step += 1
            if on_step is not None:
                on_step(step, total, value)
    model.eval()
    return SFTResult(steps=step, first_loss=first, last_loss=last, tokens=tokens)

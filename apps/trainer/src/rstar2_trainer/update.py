"""The policy update of one RL step: kept trajectories and their advantages -> one optimizer step.

Letters: K kept trajectories, T padded response length. The batch is split into micro-batches of
at most `micro_batch_tokens` padded tokens; every micro-batch's loss is divided by the whole
batch's normaliser (its loss tokens for token-level aggregation, its rows otherwise), so the
accumulated gradient equals the gradient of the loss over the whole batch, however it is split.
There is one optimizer step per RL step, so the "old" policy is the current one: its logprobs are
the detached logprobs of the same forward pass (ratio 1, as in the public port; the clip only
matters with several updates per batch, which this trainer does not do). The model must already
be on `precision.device`; its forward runs under `precision.autocast()` (bf16 mixed precision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rstar2_algos import Algorithm
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.batching import make_batch, response_logprobs, token_budget_chunks
from rstar2_trainer.precision import FP32_CPU, Precision


@dataclass(frozen=True)
class UpdateResult:
    loss: float
    grad_norm: float
    tokens: int
    metrics: dict[str, float]


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    algo: Algorithm,
    kept: Sequence[Trajectory],
    advantages: torch.Tensor,  # [K]
    *,
    pad_id: int,
    micro_batch_tokens: int,
    grad_clip: float,
    precision: Precision = FP32_CPU,
    temperature: float = 1.0,
) -> UpdateResult:
    """One optimizer step on `kept`; returns the loss and the algorithm's metrics.

    `temperature` is the rollouts' sampling temperature: the logprobs are those of the tempered
    distribution the tokens were drawn from.
    """
    model.train()
    advantages = advantages.to(precision.device)
    token_level = algo.config.aggregation == "token_mean"
    total_tokens = sum(sum(t.loss_mask) for t in kept)
    normalizer = float(total_tokens if token_level else len(kept))
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in kept]
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    weight_total = 0.0
    loss_total = 0.0
    for chunk in token_budget_chunks(lengths, micro_batch_tokens):
        rows = [kept[i] for i in chunk]
        batch = precision.batch(
            make_batch(
                [t.prompt_ids for t in rows],
                [t.response_ids for t in rows],
                [t.loss_mask for t in rows],
                pad_id,
            )
        )
        with precision.autocast():
            logp, entropy = response_logprobs(
                model, batch, with_entropy=True, temperature=temperature
            )  # [B, T]
        loss, metrics = algo.policy_loss(
            logp,
            logp.detach(),
            advantages[chunk],
            batch.response_mask,
            entropy=entropy.detach() if entropy is not None else None,
            normalizer=normalizer,
        )
        loss.backward()
        loss_total += float(loss.detach())
        weight = float(batch.response_mask.sum())
        weight_total += weight
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value) * weight
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    model.eval()
    averaged = {k: v / max(weight_total, 1.0) for k, v in sums.items()}
    return UpdateResult(loss_total, float(grad_norm), int(total_tokens), averaged)


def make_optimizer(model: torch.nn.Module, lr: float, betas, weight_decay: float):
    return torch.optim.AdamW(
        model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay
    )


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over `warmup_steps` RL steps, then constant (the paper's schedule)."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)

"""The policy update of one RL step: kept trajectories and their advantages -> one optimizer step.

Letters: K kept trajectories, T padded response length. The batch is split into micro-batches of
at most `micro_batch_tokens` padded tokens; every micro-batch's loss is divided by the whole
batch's normaliser (its loss tokens for token-level aggregation, its rows otherwise), so the
accumulated gradient equals the gradient of the loss over the whole batch, however it is split.
There is one optimizer step per RL step, so the "old" policy is the current one: its logprobs are
the detached logprobs of the same forward pass (ratio 1, as in the public port; the clip only
matters with several updates per batch, which this trainer does not do). The model must already
be on `precision.device`; its forward runs under `precision.autocast()` (bf16 mixed precision).

`WorkerPolicyLoss` and `policy_rows` are the same update for FSDP2 ranks (`train_workers`): the
algorithm's loss as a `distributed.TokenLoss` and the kept batch as `distributed.Row`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rstar2_algos import AlgoConfig, Algorithm, build_algorithm
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.batching import make_batch, response_logprobs, token_budget_chunks
from rstar2_trainer.distributed import MicroBatch, Row
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
    pg_sum: dict[str, float] = {}
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
        if "pg_loss" in metrics:
            pg_sum["pg_loss"] = pg_sum.get("pg_loss", 0.0) + float(metrics["pg_loss"])
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    model.eval()
    averaged = {k: v / max(weight_total, 1.0) for k, v in sums.items()}
    if "pg_loss" in pg_sum:
        # Each micro-batch's pg_loss is already divided by the whole batch's normaliser, so the
        # batch's is their sum (a token-weighted average of them would mean nothing).
        averaged["pg_loss"] = pg_sum["pg_loss"]
    return UpdateResult(loss_total, float(grad_norm), int(total_tokens), averaged)


@dataclass(frozen=True)
class WorkerPolicyLoss:
    """The algorithm's policy loss as a `distributed.TokenLoss`, for `distributed.train_step`.

    The same loss `policy_update` takes: `algo.policy_loss` on the tempered logprobs, the old
    logprobs their detached copy (ratio 1), the entropy detached, with normaliser 1 so it returns
    the micro-batch's sum; `train_step` divides it by the global normaliser (`normalize_by`).
    Metrics come back as sums over the micro-batch's loss tokens, so the step's global means are
    token means; `pg_loss` is reported only for token-level aggregation, where it is a token mean.
    Picklable: Ray sends it to every rank. Rows carry their advantage as `values["advantage"]`.
    """

    algo: AlgoConfig

    @property
    def normalize_by(self) -> Literal["tokens", "rows"]:
        return "tokens" if self.algo.aggregation == "token_mean" else "rows"

    def __call__(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        algo = build_algorithm(self.algo)  # binds partials: cheap beside a forward pass
        mask = mb.batch.response_mask  # [B, T]
        loss, metrics = algo.policy_loss(
            logp,
            logp.detach(),
            mb.values["advantage"],  # [B, T]
            mask,
            entropy=mb.entropy,
            normalizer=1.0,
        )
        tokens = float(mask.sum())
        sums = {k: float(v) * tokens for k, v in metrics.items() if k != "pg_loss"}
        if self.normalize_by == "tokens":
            sums["pg_loss"] = float(metrics["pg_loss"])
        return loss, sums


def policy_rows(kept: Sequence[Trajectory], advantages: torch.Tensor) -> list[Row]:  # adv [K]
    """The kept trajectories as `distributed.Row`s, each token carrying its row's advantage."""
    return [
        Row(
            prompt_ids=list(t.prompt_ids),
            response_ids=list(t.response_ids),
            loss_mask=list(t.loss_mask),
            values={"advantage": [float(a)] * len(t.response_ids)},
        )
        for t, a in zip(kept, advantages.tolist(), strict=True)
    ]


def make_optimizer(model: torch.nn.Module, lr: float, betas, weight_decay: float):
    return torch.optim.AdamW(
        model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay
    )


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over `warmup_steps` RL steps, then constant (the paper's schedule)."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)

"""The RL loss of one update as `distributed.train_step` takes it, in the driver and on the ranks.

Letters: K kept trajectories, B rows of a micro-batch, T padded response length.
`policy_rows` turns the kept batch into `distributed.Row`s, each token carrying its row's
advantage; `RLTokenLoss` is the algorithm's policy loss as a `distributed.TokenLoss`.
`train_step` splits the rows into micro-batches and divides every micro-batch's loss by the
whole batch's normaliser (loss tokens for token-level aggregation, rows otherwise), so the
gradient is that of the loss over the whole batch, however it is split (`policy.py` drives it).

Off-policy correction (`algo.off_policy`, rstar2_algos `off_policy.py`): rows carry the sampler's
logprobs as `values["behaviour_logp"]` (NaN on a row whose engine returned none; the key is left
out when no kept trajectory has any). The loss weighs each token by the correction built on the
trainer's old logprob (`old_logp` with several optimizer steps, else the current logprob,
detached) against that behaviour logprob; rows without one get weight 1 and no mismatch metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from rstar2_algos import AlgoConfig, build_algorithm
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.training.distributed import MicroBatch, Row, StepResult


@dataclass(frozen=True)
class RLTokenLoss:
    """The algorithm's policy loss as a `distributed.TokenLoss`, for `distributed.train_step`.

    `algo.policy_loss` on the tempered logprobs; the old logprobs are the rows'
    `values["old_logp"]` when an update takes several optimizer steps (`policy.py`), else the
    step's own logprobs, detached (ratio 1); the entropy with its gradient when the algorithm has
    an entropy bonus (`entropy_grad`: entropy_coef > 0), else detached; with normaliser 1 so it returns
    the micro-batch's sum; `train_step` divides it by the global normaliser (`normalize_by`).
    Metrics come back as sums over the micro-batch's loss tokens, so the step's global means are
    token means; `pg_loss` is reported only for token-level aggregation, where it is a token mean.
    Picklable: Ray sends it to every rank. Rows carry their advantage as `values["advantage"]`.

    With `values["behaviour_logp"]` the token losses are weighed by `algo.off_policy` and the
    mismatch metrics come back as sums over the tokens that have a behaviour logprob:
    `mismatch_kl`, `mismatch_masked_frac`, `mismatch_weight_mean`, `mismatch_token_share` (the
    count itself: its global mean is the share of loss tokens measured; `merge_steps` divides the
    other means by it, so they are means over the measured tokens), and `mismatch_ratio_max`, the
    micro-batch's largest ratio (`train_step` takes the max over micro-batches and ranks).
    """

    algo: AlgoConfig

    @property
    def entropy_grad(self) -> bool:
        return self.algo.entropy_coef > 0

    @property
    def normalize_by(self) -> Literal["tokens", "rows"]:
        return "tokens" if self.algo.aggregation == "token_mean" else "rows"

    def __call__(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        algo = build_algorithm(self.algo)  # binds partials: cheap beside a forward pass
        mask = mb.batch.response_mask  # [B, T]
        old = mb.values.get("old_logp")  # [B, T]
        old = old if old is not None else logp.detach()
        behaviour = mb.values.get("behaviour_logp")  # [B, T], NaN where unknown
        weights, mismatch = None, {}
        if behaviour is not None:
            known = mask.bool() & behaviour.isfinite()  # [B, T]
            fix = algo.off_policy(old, behaviour.nan_to_num(0.0), known)
            weights, measured = fix.weights, float(known.sum())
            mismatch = {
                k: float(v) if k.endswith("_max") else float(v) * measured
                for k, v in fix.metrics.items()
            }
            mismatch["mismatch_token_share"] = measured
        loss, metrics = algo.policy_loss(
            logp,
            old,
            mb.values["advantage"],  # [B, T]
            mask,
            entropy=mb.entropy,
            normalizer=1.0,
            token_weights=weights,
        )
        tokens = float(mask.sum())
        sums = {k: float(v) * tokens for k, v in metrics.items() if k != "pg_loss"}
        if self.normalize_by == "tokens":
            sums["pg_loss"] = float(metrics["pg_loss"])
        return loss, sums | mismatch


def policy_rows(kept: Sequence[Trajectory], advantages: torch.Tensor) -> list[Row]:  # adv [K]
    """The kept trajectories as `distributed.Row`s, each token carrying its row's advantage and,
    when any row has them, the sampler's logprobs (`behaviour_logp`; NaN on rows without)."""
    behaviour = [behaviour_logprobs(t) for t in kept]
    with_behaviour = any(b is not None for b in behaviour)
    rows = []
    for t, a, b in zip(kept, advantages.tolist(), behaviour, strict=True):
        n = len(t.response_ids)
        values = {"advantage": [float(a)] * n}
        if with_behaviour:
            values["behaviour_logp"] = b if b is not None else [math.nan] * n
        rows.append(Row(list(t.prompt_ids), list(t.response_ids), list(t.loss_mask), values))
    return rows


def behaviour_logprobs(t: Trajectory) -> list[float] | None:
    """The sampler's logprob per response token, or None when the engine returned none: no
    logprobs, or 0.0 on every loss token (what `Trajectory.extend` stores without them)."""
    if len(t.logprobs) != len(t.response_ids):
        return None
    if all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m):
        return None
    return [float(lp) for lp in t.logprobs]


def make_optimizer(model: torch.nn.Module, lr: float, betas, weight_decay: float):
    trainable = [p for p in model.parameters() if p.requires_grad]  # a LoRA base is frozen
    return torch.optim.AdamW(trainable, lr=lr, betas=tuple(betas), weight_decay=weight_decay)


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over `warmup_steps` RL steps, then constant (the paper's schedule)."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)


def mini_batches(rows: Sequence[Row], count: int) -> list[list[Row]]:
    """`rows` cut into `count` contiguous, near-equal mini-batches (fewer when rows are few)."""
    count = max(1, min(count, len(rows)))
    size, extra = divmod(len(rows), count)
    out, start = [], 0
    for k in range(count):
        end = start + size + (1 if k < extra else 0)
        out.append(list(rows[start:end]))
        start = end
    return out


def merge_steps(steps: Sequence[StepResult]) -> dict[str, float]:
    """One update's metrics: the means over its optimizer steps (the `*_max` ones: the max), and
    how many there were. The mismatch means are over the tokens that had a behaviour logprob
    (divided by `mismatch_token_share`, the share of loss tokens that had one)."""
    steps = [replace(s, metrics=_measured_means(s.metrics)) for s in steps]
    n = len(steps)
    keys = sorted({k for s in steps for k in s.metrics})
    out = {
        "loss": sum(s.loss for s in steps) / n,
        "grad_norm": sum(s.grad_norm for s in steps) / n,
        "train_tokens": steps[0].tokens if n == 1 else sum(s.tokens for s in steps),
        "train_micro_batches": max(s.micro_batches for s in steps),
        "optim_steps": n,
    }
    for key in keys:
        values = [s.metrics[key] for s in steps if key in s.metrics]
        out[key] = max(values) if key.endswith("_max") else sum(values) / n
    return out


_MEASURED = ("mismatch_kl", "mismatch_masked_frac", "mismatch_weight_mean")


def _measured_means(metrics: dict[str, float]) -> dict[str, float]:
    """The mismatch means per measured token, not per loss token."""
    share = metrics.get("mismatch_token_share", 0.0)
    if share <= 0:
        return metrics
    return {k: v / share if k in _MEASURED else v for k, v in metrics.items()}

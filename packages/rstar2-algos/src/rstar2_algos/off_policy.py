"""Off-policy correction: importance weights between the sampler's and the trainer's logprobs.

Shapes: B rows (trajectories), T tokens per row; every input is [B, T]. `mask` is the loss mask
restricted to tokens whose behaviour logprob is known (the trainer drops rows whose engine
returned none); values under mask 0 are never read.

The sampler (vLLM, bf16 kernels, maybe older weights) drew each token with the behaviour logprob
b_t; the trainer's policy before this update gives the old logprob o_t. Per token the log-ratio is
d_t = o_t - b_t, clamped to [-20, 20] before exp (verl's SAFETY_BOUND). At `level`:

    token       rho_t = exp(d_t)
    sequence    rho_t = exp(sum_s d_s) on every loss token of the row: the product of the
                token ratios, the true sequence importance ratio (verl `rollout_is: sequence`;
                verl's `geometric` level would take the mean instead, which we do not offer)

and the correction, chosen by `OffPolicyConfig.kind` (the weights are detached):

    none    w = 1                                        (metrics only)
    tis     w = min(rho, cap)                            truncated IS (verl `rollout_is`, TIS)
    mis     w = 1 if lower <= rho <= upper else 0        masked IS (verl `rollout_rs` with
                                                         `mismatch`/MIS; IcePop at token level)

`w` multiplies the per-token policy-gradient loss after PPO clipping (`policy_loss(...,
token_weights=w)`), as verl's `compute_policy_loss` multiplies `pg_losses` by
`rollout_is_weights`. One difference from verl: a token masked by `mis` stays in the loss's
denominator (its loss is 0), where verl removes it from `response_mask`; our trainer fixes the
normaliser from the loss mask before the loss runs.

Metrics (detached scalars, means over the `mask` tokens), logged for every kind:
    mismatch_kl            k3 estimate of KL(behaviour || trainer): exp(d) - d - 1 (verl `k3_kl`)
    mismatch_ratio_max     the largest token ratio exp(d_t)
    mismatch_masked_frac   share of tokens with w = 0 (0 for none and tis)
    mismatch_weight_mean   mean of w (1 for none)

Source followed: verl `verl/trainer/ppo/rollout_corr_helper.py`
(`compute_rollout_correction_weights`, `compute_rollout_rejection_mask`,
`compute_offpolicy_metrics`; formerly `mismatch_helper.compute_rollout_importance_weights`) and
its `docs/algo/rollout_corr.md`; defaults cap = upper = 2 and lower = 1/2 are verl's.

Not covered: computing either logprob (the engine's and the trainer's job), verl's veto and batch
normalisation of the weights, staleness bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from rstar2_algos.config import MisConfig, NoOffPolicyConfig, OffPolicyConfig, TisConfig

LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True)
class OffPolicyCorrection:
    """What `correct_off_policy` returns: weights for the token losses, and the mismatch."""

    weights: torch.Tensor  # [B, T], detached; 1 outside the mask
    metrics: dict[str, torch.Tensor]  # detached scalars, token means over the mask


def behaviour_log_ratio(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log(pi_old / pi_behaviour) per token [B, T], clamped to +-20, 0 outside the mask."""
    d = torch.where(mask, old_logprobs.detach() - behaviour_logprobs, 0.0)
    return d.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def level_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The log-ratio at `level` on every token [B, T]: the token's, or its row's sum."""
    if level == "token":
        return log_ratio
    if level == "sequence":
        row = torch.where(mask, log_ratio, 0.0).sum(-1, keepdim=True)  # [B, 1]
        return row.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).expand_as(log_ratio)
    raise ValueError(f"unknown off-policy level {level!r}: choose token or sequence")


def truncated_weights(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """TIS: min(exp(log_ratio), cap) under the mask, 1 elsewhere [B, T]."""
    return torch.where(mask, torch.exp(log_ratio).clamp(max=cap), 1.0)


def masked_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, lower: float, upper: float
) -> torch.Tensor:
    """MIS: 1 where lower <= exp(log_ratio) <= upper, 0 where outside, 1 off the mask [B, T]."""
    ratio = torch.exp(log_ratio)
    inside = (ratio >= lower) & (ratio <= upper)
    return torch.where(mask & ~inside, 0.0, 1.0)


Weigh = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (token log-ratios [B, T], mask [B, T]) -> weights [B, T]


def weigh_for(config: OffPolicyConfig) -> Weigh:
    """The weight function of `config.kind`, its fields bound (chosen once, not per step)."""
    if isinstance(config, TisConfig):
        return partial(_truncated, level=config.level, cap=config.cap)
    if isinstance(config, MisConfig):
        return partial(_masked, level=config.level, lower=config.lower, upper=config.upper)
    if isinstance(config, NoOffPolicyConfig):
        return _unit
    raise ValueError(f"unknown off-policy correction {config!r}")


def _truncated(d: torch.Tensor, mask: torch.Tensor, *, level: str, cap: float) -> torch.Tensor:
    return truncated_weights(level_log_ratio(d, mask, level), mask, cap)


def _masked(
    d: torch.Tensor, mask: torch.Tensor, *, level: str, lower: float, upper: float
) -> torch.Tensor:
    return masked_weights(level_log_ratio(d, mask, level), mask, lower, upper)


def _unit(d: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(d)


def apply_correction(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    weigh: Weigh = _unit,
) -> OffPolicyCorrection:
    """Weights [B, T] from `weigh` and the mismatch metrics; see the module docstring."""
    if old_logprobs.shape != behaviour_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(
            f"old {tuple(old_logprobs.shape)}, behaviour {tuple(behaviour_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must have one shape [B, T]"
        )
    keep = mask.bool()
    with torch.no_grad():
        d = behaviour_log_ratio(old_logprobs, behaviour_logprobs, keep)  # [B, T]
        weights = weigh(d, keep)  # [B, T]
        return OffPolicyCorrection(weights, mismatch_metrics(d, weights, keep))


def correct_off_policy(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: OffPolicyConfig | None = None,
) -> OffPolicyCorrection:
    """Weights [B, T] for the token losses and the sampler-trainer mismatch metrics."""
    weigh = weigh_for(config or NoOffPolicyConfig())
    return apply_correction(old_logprobs, behaviour_logprobs, mask, weigh=weigh)


def mismatch_metrics(
    log_ratio: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """KL(behaviour || trainer) (k3), largest token ratio, masked share, mean weight."""
    tokens = mask.sum().clamp(min=1)

    def mean(values: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, values, 0.0).sum() / tokens

    largest = (
        torch.where(mask, log_ratio, -torch.inf).max() if mask.any() else log_ratio.new_zeros(())
    )
    return {
        "mismatch_kl": mean(torch.expm1(log_ratio) - log_ratio),
        "mismatch_ratio_max": torch.exp(largest),
        "mismatch_masked_frac": mean((weights == 0).float()),
        "mismatch_weight_mean": mean(weights),
    }

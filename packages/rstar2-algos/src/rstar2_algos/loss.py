"""Clipped policy-gradient losses over a token batch, with their metrics.

Shapes: B rows (trajectories), T tokens per row. Every input is [B, T] and aligned with `mask`
(1 = a sampled token trained on; 0 = tool output, template or padding). Values under mask 0 are
never read, so padding with anything (even inf) changes neither the loss nor its gradient.

Per token, with ratio r = exp(logprobs - old_logprobs) and advantage A (paper Eq.6):

    loss_t = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))      PPO with Clip-Higher
    loss_t = min(loss_t, -A c)  where A < 0                          dual clip (optional)

GSPO replaces r with the sequence ratio s = exp(mean_t (logprobs - old_logprobs)) in value, with
the gradient s * grad(logprobs_t) on each token (GSPO-token form). Log-ratios are clamped to
[-20, 20] before exp, as verl does. Where the clipped branch is taken the token's gradient is 0.

Aggregation of token values v [B, T] into one number:
    token_mean      sum(v) / tokens                 DAPO, GRPO-RoC (paper Eq.6)
    sequence_mean   mean over rows of the row mean  GRPO as first written, GSPO
    token_sum_norm  sum(v) / (rows * norm_tokens)   Dr. GRPO (a constant per-row divisor)
Rows without a masked token count for nothing. `normalizer` replaces the count divided by
(tokens for token_mean, rows otherwise): pass the whole batch's count when the batch is split
into micro-batches, so the micro-batch losses add up to the batch loss.

Off-policy weights (`token_weights`, see `off_policy.py`) multiply loss_t after the clip, as
verl multiplies `pg_losses` by `rollout_is_weights`; the KL and entropy terms are not weighted.

Optional terms: `kl_coef` * KL(policy || reference) per token (k1: log p - log p_ref; k3:
exp(d) - d - 1 with d = log p_ref - log p), and -`entropy_coef` * entropy. Both are off in the
paper. Metrics (detached scalars): clip fractions low/high/dual, approx_kl (k3 of old vs new),
ratio_mean, kl_ref and entropy when given; all token means over the mask.

Not covered: computing logprobs or entropy from a model (the trainer's job), value losses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from rstar2_algos.config import Aggregation

LOG_RATIO_LIMIT = 20.0


def token_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_old) per token [B, T]."""
    return logprobs - old_logprobs


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO: the row's mean log-ratio in value on every token [B, T], token gradients."""
    per_token = torch.where(mask, logprobs - old_logprobs, 0.0)  # [B, T]
    row = per_token.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return logprobs - logprobs.detach() + row.detach()[:, None]  # [B, T]


RATIOS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": lambda lp, old, mask: token_log_ratio(lp, old),
    "sequence": sequence_log_ratio,
}


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token losses [B, T] and where each clip bound binds ([B, T] bool, keys low/high/dual)."""
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))  # [B, T]
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        bound = {
            "low": (advantages < 0) & (ratio < 1.0 - clip_low),
            "high": (advantages > 0) & (ratio > 1.0 + clip_high),
            "dual": torch.zeros_like(ratio, dtype=torch.bool),
        }
    if dual_clip is not None:
        capped = torch.minimum(loss, -advantages * dual_clip)
        loss = torch.where(advantages < 0, capped, loss)
        bound["dual"] = ((advantages < 0) & (ratio > dual_clip)).detach()
    return loss, bound


def token_mean(
    values: torch.Tensor, mask: torch.Tensor, norm_tokens: int, normalizer: float | None
) -> torch.Tensor:
    """sum over masked tokens / their count (or `normalizer`)."""
    total = torch.where(mask, values, 0.0).sum()
    return total / (normalizer if normalizer is not None else mask.sum().clamp(min=1))


def sequence_mean(
    values: torch.Tensor, mask: torch.Tensor, norm_tokens: int, normalizer: float | None
) -> torch.Tensor:
    """mean over rows with tokens (or / `normalizer`) of each row's masked token mean."""
    tokens_per_row = mask.sum(-1)  # [B]
    row_means = torch.where(mask, values, 0.0).sum(-1) / tokens_per_row.clamp(min=1)  # [B]
    rows = (tokens_per_row > 0).sum().clamp(min=1)
    return row_means.sum() / (normalizer if normalizer is not None else rows)


def token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, norm_tokens: int, normalizer: float | None
) -> torch.Tensor:
    """sum over masked tokens / (rows with tokens (or `normalizer`) * norm_tokens)."""
    rows = (mask.sum(-1) > 0).sum().clamp(min=1)
    divisor = normalizer if normalizer is not None else rows
    return torch.where(mask, values, 0.0).sum() / (divisor * norm_tokens)


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, int, float | None], torch.Tensor]] = {
    "token_mean": token_mean,
    "sequence_mean": sequence_mean,
    "token_sum_norm": token_sum_norm,
}


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
    norm_tokens: int = 8192,
    normalizer: float | None = None,
) -> torch.Tensor:
    """One scalar from token values [B, T] under a bool mask [B, T]; see the module docstring."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}: choose one of {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[mode](values, mask, norm_tokens, normalizer)


def kl_to_reference(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: Literal["k1", "k3"] = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) [B, T]."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(d) - d - 1.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    ratio_level: Literal["token", "sequence"] = "token",
    aggregation: Aggregation = "token_mean",
    norm_tokens: int = 8192,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: Literal["k1", "k3"] = "k3",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    normalizer: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss to minimise (a scalar) and its metrics; advantages are [B, T] or per row [B].

    `token_weights` [B, T] (detached; e.g. `correct_off_policy(...).weights`) multiply the
    clipped token losses before aggregation; None leaves them as they are."""
    if advantages.ndim == 1:
        advantages = advantages[:, None].expand_as(logprobs)  # [B, T]
    _check_shapes(logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    keep = mask.bool()  # [B, T]
    logprobs = torch.where(keep, logprobs, 0.0)
    old_logprobs = torch.where(keep, old_logprobs, 0.0)
    advantages = torch.where(keep, advantages, 0.0)
    log_ratio = RATIOS[ratio_level](logprobs, old_logprobs, keep)  # [B, T]
    token_loss, bound = clipped_surrogate(log_ratio, advantages, clip_low, clip_high, dual_clip)
    if token_weights is not None:
        _check_shapes(logprobs, token_weights=token_weights)
        token_loss = token_loss * token_weights.detach().to(token_loss.dtype)
    pg_loss = aggregate(token_loss, keep, aggregation, norm_tokens, normalizer)
    loss = pg_loss
    with torch.no_grad():
        true_log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        metrics = {
            "pg_loss": pg_loss.detach(),
            "clip_frac_low": _token_mean(bound["low"].float(), keep),
            "clip_frac_high": _token_mean(bound["high"].float(), keep),
            "clip_frac_dual": _token_mean(bound["dual"].float(), keep),
            "approx_kl": _token_mean(torch.expm1(true_log_ratio) - true_log_ratio, keep),
            "ratio_mean": _token_mean(torch.exp(log_ratio.clamp(max=LOG_RATIO_LIMIT)), keep),
        }
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (a reference policy's logprobs)")
    if ref_logprobs is not None:
        _check_shapes(logprobs, ref_logprobs=ref_logprobs)
        kl = kl_to_reference(logprobs, torch.where(keep, ref_logprobs, 0.0), kl_estimator)
        metrics["kl_ref"] = _token_mean(kl.detach(), keep)
        if kl_coef > 0:
            loss = loss + kl_coef * aggregate(kl, keep, aggregation, norm_tokens, normalizer)
    if entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")
    if entropy is not None:
        _check_shapes(logprobs, entropy=entropy)
        entropy = torch.where(keep, entropy, 0.0)
        metrics["entropy"] = _token_mean(entropy.detach(), keep)
        if entropy_coef > 0:
            loss = loss - entropy_coef * aggregate(
                entropy, keep, aggregation, norm_tokens, normalizer
            )
    return loss, metrics


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def _check_shapes(logprobs: torch.Tensor, **others: torch.Tensor) -> None:
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [B, T], got {tuple(logprobs.shape)}")
    for name, tensor in others.items():
        if tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} {tuple(tensor.shape)} does not match logprobs {tuple(logprobs.shape)}"
            )

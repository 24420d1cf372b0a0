"""`Algorithm`: one config turned into select -> advantages -> loss, its variant fixed once.

A trainer swaps algorithms by config alone:

    algo = build_algorithm(config)               # config: any AlgoConfig
    n = algo.rollouts_per_prompt                 # sample this many per prompt (2G for RoC)
    sel = algo.select(trajectories, rng, target_groups=batch_prompts)
    adv = algo.advantages(sel)                   # [K], one per kept trajectory
    tok = broadcast_to_tokens(adv, mask)         # [K, T] under the loss mask
    fix = algo.off_policy(old_logprobs, behaviour_logprobs, mask)   # sampler vs trainer
    loss, metrics = algo.policy_loss(logprobs, old_logprobs, tok, mask, token_weights=fix.weights)

Every choice (resampler, advantage estimator, ratio level, aggregation, off-policy
correction) is bound here at
construction with `functools.partial`; nothing branches on the config inside a step. The pure
functions it binds are public, for trainers that want the pieces.

Not covered: the optimiser step, reference-policy or entropy computation (pass them in).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from pydantic import TypeAdapter

from rstar2_algos.advantage import compute_advantages
from rstar2_algos.config import (
    AlgoConfig,
    DeterministicRocConfig,
    GrpoRocConfig,
    PolicyGradientConfig,
    SampledRocConfig,
)
from rstar2_algos.loss import policy_loss
from rstar2_algos.off_policy import OffPolicyCorrection, apply_correction, weigh_for
from rstar2_algos.roc import resample_on_correct, resample_on_correct_deterministic
from rstar2_algos.selection import Resampler, Selection, T, select_trajectories

_ALGO_CONFIG: TypeAdapter[AlgoConfig] = TypeAdapter(AlgoConfig)


class Algorithm:
    """An RL algorithm built from its config; stateless apart from the config."""

    def __init__(self, config: PolicyGradientConfig) -> None:
        self.config = config
        resampler: Resampler | None = None
        penalties = {"tool_error_penalty": True, "format_penalty": True}
        canonical = False
        if isinstance(config, GrpoRocConfig):
            roc = config.roc
            penalties = {
                "tool_error_penalty": roc.tool_error_penalty,
                "format_penalty": roc.format_penalty,
            }
            resampler = _roc_resampler(roc, config.group_size, config.correct_threshold)
            canonical = isinstance(roc, SampledRocConfig)
        self._select = partial(
            select_trajectories,
            resampler=resampler,
            filtering=config.filtering,
            correct_threshold=config.correct_threshold,
            rollouts_per_prompt=config.rollouts_per_prompt,
            canonical_order=canonical,
            **penalties,
        )
        self._advantages = partial(
            compute_advantages, estimator=config.advantage, eps=config.advantage_eps
        )
        self._loss = partial(
            policy_loss,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            dual_clip=config.dual_clip,
            ratio_level=config.ratio_level,
            aggregation=config.aggregation,
            norm_tokens=config.norm_tokens,
            kl_coef=config.kl_coef,
            kl_estimator=config.kl_estimator,
            entropy_coef=config.entropy_coef,
        )
        self._correct = partial(apply_correction, weigh=weigh_for(config.off_policy))

    @property
    def group_size(self) -> int:
        """G: trajectories per prompt trained on."""
        return self.config.group_size

    @property
    def rollouts_per_prompt(self) -> int:
        """Trajectories to sample per prompt (2G for GRPO-RoC, G otherwise)."""
        return self.config.rollouts_per_prompt

    def select(
        self,
        trajectories: Sequence[T],
        rng: np.random.Generator,
        *,
        target_groups: int | None = None,
    ) -> Selection[T]:
        """Filter groups and resample within them; see `select_trajectories`."""
        return self._select(trajectories, rng, target_groups=target_groups)

    def advantages(self, selection: Selection) -> torch.Tensor:
        """One advantage per kept trajectory [K], over each group's kept rewards."""
        return self._advantages(selection.rewards, selection.group_index)

    def policy_loss(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        normalizer: float | None = None,
        token_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss to minimise and its metrics; tensors are [B, T] (advantages may be [B])."""
        return self._loss(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
            normalizer=normalizer,
            token_weights=token_weights,
        )

    def off_policy(
        self, old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> OffPolicyCorrection:
        """The configured correction's weights [B, T] and the sampler-trainer mismatch metrics;
        `mask` [B, T] marks loss tokens whose behaviour logprob is known."""
        return self._correct(old_logprobs, behaviour_logprobs, mask)

    def __repr__(self) -> str:
        return f"Algorithm({self.config!r})"


def _roc_resampler(
    roc: SampledRocConfig | DeterministicRocConfig, group_size: int, correct_threshold: float
) -> Resampler:
    if isinstance(roc, SampledRocConfig):
        return partial(
            _sampled,
            group_size=group_size,
            correct_threshold=correct_threshold,
            penalty_eps=roc.penalty_eps,
        )
    return partial(
        _deterministic,
        group_size=group_size,
        correct_threshold=correct_threshold,
        min_per_sign=roc.min_per_sign,
    )


def _sampled(
    rewards: np.ndarray,
    penalties: np.ndarray,
    group_index: np.ndarray,
    rng: np.random.Generator,
    **kwargs: Any,
) -> np.ndarray:
    return resample_on_correct(rewards, penalties, group_index, rng=rng, **kwargs)


def _deterministic(
    rewards: np.ndarray,
    penalties: np.ndarray,
    group_index: np.ndarray,
    rng: np.random.Generator,  # unused: the port's rule draws nothing
    **kwargs: Any,
) -> np.ndarray:
    return resample_on_correct_deterministic(rewards, penalties, group_index, **kwargs)


def build_algorithm(config: AlgoConfig | dict[str, Any] | None = None) -> Algorithm:
    """An `Algorithm` from a config model, a mapping (validated as `AlgoConfig`), or defaults."""
    if config is None:
        config = GrpoRocConfig()
    elif isinstance(config, dict):
        config = _ALGO_CONFIG.validate_python(config)
    return Algorithm(config)

"""The rollout settings of one RL step or hard-subset pass: the recipe's, a derived seed, the
stage's budget. Seeds derive from (run seed, what, step), never from a global."""

from __future__ import annotations

from typing import Any

from rstar2_rollout import RolloutConfig, derive_seed


def rollout_config_for(
    base: RolloutConfig, *, seed: int, step: int, **budget: Any
) -> RolloutConfig:
    """The base rollout config with this step's seed and the stage's budget."""
    return base.model_copy(update={"seed": derive_seed(seed, "rl", step), **budget})

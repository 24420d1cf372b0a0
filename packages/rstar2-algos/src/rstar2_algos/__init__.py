"""rstar2-algos: GRPO-RoC and its siblings, as pure, tested maths (torch and numpy).

`build_algorithm(config)` gives a trainer select -> advantages -> loss for any `AlgoConfig`;
the pure functions below are the same pieces for a trainer of your own.
"""

from rstar2_algos.advantage import (
    broadcast_to_tokens,
    compute_advantages,
    group_mean,
    group_zscore,
    leave_one_out,
)
from rstar2_algos.algorithm import Algorithm, build_algorithm
from rstar2_algos.config import (
    AlgoConfig,
    DapoConfig,
    DeterministicRocConfig,
    DrGrpoConfig,
    GrpoConfig,
    GrpoRocConfig,
    GspoConfig,
    MisConfig,
    NoOffPolicyConfig,
    OffPolicyConfig,
    PolicyGradientConfig,
    RlooConfig,
    RocConfig,
    SampledRocConfig,
    TisConfig,
)
from rstar2_algos.groups import (
    EqualRewardFilter,
    Groups,
    group_by_id,
    groups_needed,
    reject_equal_reward,
)
from rstar2_algos.loss import (
    aggregate,
    clipped_surrogate,
    kl_to_reference,
    policy_loss,
    sequence_log_ratio,
    token_log_ratio,
)
from rstar2_algos.off_policy import (
    OffPolicyCorrection,
    apply_correction,
    correct_off_policy,
    mismatch_metrics,
)
from rstar2_algos.penalty import format_penalty, roc_penalty, tool_error_penalty
from rstar2_algos.roc import (
    deterministic_roc_counts,
    resample_on_correct,
    resample_on_correct_deterministic,
    roc_counts,
)
from rstar2_algos.selection import Selection, SelectionStats, select_trajectories
from rstar2_algos.trajectory import ScoredTrajectory, TrajectoryFeatures, read_features

__all__ = [
    "AlgoConfig",
    "Algorithm",
    "DapoConfig",
    "DeterministicRocConfig",
    "DrGrpoConfig",
    "EqualRewardFilter",
    "Groups",
    "GrpoConfig",
    "GrpoRocConfig",
    "GspoConfig",
    "MisConfig",
    "NoOffPolicyConfig",
    "OffPolicyConfig",
    "OffPolicyCorrection",
    "PolicyGradientConfig",
    "RlooConfig",
    "RocConfig",
    "SampledRocConfig",
    "ScoredTrajectory",
    "Selection",
    "SelectionStats",
    "TisConfig",
    "TrajectoryFeatures",
    "aggregate",
    "apply_correction",
    "broadcast_to_tokens",
    "build_algorithm",
    "clipped_surrogate",
    "compute_advantages",
    "correct_off_policy",
    "deterministic_roc_counts",
    "format_penalty",
    "group_by_id",
    "group_mean",
    "group_zscore",
    "groups_needed",
    "kl_to_reference",
    "leave_one_out",
    "mismatch_metrics",
    "policy_loss",
    "read_features",
    "reject_equal_reward",
    "resample_on_correct",
    "resample_on_correct_deterministic",
    "roc_counts",
    "roc_penalty",
    "select_trajectories",
    "sequence_log_ratio",
    "token_log_ratio",
    "tool_error_penalty",
]

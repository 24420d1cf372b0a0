"""Configuration of the RL algorithm: one model per algorithm, selected by `name`.

`AlgoConfig` is a discriminated union over `grpo`, `grpo_roc` (the default, the paper's recipe),
`dr_grpo`, `dapo`, `gspo` and `rloo`. Every model shares the fields of `PolicyGradientConfig`;
each sets the defaults that define its algorithm, and `grpo_roc` adds oversampling and the
Resample-on-Correct rule (`roc`, itself a union: the paper's `sampled` rule or the public port's
`deterministic` one). A mapping without `name` validates as `grpo_roc`. Every algorithm has
`off_policy`, a union by `kind` (`none`, `tis`, `mis`; see `off_policy.py`).

Not covered here: the batch size in prompts (the curriculum's) and the response budget (the
rollout's); the trainer composes them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

AdvantageEstimator = Literal["group_zscore", "group_mean", "leave_one_out"]
Aggregation = Literal["token_mean", "sequence_mean", "token_sum_norm"]
Filtering = Literal["none", "reject_equal", "dynamic"]


class SampledRocConfig(BaseModel):
    """The paper's RoC: negatives uniform, positives sampled with weight 1/(penalty + eps)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["sampled"] = Field(default="sampled", description="The paper's rule.")
    penalty_eps: float = Field(
        default=0.01,
        gt=0,
        description="eps in 1/(p_err + p_format + eps); the paper leaves it unspecified.",
    )
    tool_error_penalty: bool = Field(default=True, description="Include p_err in the penalty.")
    format_penalty: bool = Field(default=True, description="Include p_format in the penalty.")


class DeterministicRocConfig(BaseModel):
    """The public port's RoC: lowest penalty first, banker's rounding, a minimum per sign."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["deterministic"] = Field(default="deterministic", description="The port's rule.")
    min_per_sign: int = Field(
        default=2, ge=0, description="Keep at least this many of each sign when available."
    )
    tool_error_penalty: bool = Field(default=True, description="Include p_err in the penalty.")
    format_penalty: bool = Field(default=True, description="Include p_format in the penalty.")


RocConfig = Annotated[SampledRocConfig | DeterministicRocConfig, Field(discriminator="kind")]


OffPolicyLevel = Literal["token", "sequence"]


class NoOffPolicyConfig(BaseModel):
    """No correction: every weight is 1; the sampler-trainer mismatch is still measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["none"] = Field(default="none", description="No off-policy correction.")


class TisConfig(BaseModel):
    """Truncated importance sampling: weight = min(pi_old / pi_behaviour, cap), detached."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["tis"] = Field(default="tis", description="Truncated importance sampling.")
    level: OffPolicyLevel = Field(
        default="token", description="Ratio per token, or per sequence (product of tokens)."
    )
    cap: float = Field(default=2.0, gt=0, description="C: the largest weight (verl's 2).")


class MisConfig(BaseModel):
    """Masked importance sampling: tokens (or sequences) whose ratio leaves [lower, upper] get
    weight 0, the others 1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["mis"] = Field(default="mis", description="Masked importance sampling.")
    level: OffPolicyLevel = Field(
        default="token", description="Ratio per token, or per sequence (product of tokens)."
    )
    lower: float = Field(default=0.5, gt=0, description="Smallest ratio kept (verl's 1/2).")
    upper: float = Field(default=2.0, gt=0, description="Largest ratio kept (verl's 2).")

    @model_validator(mode="after")
    def _ordered(self) -> MisConfig:
        if not self.lower <= 1.0 <= self.upper:
            raise ValueError(f"need lower <= 1 <= upper, got [{self.lower}, {self.upper}]")
        return self


OffPolicyConfig = Annotated[NoOffPolicyConfig | TisConfig | MisConfig, Field(discriminator="kind")]
"""How the sampler's logprobs correct the loss: a union selected by `kind` (default `none`)."""


class PolicyGradientConfig(BaseModel):
    """Fields every algorithm shares; the subclasses set their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Whether the importance ratio is per token or GSPO's per sequence; fixed by the algorithm.
    ratio_level: ClassVar[Literal["token", "sequence"]] = "token"

    group_size: int = Field(default=16, gt=0, description="G: trajectories per prompt trained on.")
    advantage: AdvantageEstimator = Field(
        default="group_zscore", description="How a group's rewards become advantages."
    )
    advantage_eps: float = Field(
        default=1e-6, ge=0, description="Added to the group std before dividing (group_zscore)."
    )
    filtering: Filtering = Field(
        default="none",
        description="Equal-reward groups: keep, reject, or reject and ask for more (DAPO).",
    )
    correct_threshold: float = Field(
        default=0.5, description="A reward above this counts as correct (a positive)."
    )
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="PPO clip below: 1 - clip_low.")
    clip_high: float = Field(default=0.2, ge=0, description="PPO clip above: 1 + clip_high.")
    dual_clip: float | None = Field(
        default=None, gt=1, description="Dual-clip bound c for negative advantages; off if None."
    )
    aggregation: Aggregation = Field(
        default="token_mean", description="How token losses become one number."
    )
    norm_tokens: int = Field(
        default=8192, gt=0, description="Per-sequence divisor of token_sum_norm (Dr. GRPO)."
    )
    kl_coef: float = Field(default=0.0, ge=0, description="Weight of the KL to a reference.")
    kl_estimator: Literal["k1", "k3"] = Field(
        default="k3", description="Estimator of KL(policy || reference) per token."
    )
    entropy_coef: float = Field(default=0.0, ge=0, description="Weight of the entropy bonus.")
    off_policy: OffPolicyConfig = Field(
        default_factory=NoOffPolicyConfig,
        description="Correction for the sampler's logprobs differing from the trainer's.",
    )

    @property
    def rollouts_per_prompt(self) -> int:
        """How many trajectories the rollout must sample per prompt."""
        return self.group_size


class GrpoConfig(PolicyGradientConfig):
    """GRPO as first written: z-scored group advantages, per-sequence loss, symmetric clip."""

    name: Literal["grpo"] = Field(default="grpo", description="The algorithm.")
    aggregation: Aggregation = Field(
        default="sequence_mean", description="How token losses become one number."
    )


class GrpoRocConfig(PolicyGradientConfig):
    """GRPO-RoC (rStar2-Agent): sample 2G, reject equal-reward groups, keep G by RoC."""

    name: Literal["grpo_roc"] = Field(default="grpo_roc", description="The algorithm.")
    clip_high: float = Field(default=0.28, ge=0, description="PPO clip above: 1 + clip_high.")
    filtering: Filtering = Field(
        default="reject_equal",
        description="Equal-reward groups: keep, reject, or reject and ask for more (DAPO).",
    )
    oversample: int = Field(
        default=2, ge=1, description="Trajectories sampled per prompt = oversample * group_size."
    )
    roc: RocConfig = Field(
        default_factory=SampledRocConfig, description="How G are kept out of the oversampled."
    )

    @property
    def rollouts_per_prompt(self) -> int:
        return self.oversample * self.group_size


class DrGrpoConfig(PolicyGradientConfig):
    """Dr. GRPO: mean-centred advantages (no std) and a constant length normaliser."""

    name: Literal["dr_grpo"] = Field(default="dr_grpo", description="The algorithm.")
    advantage: AdvantageEstimator = Field(
        default="group_mean", description="How a group's rewards become advantages."
    )
    aggregation: Aggregation = Field(
        default="token_sum_norm", description="How token losses become one number."
    )


class DapoConfig(PolicyGradientConfig):
    """DAPO: Clip-Higher, token-level loss, dynamic sampling of groups with reward variance."""

    name: Literal["dapo"] = Field(default="dapo", description="The algorithm.")
    clip_high: float = Field(default=0.28, ge=0, description="PPO clip above: 1 + clip_high.")
    filtering: Filtering = Field(
        default="dynamic",
        description="Equal-reward groups: keep, reject, or reject and ask for more (DAPO).",
    )


class GspoConfig(PolicyGradientConfig):
    """GSPO: one length-normalised importance ratio per sequence, with a narrow clip."""

    ratio_level: ClassVar[Literal["token", "sequence"]] = "sequence"

    name: Literal["gspo"] = Field(default="gspo", description="The algorithm.")
    clip_low: float = Field(default=3e-4, ge=0, lt=1, description="PPO clip below: 1 - clip_low.")
    clip_high: float = Field(default=4e-4, ge=0, description="PPO clip above: 1 + clip_high.")
    aggregation: Aggregation = Field(
        default="sequence_mean", description="How token losses become one number."
    )


class RlooConfig(PolicyGradientConfig):
    """RLOO: each trajectory's baseline is the mean reward of the others in its group."""

    name: Literal["rloo"] = Field(default="rloo", description="The algorithm.")
    advantage: AdvantageEstimator = Field(
        default="leave_one_out", description="How a group's rewards become advantages."
    )


def _algorithm_name(value: Any) -> str | None:
    """The union's tag: `name`, with `grpo_roc` when a mapping leaves it out."""
    if isinstance(value, dict):
        return value.get("name", "grpo_roc")
    return getattr(value, "name", None)


AlgoConfig = Annotated[
    Annotated[GrpoConfig, Tag("grpo")]
    | Annotated[GrpoRocConfig, Tag("grpo_roc")]
    | Annotated[DrGrpoConfig, Tag("dr_grpo")]
    | Annotated[DapoConfig, Tag("dapo")]
    | Annotated[GspoConfig, Tag("gspo")]
    | Annotated[RlooConfig, Tag("rloo")],
    Discriminator(_algorithm_name),
]
"""The algorithm's configuration: a union selected by `name` (default `grpo_roc`)."""

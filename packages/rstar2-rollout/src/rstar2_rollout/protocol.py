"""`SamplingProtocol`: how a set of problems is sampled and scored, one model for every app.

A protocol is what makes two accuracies comparable: samples per problem, temperature, top-p,
the turn and response budgets, the seed and the reward settings (`RewardConfig`: which text is
graded, what a truncated trajectory earns). rstar2-train's evaluations and `rstar2-eval` both
read it (the evaluator's config *is* one, so its keys are the protocol's), `apply` turns it into
the `RolloutConfig` the agent loop runs, and `overrides` writes it as the `key=value` settings
`rstar2-eval` takes, so a training run can print the command that reproduces its numbers.

It lives in rstar2-rollout because both apps import rollout and it shapes rollouts; the reward
settings are data here, the rule that reads them is rstar2-verify's (`rstar2_verify.reward`,
through its `RewardRule` Protocol), so rollout gains no dependency on verify.

Not covered: which problems (a benchmark, a held-out set) and the engine or tool settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_rollout.config import RolloutConfig

__all__ = ["RewardConfig", "SamplingProtocol"]


class RewardConfig(BaseModel):
    """What is graded and how a grade becomes the reward (read by `rstar2_verify.reward`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    graded: Literal["answer_block", "response"] = Field(
        default="answer_block",
        description="answer_block: only the final <answer> block (training); "
        "response: the whole response with fallback extraction (free-form evaluation).",
    )
    truncated: Literal["zero", "graded"] = Field(
        default="zero",
        description="zero: a trajectory cut by the token budget gets 0 (the paper); "
        "graded: it is graded like any other.",
    )


class SamplingProtocol(BaseModel):
    """Sampling and scoring of an evaluation; the defaults are the paper's (section 5.1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples: int = Field(default=16, gt=0, description="Samples per problem (n).")
    temperature: float = Field(default=0.6, ge=0, description="Sampling temperature (0: greedy).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_turns: int = Field(default=30, gt=0, description="Assistant turns per sample.")
    max_response_tokens: int = Field(
        default=30720, gt=0, description="Response-token budget over all turns (tool output too)."
    )
    seed: int = Field(default=0, description="Run seed; each sample's seed derives from it.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig,
        description="What is graded and how it becomes the reward (default: training's rule).",
    )

    def apply(self, base: RolloutConfig) -> RolloutConfig:
        """`base` (engine-independent loop settings) with this protocol's sampling."""
        return base.model_copy(
            update={
                "n": self.samples,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "max_turns": self.max_turns,
                "max_response_tokens": self.max_response_tokens,
                "seed": self.seed,
            }
        )

    def overrides(self) -> list[str]:
        """The protocol as `key=value` settings (the keys of `rstar2-eval`'s config)."""
        flat = self.model_dump(mode="json", exclude={"reward"})
        return [f"{k}={v}" for k, v in flat.items()] + [
            f"reward.{k}={v}" for k, v in self.reward.model_dump(mode="json").items()
        ]

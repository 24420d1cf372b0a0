"""Configuration of the research scheduling policies, apart from the product's.

`rstar2_rollout.config.SchedulerConfig` offers what the project recommends (least_requests,
kv_aware); every recipe, `rstar2-train --help-config` and `rstar2-rollout serve --policy` see only
those. The policies that lost (SCHEDULER.md, "Results") and the peers' dispatch are configured
here: `ResearchSchedulerConfig` is a `SchedulerConfig` whose `policy` also takes them, for the
simulator, the benches (bench/rollout_sched.py, bench/calibrate_engine.py) and the tests that
compare policies; `scheduler.make_admission` builds their admissions from `research.policies`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_rollout.config import (
    KVAwarePolicy,
    LeastRequestsPolicy,
    SchedulerConfig,
    _KVAdmission,
)

__all__ = [
    "CacheAwarePolicy",
    "ForecastPolicy",
    "KVProgressPolicy",
    "LeastTokensPolicy",
    "PowerOfTwoPolicy",
    "ResearchPolicy",
    "ResearchSchedulerConfig",
    "StaticPolicy",
]


class KVProgressPolicy(_KVAdmission):
    """Like kv_aware, but every turn is admitted on the exact worst case of the engine's future KV
    use given how far each running turn has come (`kvbound.peak_kv_tokens`): still no preemption,
    more trajectories at once. Engines that report no progress count every turn at its worst case.
    """

    kind: Literal["kv_progress"] = "kv_progress"
    headroom: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="Share of each engine's KV cache never planned for (the engine's watermark).",
    )
    lag_steps: int = Field(
        default=32,
        ge=0,
        description="Decode steps a turn may fall behind the others (a late start, a skipped step).",
    )


class StaticPolicy(BaseModel):
    """Pre-assign every job of a batch to an engine and start everything at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["static"] = "static"
    split: Literal["chunks", "round_robin"] = Field(
        default="chunks",
        description=(
            "chunks: engine e takes the e-th contiguous slice of the batch, so a problem's samples"
            " share an engine (verl's data-parallel dispatch); round_robin: job i to engine i mod E."
        ),
    )


class PowerOfTwoPolicy(BaseModel):
    """sglang-router's power of two choices: of two engines drawn at random, the less loaded."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["power_of_two"] = "power_of_two"
    seed: int = Field(default=0, description="Seed of the draws.")


class CacheAwarePolicy(BaseModel):
    """sglang-router's cache-aware routing: where the prompt is cached unless the load is
    imbalanced (then the shortest queue); no match: the engine with the least cached."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["cache_aware"] = "cache_aware"
    balance_abs_threshold: int = Field(
        default=64, ge=0, description="Imbalanced when max - min running exceeds this ..."
    )
    balance_rel_threshold: float = Field(
        default=1.5, ge=1, description="... and max exceeds this many times min."
    )


class LeastTokensPolicy(BaseModel):
    """Send each job to the engine with the fewest outstanding tokens (KV in use + queued)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["least_tokens"] = "least_tokens"


class ForecastPolicy(BaseModel):
    """A central queue; a job starts on the least-loaded engine below its limit: the engine's KV
    over the forecast mean context of a running job (length distribution from this batch's
    finished and running jobs), backed off when the engine preempts (see `research/forecast.py`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["forecast"] = "forecast"
    prior_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Mean response length (share of the budget) assumed before any is known.",
    )
    headroom: float = Field(
        default=0.0, ge=0, lt=1, description="Share of each engine's KV cache never planned for."
    )
    target_share: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="KV share in use below which an engine that has not preempted takes more.",
    )
    max_running_fallback: int = Field(
        default=256,
        gt=0,
        description="Jobs per engine at most where the engine reports no max_running (and the"
        " whole limit where it reports no KV capacity).",
    )
    backoff: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="An engine that preempted takes new jobs only below this share of its"
        " running ones (then one more per recheck while it does not preempt).",
    )
    recheck_interval_s: float = Field(
        default=0.5, gt=0, description="How often waiting jobs re-read the engines."
    )
    reorder_interval_s: float = Field(
        default=5.0, ge=0, description="How often the length forecast (and the order) is redone."
    )
    order: Literal["fifo", "longest_expected"] = Field(
        default="fifo",
        description="Queue order: as submitted, or problems with the longest expected samples"
        " first (measured slower in the simulator; see SCHEDULER.md).",
    )


ResearchPolicy = Annotated[
    ForecastPolicy
    | KVAwarePolicy
    | KVProgressPolicy
    | StaticPolicy
    | LeastRequestsPolicy
    | PowerOfTwoPolicy
    | CacheAwarePolicy
    | LeastTokensPolicy,
    Field(discriminator="kind"),
]


class ResearchSchedulerConfig(SchedulerConfig):
    """A `SchedulerConfig` whose policy may also be a research one (this module's)."""

    policy: ResearchPolicy = Field(  # type: ignore[assignment]
        default_factory=LeastRequestsPolicy,
        description="Which engine each job gets and when it starts, research policies included.",
    )

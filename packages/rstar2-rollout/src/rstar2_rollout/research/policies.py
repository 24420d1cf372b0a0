"""The research policies' `Admission`s, by config: what `scheduler.make_admission` imports lazily.

`make_research_admission(policy, pool)` builds the admission of every `SchedulerConfig.policy`
kind that is not on the main surface (kv_progress, forecast, static, power_of_two, cache_aware,
least_tokens); it raises for a kind it does not know (the main surface builds least_requests and
kv_aware itself).
"""

from __future__ import annotations

from pydantic import BaseModel

from rstar2_rollout.admission import Admission, Pool
from rstar2_rollout.research.config import (
    CacheAwarePolicy,
    ForecastPolicy,
    KVProgressPolicy,
    LeastTokensPolicy,
    PowerOfTwoPolicy,
    StaticPolicy,
)
from rstar2_rollout.research.forecast import Forecast
from rstar2_rollout.research.kvprogress import KVProgress
from rstar2_rollout.research.peers import (
    CacheAware,
    LeastTokens,
    PowerOfTwo,
    RoundRobin,
    StaticSlices,
)


def make_research_admission(policy: BaseModel, pool: Pool) -> Admission:
    """Builds the admission of a research policy's config, over the engines of `pool`."""
    if isinstance(policy, ForecastPolicy):
        return Forecast(pool, policy)
    if isinstance(policy, KVProgressPolicy):
        return KVProgress(pool, policy)
    if isinstance(policy, StaticPolicy):
        return StaticSlices(pool) if policy.split == "chunks" else RoundRobin(pool)
    if isinstance(policy, PowerOfTwoPolicy):
        return PowerOfTwo(pool, policy)
    if isinstance(policy, CacheAwarePolicy):
        return CacheAware(pool, policy)
    if isinstance(policy, LeastTokensPolicy):
        return LeastTokens(pool, policy)
    raise AssertionError(f"no admission for {policy!r}")  # the union is closed

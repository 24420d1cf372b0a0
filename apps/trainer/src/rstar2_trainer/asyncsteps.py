"""The trainer's `async` section: steps that do not wait for the slowest trajectory.

`AsyncConfig` holds the settings (`max_staleness`, `partial_rollout`, `at_push`); `check_async`
refuses, one line each, the combinations the trainer does not build (the trainer README,
"Asynchronous steps", says what each does). `at_push: abort` reaches the engines through
`TrainerConfig.engine_for`, which fills the vLLM engine's own `at_push`.

Asynchronous steps train tokens sampled on older weights (a batch drawn ahead starts on W(t-1);
a carried group's later turns run on W(t)), and with one optimizer step the PPO ratio is 1, so
only the off-policy correction weighs them: `off_policy_default` gives token-level TIS (cap 2)
to an asynchronous run whose recipe chose no `algo.off_policy`. `top_p` < 1 rules TIS and MIS
out (vLLM renormalises its logprobs over the nucleus, the trainer's are not, so every token
would look off-policy): refused with either, and an asynchronous run with top_p < 1 must say
`algo.off_policy.kind: none` to train its stale tokens uncorrected.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rstar2_algos import TisConfig
from rstar2_config import Section


class AsyncConfig(Section):
    """Steps that do not wait for the slowest trajectory. `max_staleness >= 1` alone is
    one-step-off: every step submits the next step's batch before it trains and trains the batch
    submitted the step before, whole. With `partial_rollout` a step trains the groups due (started
    `max_staleness` steps before) and then the first to finish. Both with local engines, split placement (generating while the policy
    trains) or colocated (the engines finish their running turns, sleep while the ranks train,
    and take the held turns up again on the new weights): trainer README, "Asynchronous steps".
    What is not built is refused in one line, not silently ignored."""

    max_staleness: int = Field(
        default=0,
        ge=0,
        description="Steps a group may run before it is trained (the pool holds (max_staleness "
        "+ 1) x batch_size groups and trains a group at the latest max_staleness steps after it "
        "started; none is dropped); 0 is synchronous, >= 1 alone is one-step-off (each step "
        "trains the batch submitted the step before, whole; not remote).",
    )
    partial_rollout: bool = Field(
        default=False,
        description="Train on the groups due and then the first that finish; the rest go on "
        "generating during the update and the sync, or after it when colocated (needs "
        "max_staleness >= 1; not remote).",
    )
    at_push: Literal["wait", "abort"] = Field(
        default="wait",
        description="A turn running at a weight push ends on the old weights first (wait) or is "
        "aborted and resumed on the new ones (abort: max_staleness >= 1, vllm engines).",
    )


def check_async(config: Any) -> None:
    """Raise ValueError (one line, with the fix) for an `async` section the trainer cannot run
    with the rest of `config` (a `TrainerConfig`)."""
    steps = config.async_
    if steps.partial_rollout and steps.max_staleness == 0:
        raise ValueError(
            "async.partial_rollout needs async.max_staleness >= 1 (a group carried over a "
            "weight sync is one version behind); set async.max_staleness: 1"
        )
    if steps.at_push == "abort" and not (
        steps.max_staleness > 0 and getattr(config.engine_for("", 0), "at_push", "") == "abort"
    ):
        raise ValueError(
            "async.at_push: abort needs async.max_staleness >= 1 and a vllm engine "
            "(not set to engine.at_push: wait); set async.at_push: wait"
        )
    if steps.max_staleness > 0 and config.remote is not None:
        raise ValueError(
            "async.max_staleness > 0 with remote rollout services is not implemented yet "
            "(their weight update waits for open streams); set async.max_staleness: 0"
        )
    off_policy = config.algo.off_policy
    if off_policy.kind != "none" and config.rollout.top_p < 1:
        raise ValueError(
            f"algo.off_policy.kind {off_policy.kind} with rollout.top_p {config.rollout.top_p}: "
            "the engines' logprobs are renormalised over the nucleus and the trainer's are not, so "
            "every token looks off-policy; set rollout.top_p: 1 or algo.off_policy.kind: none"
        )
    if steps.max_staleness > 0 and _unchosen(config) and config.rollout.top_p < 1:
        raise ValueError(
            "async.max_staleness >= 1 trains tokens sampled on older weights, corrected by "
            "algo.off_policy (tis by default), which rollout.top_p < 1 rules out; set "
            "rollout.top_p: 1, or algo.off_policy.kind: none to train them uncorrected"
        )


def off_policy_default(config: Any) -> TisConfig | None:
    """Token-level TIS for an asynchronous run whose recipe chose no `algo.off_policy`; None
    when the recipe chose one or the steps are synchronous."""
    if config.async_.max_staleness > 0 and _unchosen(config):
        return TisConfig(level="token")
    return None


def _unchosen(config: Any) -> bool:
    return "off_policy" not in config.algo.model_fields_set

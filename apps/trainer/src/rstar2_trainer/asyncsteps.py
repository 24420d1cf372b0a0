"""The trainer's `async` section: steps that do not wait for the slowest trajectory (issue #30).

`AsyncConfig` holds the settings (`max_staleness`, `partial_rollout`, `at_push`); `check_async`
refuses, one line each, the combinations the trainer does not build (the trainer README,
"Asynchronous steps", says what each does). `at_push: abort` reaches the engines through
`TrainerConfig.engine_for`, which fills the vLLM engine's own `at_push`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rstar2_config import Section


class AsyncConfig(Section):
    """Steps that do not wait for the slowest trajectory (issue #30). `max_staleness >= 1` alone
    is one-step-off: every step submits the next step's batch before it trains and trains the
    batch submitted the step before, whole. With `partial_rollout` a step trains the first groups
    to finish instead. Both with local engines, split placement (generating while the policy
    trains) or colocated (the engines finish their running turns, sleep while the ranks train,
    and take the held turns up again on the new weights): trainer README, "Asynchronous steps".
    What is not built is refused in one line, not silently ignored."""

    max_staleness: int = Field(
        default=0,
        ge=0,
        description="How many weight versions older than the trainer's a trained group's oldest "
        "token may be (older groups are dropped and counted); 0 is synchronous, >= 1 alone is "
        "one-step-off (each step trains the batch submitted the step before, whole; not remote).",
    )
    partial_rollout: bool = Field(
        default=False,
        description="Train on the first groups that finish; the rest go on generating during "
        "the update and the sync, or after it when colocated (needs max_staleness >= 1; not "
        "remote).",
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

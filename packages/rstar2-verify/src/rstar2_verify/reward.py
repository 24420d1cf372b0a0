"""The reward of agentic maths RL: which text is graded, how a grade becomes a reward, and what
counts as correct. The trainer, the evaluator and every statistic use these and nothing else.

- `graded_text(config, response=..., final_answer=...)`: the text handed to `grade`.
  `answer_block` (training, the paper's rule): only the final `<answer>` block the agent loop
  found, so a boxed number in a tool output or in the reasoning never earns a reward.
  `response` (free-form evaluation): the whole response, with `extract_answer`'s fallbacks.
- `reward_of(grade, finish_reason, config)`: 1.0 for a correct grade, else 0.0; a truncated
  trajectory (finish reason `max_length`) gets 0.0 under `truncated: zero`, the paper's rule,
  even when it wrote a right answer before the budget ran out.
- `is_correct(reward)`: the one threshold (`CORRECT_THRESHOLD`, a reward above it is a positive).

The settings are data of the sampling protocol (`rstar2_rollout.RewardConfig`, a pydantic model);
this package reads them through the `RewardRule` Protocol and imports no sibling for them.

Not covered: grading itself (`grader.py`) and any shaped reward (the paper's reward is the
answer's correctness alone; tool errors and format act through Resample-on-Correct instead).
"""

from __future__ import annotations

from typing import Literal, Protocol

from rstar2_verify.grader import Grade

__all__ = [
    "CORRECT",
    "CORRECT_THRESHOLD",
    "WRONG",
    "RewardRule",
    "graded_text",
    "is_correct",
    "reward_of",
]

CORRECT = 1.0
WRONG = 0.0
CORRECT_THRESHOLD = 0.5  # a reward above this is a positive (a correct trajectory)

TRUNCATED = "max_length"  # the agent loop's finish reason when the token budget ran out


class RewardRule(Protocol):
    """The reward settings the rule reads (rstar2-rollout's `RewardConfig` is one)."""

    @property
    def graded(self) -> Literal["answer_block", "response"]: ...

    @property
    def truncated(self) -> Literal["zero", "graded"]: ...


def graded_text(config: RewardRule, *, response: str, final_answer: str | None) -> str:
    """The text to grade: the `<answer>` block (empty when there is none) or the response."""
    if config.graded == "response":
        return response
    return f"<answer>{final_answer}</answer>" if final_answer else ""


def reward_of(grade: Grade | None, finish_reason: str | None, config: RewardRule) -> float:
    """1.0 when `grade` is correct and the trajectory counts, else 0.0 (`grade` None: ungraded)."""
    if finish_reason == TRUNCATED and config.truncated == "zero":
        return WRONG
    return CORRECT if grade is not None and grade.correct else WRONG


def is_correct(reward: float) -> bool:
    """Whether a reward marks a correct trajectory."""
    return reward > CORRECT_THRESHOLD

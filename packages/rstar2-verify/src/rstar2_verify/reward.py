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

Not covered: grading itself (`grader.py`) and any shaped reward (the paper's reward is the
answer's correctness alone; tool errors and format act through Resample-on-Correct instead).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_verify.grader import Grade

__all__ = [
    "CORRECT",
    "CORRECT_THRESHOLD",
    "WRONG",
    "RewardConfig",
    "graded_text",
    "is_correct",
    "reward_of",
]

CORRECT = 1.0
WRONG = 0.0
CORRECT_THRESHOLD = 0.5  # a reward above this is a positive (a correct trajectory)

TRUNCATED = "max_length"  # the agent loop's finish reason when the token budget ran out


class RewardConfig(BaseModel):
    """What is graded and how a grade becomes the reward."""

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


def graded_text(config: RewardConfig, *, response: str, final_answer: str | None) -> str:
    """The text to grade: the `<answer>` block (empty when there is none) or the response."""
    if config.graded == "response":
        return response
    return f"<answer>{final_answer}</answer>" if final_answer else ""


def reward_of(grade: Grade | None, finish_reason: str | None, config: RewardConfig) -> float:
    """1.0 when `grade` is correct and the trajectory counts, else 0.0 (`grade` None: ungraded)."""
    if finish_reason == TRUNCATED and config.truncated == "zero":
        return WRONG
    return CORRECT if grade is not None and grade.correct else WRONG


def is_correct(reward: float) -> bool:
    """Whether a reward marks a correct trajectory."""
    return reward > CORRECT_THRESHOLD

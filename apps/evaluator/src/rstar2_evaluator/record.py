"""`SampleRecord`: one finished, graded sample, as written to a run's `samples.jsonl`.

A record is written only when its sample is complete (generated to the end and graded); a
sample that failed for an outside reason (the engine or the endpoint went away) is never
written, so a rerun produces it again. Not covered: how records are stored (`store.py`) or
summarised (`metrics.py`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SampleRecord(BaseModel):
    """One graded sample of one problem."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    problem_id: str = Field(description="The problem's id within the benchmark.")
    sample_index: int = Field(ge=0, description="0 .. samples-1.")
    reference: str = Field(description="The reference answer.")
    answer: str | None = Field(description="The extracted final answer; None: none found.")
    answer_key: str | None = Field(description="The normalised answer majority vote counts.")
    correct: bool = Field(description="The grader's verdict.")
    finish_reason: str = Field(description="Why the agent loop stopped.")
    response_tokens: int = Field(ge=0, description="Tokens after the prompt, tool output included.")
    sampled_tokens: int = Field(ge=0, description="Tokens the model generated.")
    turns: int = Field(ge=0, description="Assistant turns.")
    tool_calls: dict[str, int] = Field(
        default_factory=dict, description="Tool-call outcome -> count (ok, error, ...)."
    )
    seconds: float = Field(default=0.0, ge=0, description="Wall time of the sample.")
    response: str = Field(default="", description="The decoded response text.")
    score: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="A reference checker's score of the sample (IFEval, BFCL, ...); None: the "
        "grade alone (maths, choices).",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="What the sample saw and how it was scored: a choice's option order, a "
        "checker's verdict details.",
    )

    @property
    def key(self) -> tuple[str, int]:
        """What identifies the sample within a run."""
        return (self.problem_id, self.sample_index)

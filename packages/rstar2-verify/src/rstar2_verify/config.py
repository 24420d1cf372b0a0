"""Configuration of the grader: cost bounds and the worker pool.

One frozen model, handed to `grade`, `Grader` and `VerifyServer`; nothing here reads the
environment. Every bound exists so that a hostile or broken answer costs a bounded amount of time
and memory, never a hang.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class VerifyConfig(BaseModel):
    """Bounds on what grading may cost, and how many processes do the symbolic work."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(
        default=0.8,
        gt=0,
        le=600,
        description="Wall-clock bound of one whole grade: extraction, parsing, the exact "
        "comparison and the symbolic check (with the wait for a worker) together.",
    )
    max_answer_chars: int = Field(
        default=20_000, gt=0, description="Longer extracted answers (and golds) are not parsed."
    )
    max_response_chars: int = Field(
        default=2_000_000, gt=0, description="Longer responses are rejected before extraction."
    )
    max_raw_chars: int = Field(
        default=300,
        gt=0,
        description="A response with no box, answer tag or answer line is taken whole up to this.",
    )
    max_depth: int = Field(
        default=64, gt=0, le=500, description="Deepest bracket nesting any parser will see."
    )
    max_digits: int = Field(
        default=20_000,
        gt=0,
        description="Largest exact number (in decimal digits) a power or factorial may produce.",
    )
    workers: int | None = Field(
        default=None,
        gt=0,
        le=256,
        description="Processes for symbolic comparison; None means one per CPU core.",
    )
    memory_mb: int = Field(
        default=1024, ge=256, description="Address-space cap (RLIMIT_AS) of each worker process."
    )
    max_batch: int = Field(
        default=8192, gt=0, description="Most requests the server accepts in one GradeBatch call."
    )

"""Grading for the trainer: the verify gRPC client, or the library in-process; one interface.

Only the text of the `<answer>` block is graded (the paper extracts the final answer from
`\\boxed{}` inside `<answer>`), so a boxed number in a tool output or in the reasoning never earns
a reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_verify import Grade, VerifyConfig


@dataclass
class Verifier:
    """Grades (answer text, gold) pairs; `close` releases the client or the worker pool."""

    _client: Any = None
    _grader: Any = None

    @classmethod
    def remote(cls, address: str, token: str | None = None) -> Verifier:
        from rstar2_verify.client import VerifyClient

        return cls(_client=VerifyClient(address, token=token))

    @classmethod
    def local(cls, config: VerifyConfig) -> Verifier:
        from rstar2_verify import Grader

        return cls(_grader=Grader(config))

    async def grade_many(self, pairs: Sequence[tuple[str, str]]) -> list[Grade]:
        if not pairs:
            return []
        if self._client is not None:
            return await self._client.grade_many(pairs)
        return await self._grader.agrade_many(pairs)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._grader is not None:
            self._grader.close()


def answer_text(final_answer: str | None) -> str:
    """What is graded: the `<answer>` block, or nothing when the trajectory gave none."""
    return f"<answer>{final_answer}</answer>" if final_answer else ""

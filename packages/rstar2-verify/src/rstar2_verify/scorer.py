"""Grading where the grader runs, and the reward of a finished trajectory: `Verifier`, `Scorer`.

`Verifier` grades (text, gold) pairs with one async method, `grade_many`, wherever grading runs:
in this process (`Grader`'s killable worker pool), on one verify server (`VerifyClient`) or on
many (`VerifyPool`). `Scorer` applies the reward rule (`reward.py`) to a trajectory: which text
is graded (`graded`: the `<answer>` block the agent loop found, or the whole response decoded
with the tokenizer), the grade-to-reward mapping and truncation; `score(problem, trajectory)`
sets `trajectory.reward` and returns the grade (None: nothing to grade). It is the grader that
`rstar2_rollout.collect` takes, so every app scores a trajectory the same way. Its `kind` is
chosen at construction: `math` grades through the `Verifier`; `choice` (multiple choice, the gold
a letter) grades with `choice.grade_choice` in this process whatever the Verifier is, since a
letter needs no parser, no sympy and no worker.

Both are typed on Protocols (`Answered`, `Scored`): this package imports no sibling but proto.
Not covered: sampling (rstar2-rollout) and what a caller does with the grades.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rstar2_verify.choice import grade_choice
from rstar2_verify.config import VerifyConfig
from rstar2_verify.grader import Grade
from rstar2_verify.reward import RewardRule, graded_text, reward_of

__all__ = ["Answered", "GradeBackend", "Scored", "Scorer", "Verifier"]


class GradeBackend(Protocol):
    """A verify client or pool: `grade_many` and `close`, both async."""

    async def grade_many(self, pairs: Sequence[tuple[str, str]]) -> list[Grade]: ...

    async def close(self) -> None: ...


class Answered(Protocol):
    """What the scorer needs of a problem: its reference answer."""

    @property
    def answer(self) -> str: ...


class Scored(Protocol):
    """What the scorer needs of a trajectory (rstar2-rollout's `Trajectory` is one)."""

    response_ids: list[int]
    final_answer: str | None
    finish_reason: Any
    reward: float


@dataclass
class Verifier:
    """Grades (answer text, gold) pairs; `close` releases the client, pool or worker pool."""

    _client: GradeBackend | None = None
    _grader: Any = None  # an in-process rstar2_verify.Grader

    @classmethod
    def remote(cls, address: str, token: str | None = None, retry_for_s: float = 0.0) -> Verifier:
        """One verify server; a call it refuses as UNAVAILABLE is sent again for `retry_for_s`."""
        from rstar2_verify.client import VerifyClient

        return cls(_client=VerifyClient(address, token=token, retry_for_s=retry_for_s))

    @classmethod
    def pool(
        cls, addresses: Sequence[str], token: str | None = None, retry_for_s: float = 0.0
    ) -> Verifier:
        """Several verify servers, least outstanding first, with fail-over (and retry)."""
        from rstar2_verify.client import VerifyPool

        return cls(_client=VerifyPool(addresses, token=token, retry_for_s=retry_for_s))

    @property
    def retried(self) -> int:
        """Calls the client sent more than once (0 in-process)."""
        return int(getattr(self._client, "retried", 0))

    @classmethod
    def local(cls, config: VerifyConfig) -> Verifier:
        """The library in this process (its symbolic checks in killable workers)."""
        from rstar2_verify.grader import Grader

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


@dataclass
class Scorer:
    """Sets a trajectory's reward by a reward rule (see the module docstring)."""

    verifier: Verifier
    config: RewardRule
    tokenizer: Any  # decodes the response when the whole response is graded
    kind: Literal["math", "choice"] = "math"  # what the gold is: a maths answer or a letter

    def under(self, config: RewardRule) -> Scorer:
        """This scorer with another reward rule (same verifier, tokenizer and kind)."""
        return Scorer(self.verifier, config, self.tokenizer, self.kind)

    def of_kind(self, kind: Literal["math", "choice"]) -> Scorer:
        """This scorer for another answer kind (same verifier, rule and tokenizer)."""
        return Scorer(self.verifier, self.config, self.tokenizer, kind)

    def text(self, traj: Scored) -> str:
        """The text the rule grades ("" when there is nothing to grade)."""
        response = ""
        if self.config.graded == "response":
            response = self.tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        return graded_text(self.config, response=response, final_answer=traj.final_answer)

    async def score(self, problem: Answered, trajectory: Scored) -> Grade | None:
        """Grade `trajectory` against `problem`'s answer, set its reward, return the grade."""
        text = self.text(trajectory)
        if not text:
            grade = None
        elif self.kind == "choice":
            grade = grade_choice(text, problem.answer)
        else:
            grade = (await self.verifier.grade_many([(text, problem.answer)]))[0]
        trajectory.reward = reward_of(grade, trajectory.finish_reason, self.config)
        return grade

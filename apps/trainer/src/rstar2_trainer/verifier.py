"""Grading for the trainer: the verify gRPC client, or the library in-process; one interface.

`Verifier` grades (text, gold) pairs wherever the grader runs. `Scorer` turns a finished
trajectory into its reward with rstar2-verify's reward rule (`rstar2_verify.reward`): which text
is graded (`reward.graded`: the `<answer>` block by default, so a boxed number in a tool output or
in the reasoning never earns a reward), the grade-to-reward mapping and truncation. `rstar2-eval`
uses the same rule, so the trainer's held-out accuracy and the evaluator's agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_curriculum import Problem
from rstar2_rollout.trajectory import Trajectory
from rstar2_verify import Grade, VerifyConfig
from rstar2_verify.reward import RewardConfig, graded_text, reward_of


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


@dataclass
class Scorer:
    """Sets a trajectory's reward by the run's reward rule (see the module docstring)."""

    verifier: Verifier
    config: RewardConfig
    tokenizer: Any  # decodes the response when the whole response is graded

    def text(self, traj: Trajectory) -> str:
        """The text the rule grades ("" when there is nothing to grade)."""
        response = ""
        if self.config.graded == "response":
            response = self.tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        return graded_text(self.config, response=response, final_answer=traj.final_answer)

    async def score(self, problem: Problem, traj: Trajectory) -> Grade | None:
        """Grade `traj` against `problem`'s answer, set `traj.reward`, return the grade."""
        text = self.text(traj)
        grade = (await self.verifier.grade_many([(text, problem.answer)]))[0] if text else None
        traj.reward = reward_of(grade, traj.finish_reason, self.config)
        return grade

"""`Scorer`: a finished trajectory's reward by the rule, graded by a `Verifier` in this process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from rstar2_verify import Scorer, Verifier, VerifyConfig


@dataclass(frozen=True)
class Rule:
    graded: Literal["answer_block", "response"] = "answer_block"
    truncated: Literal["zero", "graded"] = "zero"


@dataclass
class Traj:
    """What the scorer reads of a trajectory; the response is its text as code points."""

    text: str
    final_answer: str | None
    finish_reason: str = "answered"
    reward: float = -1.0
    response_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.response_ids = [ord(c) for c in self.text]


class CodePoints:
    """A tokenizer whose ids are code points."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


@dataclass(frozen=True)
class Question:
    answer: str


def test_the_rule_decides_what_is_graded_and_what_a_truncated_answer_earns():
    boxed_in_reasoning = Traj("so it is \\boxed{12}.", final_answer=None)
    cut = Traj("<answer>\\boxed{12}</answer> and", "\\boxed{12}", finish_reason="max_length")
    wrong = Traj("<answer>\\boxed{13}</answer>", "\\boxed{13}")

    async def score(rule: Rule) -> list[tuple[float, str | None]]:
        verifier = Verifier.local(VerifyConfig(workers=1))
        scorer = Scorer(verifier, rule, CodePoints())
        try:
            out = []
            for traj in (boxed_in_reasoning, cut, wrong):
                grade = await scorer.score(Question("12"), traj)
                out.append((traj.reward, grade.extracted if grade else None))
            return out
        finally:
            await verifier.close()

    training = asyncio.run(score(Rule()))
    free_form = asyncio.run(score(Rule(graded="response", truncated="graded")))
    assert training == [(0.0, None), (0.0, "12"), (0.0, "13")]
    assert free_form == [(1.0, "12"), (1.0, "12"), (0.0, "13")]

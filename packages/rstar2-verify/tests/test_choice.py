"""Multiple-choice letters: an answer kind of its own, with its labelled cases held out.

The own cases are in `data/labelled.jsonl` (category `choice`, kind `choice`), so
`rstar2-verify check` scores them beside the maths. The external cases, transcribed from
lighteval's letter-extraction tests with their labels, are split as the maths external set is:
sha256(response NUL gold), first 8 hex digits mod 5 < 2 is held out, and the held-out file's
digest is pinned so that tuning on it shows up in review.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rstar2_verify import Scorer, Verifier, VerifyConfig, extract_choice, grade_choice
from rstar2_verify.check import check, load_cases

DATA = Path(__file__).parent / "data"
HELDOUT_SHA256 = "3fb31ada8935383808257055989e607ee557cf99478e090f13421af06e90f892"


def _split_of(response: str, gold: str) -> str:
    digest = hashlib.sha256(f"{response}\x00{gold}".encode()).hexdigest()
    return "heldout" if int(digest[:8], 16) % 5 < 2 else "dev"


def test_external_cases_sit_in_the_split_their_hash_gives_and_the_held_out_file_is_pinned():
    for name in ("dev", "heldout"):
        for line in (DATA / f"external_choice_{name}.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert row["source"] and row["kind"] == "choice"
            assert _split_of(row["response"], row["gold"]) == name, row
    held = (DATA / "external_choice_heldout.jsonl").read_bytes()
    assert hashlib.sha256(held).hexdigest() == HELDOUT_SHA256


def test_own_choice_cases_are_all_right(grader):
    cases = [c for c in load_cases(DATA / "labelled.jsonl") if c.kind == "choice"]
    assert len(cases) >= 40
    report = check(cases, grader)
    assert report.overall.accuracy == 1.0, report.mistakes


def test_external_choice_cases_and_no_false_positive(grader):
    for name, floor in (("dev", 0.9), ("heldout", 0.9)):
        report = check(load_cases(DATA / f"external_choice_{name}.jsonl"), grader)
        assert report.overall.accuracy >= floor, (name, report.mistakes)
        assert report.overall.false_positives == 0, (name, report.mistakes)


@given(st.integers(min_value=-(10**6), max_value=10**6), st.sampled_from("ABCD"))
def test_a_number_is_never_a_letter(number, letter):
    assert not grade_choice(f"<answer>\\boxed{{{number}}}</answer>", letter).correct
    assert extract_choice(f"Answer: {number}").text is None


@given(
    st.sampled_from("ABCD"),
    st.sampled_from("ABCD"),
    st.sampled_from(["{}", "({})", "\\text{{{}}}"]),
)
def test_each_letter_matches_only_itself(chosen, gold, form):
    response = f"<reason>...</reason><answer>\\boxed{{{form.format(chosen)}}}</answer>"
    got = grade_choice(response, gold)
    assert got.correct == (chosen == gold) and got.extracted == chosen and got.method == "choice"


def test_letters_beyond_the_choices_are_no_answer():
    assert extract_choice("\\boxed{E}").text is None
    assert extract_choice("\\boxed{E}", choices=5).text == "E"


@dataclass
class Traj:
    final_answer: str | None
    text: str = ""
    finish_reason: str = "answered"
    reward: float = -1.0
    response_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Rule:
    graded: str = "answer_block"
    truncated: str = "zero"


@dataclass(frozen=True)
class Question:
    answer: str


def test_the_scorer_grades_a_letter_in_its_choice_kind():
    async def score(kind):
        verifier = Verifier.local(VerifyConfig(workers=1))
        scorer = Scorer(verifier, Rule(), None).of_kind(kind)  # type: ignore[arg-type]
        try:
            rewards = []
            for answer in ("\\boxed{C}", "\\boxed{3}", "\\boxed{B}"):
                traj = Traj(final_answer=answer)
                await scorer.score(Question("C"), traj)
                rewards.append(traj.reward)
            return rewards
        finally:
            await verifier.close()

    assert asyncio.run(score("choice")) == [1.0, 0.0, 0.0]
    assert Scorer(None, Rule(), None, "choice").under(Rule()).kind == "choice"  # type: ignore[arg-type]

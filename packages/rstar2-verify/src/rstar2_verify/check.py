"""Score the grader on a labelled JSONL file: accuracy per category, false positives listed.

Each line is `{"response": str, "gold": str, "correct": bool, "category": str, "kind": str}`
(`category` optional, `id` optional; `kind` optional: `math`, the default, or `choice`, a
multiple-choice letter graded by `choice.grade_choice`). `load_cases` raises `CaseError` with the line number for a malformed
line; `check` grades every case with `Grader.grade_many` and returns a `CheckReport`.
This module does not write files; the CLI and the bench script print and save the report.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rstar2_verify.choice import grade_choice
from rstar2_verify.grader import Grade, Grader

__all__ = ["Case", "CaseError", "CategoryScore", "CheckReport", "check", "load_cases"]


class CaseError(ValueError):
    """A line of a labelled file is not a case."""


@dataclass(frozen=True, slots=True)
class Case:
    response: str
    gold: str
    correct: bool
    category: str = "all"
    kind: str = "math"


@dataclass(slots=True)
class CategoryScore:
    total: int = 0
    right: int = 0
    false_positives: int = 0
    false_negatives: int = 0

    @property
    def accuracy(self) -> float:
        return self.right / self.total if self.total else 0.0


@dataclass(slots=True)
class CheckReport:
    categories: dict[str, CategoryScore] = field(default_factory=dict)
    mistakes: list[tuple[Case, Grade]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def overall(self) -> CategoryScore:
        total = CategoryScore()
        for score in self.categories.values():
            total.total += score.total
            total.right += score.right
            total.false_positives += score.false_positives
            total.false_negatives += score.false_negatives
        return total


def load_cases(path: Path) -> list[Case]:
    """The cases of a labelled JSONL file (blank lines skipped)."""
    cases: list[Case] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            correct = row["correct"]
            if not isinstance(correct, bool):
                raise TypeError("`correct` must be true or false")
            kind = row.get("kind", "math")
            if kind not in ("math", "choice"):
                raise TypeError(f"`kind` must be math or choice, not {kind!r}")
            category = row.get("category", "all")
            cases.append(Case(str(row["response"]), str(row["gold"]), correct, category, kind))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CaseError(f"{path}:{number}: not a labelled case ({exc})") from None
    return cases


def check(cases: list[Case], grader: Grader) -> CheckReport:
    """Grade every case and score the verdicts against the labels."""
    import time

    start = time.perf_counter()
    maths = [c for c in cases if c.kind == "math"]
    verdicts = grader.grade_many((c.response, c.gold) for c in maths)
    graded = dict(zip(map(id, maths), verdicts, strict=True))
    grades = [
        graded[id(c)] if c.kind == "math" else grade_choice(c.response, c.gold) for c in cases
    ]
    report = CheckReport(seconds=time.perf_counter() - start)
    scores: dict[str, CategoryScore] = defaultdict(CategoryScore)
    for case, grade in zip(cases, grades, strict=True):
        score = scores[case.category]
        score.total += 1
        if grade.correct == case.correct:
            score.right += 1
            continue
        if grade.correct:
            score.false_positives += 1
        else:
            score.false_negatives += 1
        report.mistakes.append((case, grade))
    report.categories = dict(sorted(scores.items()))
    return report

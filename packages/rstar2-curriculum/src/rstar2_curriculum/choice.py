"""Multiple-choice problems (GPQA): loaded with their options, shown shuffled per sample.

A multiple-choice `Problem` keeps its options in `metadata["choices"]` with the right one first
(`metadata["correct"] == 0`) and its `answer` the right option's text. It is never shown that
way: `choice_variant(problem, seed, sample_index)` is the problem one sample sees, its options in
an order drawn from (seed, problem id, sample index) alone, lettered A, B, C, ..., its `answer`
the right option's letter and its `metadata` the permutation (`order[k]` is the original index
of the option shown as letter k), so a run's record says what each sample saw and a rerun sees
the same. The variant's `id` is `<id>#<sample index>` (each sample is its own question to the
agent loop); `metadata["problem_id"]` and `["sample_index"]` name the original.

GPQA's published CSV (Idavidrein/gpqa `gpqa_diamond.csv`, also the rows of its hub dataset) has
the columns `Question`, `Correct Answer`, `Incorrect Answer 1..3` and `Record ID` (among others);
`gpqa_problem` maps one row. The letter is graded by rstar2-verify's choice kind.

Not covered: questions with several right options.
"""

from __future__ import annotations

import csv
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from string import ascii_uppercase
from typing import Any

from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import DataError, RowError, text_at

__all__ = [
    "GPQA_COLUMNS",
    "choice_variant",
    "csv_rows",
    "gpqa_problem",
    "is_choice",
    "render_choices",
]

GPQA_COLUMNS = (
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)
CHOICE_INSTRUCTION = (
    "This is a multiple-choice question. Give the letter of the correct option ({letters}) as "
    "your final answer."
)


def is_choice(problem: Problem) -> bool:
    """Whether `problem` is a multiple-choice problem (its options in metadata)."""
    return isinstance(problem.metadata.get("choices"), list)


def gpqa_problem(row: Any, source: str, index: int) -> Problem:
    """One GPQA row as a multiple-choice Problem; RowError (the skip reason) for a bad row."""
    if not isinstance(row, dict):
        raise RowError("not_an_object")
    texts = [text_at(row, column, required=True) for column in GPQA_COLUMNS]
    question, *choices = [t for t in texts if t is not None]
    ident = text_at(row, "Record ID", required=False) or f"{source}/{index}"
    extra = {
        key: row[key]
        for key in ("Subdomain", "High-level domain")
        if isinstance(row.get(key), str) and row[key]
    }
    return Problem(
        id=ident,
        question=question,
        answer=choices[0],
        source=source,
        metadata={**extra, "choices": choices, "correct": 0},
    )


def csv_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Rows of a CSV file with a header line, as (location, dict); DataError when unreadable."""
    try:
        handle = path.open(encoding="utf-8", newline="")
    except OSError as error:
        raise DataError(f"{path}: cannot read it ({error.strerror})") from None

    def rows() -> Iterator[tuple[str, Any]]:
        with handle:
            try:
                for number, row in enumerate(csv.DictReader(handle), start=2):
                    yield f"line {number}", row
            except (csv.Error, UnicodeDecodeError) as error:
                raise DataError(f"{path}: not a readable CSV file ({error})") from None

    return rows()


def _order(seed: int, problem_id: str, sample_index: int, n: int) -> list[int]:
    text = f"{seed}/{problem_id}/{sample_index}/choices"
    draw = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return random.Random(draw).sample(range(n), n)


def render_choices(question: str, options: list[str]) -> str:
    """The question with its options lettered (`A) ...`) and the instruction to answer a letter."""
    letters = ascii_uppercase[: len(options)]
    lines = [f"{letter}) {option}" for letter, option in zip(letters, options, strict=True)]
    spelled = ", ".join(letters[:-1]) + f" or {letters[-1]}" if len(letters) > 1 else letters
    return (
        f"{question}\n\n" + "\n".join(lines) + "\n\n" + CHOICE_INSTRUCTION.format(letters=spelled)
    )


def choice_variant(problem: Problem, seed: int, sample_index: int) -> Problem:
    """The problem as sample `sample_index` sees it (module docstring)."""
    choices = problem.metadata.get("choices")
    if not isinstance(choices, list) or len(choices) < 2:
        raise ValueError(f"{problem.id} is not a multiple-choice problem")
    correct = int(problem.metadata.get("correct", 0))
    order = _order(seed, problem.id, sample_index, len(choices))
    shown = [str(choices[k]) for k in order]
    return Problem(
        id=f"{problem.id}#{sample_index}",
        question=render_choices(problem.question, shown),
        answer=ascii_uppercase[order.index(correct)],
        source=problem.source,
        metadata={
            **problem.metadata,
            "problem_id": problem.id,
            "sample_index": sample_index,
            "order": order,
        },
    )

"""Multiple-choice problems: GPQA's published CSV through the registry's loader, and the
seeded permutation each sample sees."""

from __future__ import annotations

import csv
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rstar2_curriculum import (
    BenchmarkConfig,
    BenchmarkError,
    Problem,
    choice_variant,
    is_choice,
    load_benchmark,
)

COLUMNS = [
    "Pre-Revision Question",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Explanation",
    "Record ID",
    "High-level domain",
    "Subdomain",
]


def write_gpqa_csv(path, n=3):
    """A small copy of gpqa_diamond.csv: GPQA's header, quoted commas and newlines in fields."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for i in range(n):
            writer.writerow(
                {
                    "Pre-Revision Question": "old",
                    "Question": f"Which energy, in eV, for case {i}?\nGive one.",
                    "Correct Answer": f"{i}.5 eV, roughly",
                    "Incorrect Answer 1": f"{i}.1 eV",
                    "Incorrect Answer 2": f"{i}.2 eV",
                    "Incorrect Answer 3": f"{i}.3 eV",
                    "Explanation": "because",
                    "Record ID": f"rec{i:03d}",
                    "High-level domain": "Physics",
                    "Subdomain": "Quantum Mechanics",
                }
            )
    return path


def test_gpqa_csv_loads_with_its_options_and_record_ids(tmp_path):
    data = write_gpqa_csv(tmp_path / "gpqa_diamond.csv")
    problems = load_benchmark(BenchmarkConfig(name="gpqa_diamond", data=str(data)))
    assert [p.id for p in problems] == ["rec000", "rec001", "rec002"]
    first = problems[0]
    assert is_choice(first) and first.question == "Which energy, in eV, for case 0?\nGive one."
    assert first.metadata["choices"] == ["0.5 eV, roughly", "0.1 eV", "0.2 eV", "0.3 eV"]
    assert first.answer == "0.5 eV, roughly" and first.metadata["Subdomain"] == "Quantum Mechanics"


def test_a_gpqa_file_without_its_columns_names_them(tmp_path):
    bad = tmp_path / "gpqa.csv"
    bad.write_text("Question,Answer\nq,a\n")
    with pytest.raises(BenchmarkError) as error:
        load_benchmark(BenchmarkConfig(name="gpqa_diamond", data=str(bad)))
    assert "missing_field:Correct Answer" in str(error.value)
    assert "GPQA's columns" in str(error.value)


PROBLEM = Problem(
    id="rec7",
    question="Q?",
    answer="right",
    metadata={"choices": ["right", "w1", "w2", "w3"], "correct": 0},
)


@given(st.integers(0, 10**6), st.integers(0, 1000))
def test_every_variant_shows_all_options_and_its_letter_names_the_right_one(seed, index):
    variant = choice_variant(PROBLEM, seed, index)
    order = variant.metadata["order"]
    assert sorted(order) == [0, 1, 2, 3]
    letter = variant.answer
    assert f"\n{letter}) right\n" in variant.question + "\n"
    assert variant.id == f"rec7#{index}" and variant.metadata["problem_id"] == "rec7"
    assert choice_variant(PROBLEM, seed, index) == variant  # the same draw on a rerun


def test_the_right_option_lands_on_every_letter_about_equally():
    letters = Counter(choice_variant(PROBLEM, 0, i).answer for i in range(4000))
    assert set(letters) == {"A", "B", "C", "D"}
    assert all(900 < count < 1100 for count in letters.values()), letters
    seeds = {choice_variant(PROBLEM, s, 0).answer for s in range(40)}
    assert len(seeds) > 1  # the run seed changes the draw

"""IFEval through our path gives Google's reference verdict on every one of its GPT-4 examples.

The fixture (tests/data/ifeval_gpt4_reference.jsonl.gz, README beside it) holds Google's 540
archived GPT-4 responses with the per-instruction strict and loose verdicts that Google's own
`instruction_following_eval.evaluation_lib` gave them (scripts/ifeval_reference_verdicts.py).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import pytest

from rstar2_evaluator.scorers import ifeval
from rstar2_evaluator.scorers._data import ScorerDataError

DATA = Path(__file__).parent / "data" / "ifeval_gpt4_reference.jsonl.gz"


def _reference() -> list[dict]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _problem(row: dict) -> ifeval.IFEvalProblem:
    return ifeval.IFEvalProblem(
        row["key"], row["prompt"], tuple(row["instruction_id_list"]), tuple(row["kwargs"])
    )


def test_every_reference_verdict_is_ours() -> None:
    rows = _reference()
    verdicts = [ifeval.score_ifeval(_problem(r), r["response"]) for r in rows]
    mismatched = [
        r["key"]
        for r, v in zip(rows, verdicts, strict=True)
        if list(v.strict) != r["strict"] or list(v.loose) != r["loose"]
    ]
    assert len(rows) == 540 and mismatched == []
    # Right and wrong responses both occur, in both modes.
    flat_strict = [x for r in rows for x in r["strict"]]
    assert 0 < sum(flat_strict) < len(flat_strict)
    summary = ifeval.summarize_ifeval(verdicts)
    assert summary["prompt_level_strict_acc"] == sum(all(r["strict"]) for r in rows) / len(rows)
    assert summary["inst_level_loose_acc"] == sum(x for r in rows for x in r["loose"]) / sum(
        len(r["loose"]) for r in rows
    )


def test_loose_forgives_what_strict_does_not() -> None:
    problem = ifeval.IFEvalProblem(
        1, "Answer in lowercase.", ("change_case:english_lowercase",), ({},)
    )
    framed = "Sure! Here it is:\nthe quick brown fox jumps over the lazy dog, as it always does."
    verdict = ifeval.score_ifeval(problem, framed)
    assert verdict.strict == (False,) and verdict.loose == (True,)
    assert ifeval.score_ifeval(problem, "").loose == (False,)


def test_scoring_leaves_the_callers_random_state_alone() -> None:
    rows = {r["key"]: r for r in _reference()}
    row = rows[1122]  # a letter the checker rejects, so it draws one
    random.seed(7)
    expected = random.random()
    random.seed(7)
    first = ifeval.score_ifeval(_problem(row), row["response"])
    assert random.random() == expected
    assert ifeval.score_ifeval(_problem(row), row["response"]) == first


def test_punkt_ships_and_hard_links_are_copied(tmp_path: Path) -> None:
    root = ifeval.punkt_root()
    assert (root / "tokenizers" / "punkt_tab" / "english" / "ortho_context.tab").is_file()
    english = Path(ifeval.__file__).parent / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    links = []
    for f in english.iterdir():
        link = tmp_path / f.name
        os.link(f, link)
        links.append(link)
    try:
        copied = ifeval.punkt_root()
        assert copied != Path(ifeval.__file__).parent / "nltk_data"
        assert all(
            p.stat().st_nlink == 1
            for p in (copied / "tokenizers" / "punkt_tab" / "english").iterdir()
        )
    finally:
        for link in links:
            link.unlink()


def test_loader_reads_googles_format_and_names_what_to_download(tmp_path: Path) -> None:
    path = tmp_path / "input_data.jsonl"
    row = _reference()[0]
    fields = ("key", "prompt", "instruction_id_list", "kwargs")
    path.write_text(json.dumps({k: row[k] for k in fields}) + "\n")
    (problem,) = ifeval.load_ifeval(path)
    assert problem == _problem(row)
    assert ifeval.ifeval_messages(problem) == [{"role": "user", "content": row["prompt"]}]
    with pytest.raises(ScorerDataError, match="google/IFEval"):
        ifeval.load_ifeval(tmp_path / "missing.jsonl")
    path.write_text(json.dumps({"key": 1, "prompt": "x"}) + "\n")
    with pytest.raises(ScorerDataError, match="instruction_id_list"):
        ifeval.load_ifeval(path)

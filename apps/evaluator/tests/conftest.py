"""Small copies of the benchmarks in their published formats, written on the spot.

Each is the format a user downloads (field names, file layout, encodings), cut to a few
problems: MathArena's and the other maths sets' parquet, GPQA's CSV, LiveCodeBench's
code_generation_lite JSONL (private tests pickled, as its later releases ship them). Also the
tiny model, built once per session.
"""

from __future__ import annotations

import base64
import csv
import json
import pickle
import zlib
from pathlib import Path

import pytest

GPQA_COLUMNS = [
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


def pack_tests(tests: list[dict]) -> str:
    """LiveCodeBench's packing of private tests: base64(zlib(pickle(JSON text)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_row(qid: str, date: str, content: str, tests: list[dict], *, fn_name=None, starter=""):
    public, private = tests[:1], tests[1:]
    return {
        "question_title": qid,
        "question_content": content,
        "platform": "leetcode" if fn_name else "atcoder",
        "question_id": qid,
        "contest_id": "c1",
        "contest_date": f"{date}T00:00:00",
        "starter_code": starter,
        "difficulty": "easy",
        "public_test_cases": json.dumps(public),
        "private_test_cases": pack_tests(private),
        "metadata": json.dumps({"func_name": fn_name} if fn_name else {}),
    }


STDIN_TESTS = [
    {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
    {"input": "10 -4\n", "output": "6\n", "testtype": "stdin"},
    {"input": "2.5 0.5\n", "output": "3.0\n", "testtype": "stdin"},
]
FUNCTIONAL_TESTS = [
    {"input": "[1, 2, 3]\n2", "output": "[2, 4, 6]", "testtype": "functional"},
    {"input": "[]\n5", "output": "[]", "testtype": "functional"},
]


def write_lcb(folder: Path) -> Path:
    """test.jsonl (release v1) holds an old stdin problem; test6.jsonl a stdin and a
    functional problem of 2025."""
    folder.mkdir(parents=True, exist_ok=True)
    old = lcb_row("old1", "2023-06-01", "Print a+b.", STDIN_TESTS)
    add = lcb_row("add", "2025-03-01", "Read a and b; print a+b.", STDIN_TESTS)
    scale = lcb_row(
        "scale",
        "2025-03-02",
        "Multiply each item by k.",
        FUNCTIONAL_TESTS,
        fn_name="scale",
        starter="class Solution:\n    def scale(self, nums: List[int], k: int) -> List[int]:",
    )
    (folder / "test.jsonl").write_text(json.dumps(old) + "\n")
    for name in ("test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl"):
        (folder / name).write_text("")
    (folder / "test6.jsonl").write_text(json.dumps(add) + "\n" + json.dumps(scale) + "\n")
    return folder


def write_gpqa(path: Path, n: int = 2) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=GPQA_COLUMNS)
        writer.writeheader()
        for i in range(n):
            writer.writerow(
                {
                    "Pre-Revision Question": "old",
                    "Question": f"Which value, case {i}?",
                    "Correct Answer": f"{i}.5",
                    "Incorrect Answer 1": f"{i}.1",
                    "Incorrect Answer 2": f"{i}.2",
                    "Incorrect Answer 3": f"{i}.3",
                    "Explanation": "because",
                    "Record ID": f"rec{i}",
                    "High-level domain": "Physics",
                    "Subdomain": "Optics",
                }
            )
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny Qwen3 model and tokenizer, built once for the session (no download)."""
    from rstar2_rollout.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture
def lcb_dir(tmp_path) -> Path:
    return write_lcb(tmp_path / "code_generation_lite")


@pytest.fixture
def gpqa_csv(tmp_path) -> Path:
    return write_gpqa(tmp_path / "gpqa_diamond.csv")


@pytest.fixture
def published():
    """This module's writers, for a test that builds its own copy."""
    import sys

    return sys.modules[__name__]

"""LiveCodeBench: its published JSONL loads (pickled tests included, with nothing run), and a
program is scored by running every test in a real rstar2-sandbox: right 1, wrong, crashing and
looping 0, with LiveCodeBench's output comparison."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pickle
import zlib
from decimal import Decimal, InvalidOperation

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rstar2_curriculum import BenchmarkError
from rstar2_evaluator.scorers import Response, reply_text
from rstar2_evaluator.scorers._harness import digest
from rstar2_evaluator.scorers.code import CodeChecker, decode_tests
from rstar2_sandbox import LocalSandbox, SandboxConfig


def test_release_picks_the_files_and_a_date_window_the_problems(lcb_dir):
    assert [p.id for p in CodeChecker().load(lcb_dir)] == ["old1", "add", "scale"]
    assert [p.id for p in CodeChecker(release="v6").load(lcb_dir)] == ["add", "scale"]
    window = CodeChecker(start_date="2025-03-02", end_date="2025-05-01")
    assert [p.id for p in window.load(lcb_dir)] == ["scale"]
    scale = CodeChecker().load(lcb_dir)[2]
    assert scale.metadata["tests"] == 2 and scale.metadata["fn_name"] == "scale"
    assert "```python\nclass Solution:" in scale.question  # LiveCodeBench's starter format


def test_a_missing_copy_says_what_to_download(tmp_path):
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(BenchmarkError) as error:
        CodeChecker().load(tmp_path)
    message = str(error.value)
    assert "lacks test2.jsonl" in message and "livecodebench/code_generation_lite" in message
    with pytest.raises(BenchmarkError, match="--data PATH"):
        CodeChecker().load(None)


class Payload:
    """A pickle that runs a command when loaded by a plain `pickle.loads`."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_names_a_function_is_refused_and_nothing_runs(tmp_path, published):
    marker = tmp_path / "ran"
    evil = base64.b64encode(zlib.compress(pickle.dumps(Payload(str(marker))))).decode()
    row = published.lcb_row(
        "evil", "2025-03-01", "x", [{"input": "", "output": "", "testtype": "stdin"}]
    )
    row["private_test_cases"] = evil
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps(row) + "\n")
    with pytest.raises(BenchmarkError) as error:
        CodeChecker().load(data)
    assert "refused: the pickle names" in str(error.value)
    assert not marker.exists()
    assert decode_tests(published.pack_tests([{"input": "1", "output": "2"}]))[0]["output"] == "2"


ADD_RIGHT = "a, b = input().split()\nx = float(a) + float(b)\nprint(int(x) if x == int(x) else x)"
ADD_DECIMAL = "import sys\na, b = map(float, sys.stdin.read().split())\nprint(f'{a + b:.1f}')"
ADD_WRONG = "a, b = map(float, input().split())\nprint(a - b)"
ADD_CRASH = "a, b = input().split()\nprint(undefined_name)"
ADD_LOOP = "while True:\n    pass"
SCALE_RIGHT = (
    "class Solution:\n    def scale(self, nums, k):\n        return tuple(x * k for x in nums)"
)
SCALE_WRONG = "class Solution:\n    def scale(self, nums, k):\n        return nums"


def _reply(program: str) -> Response:
    raw = f"Thinking.</reason>\n<answer>\n```python\n{program}\n```\n</answer><|im_end|>"
    return Response(text=reply_text(raw), raw=raw, finish_reason="answered")


def test_programs_are_scored_by_running_every_test_in_the_sandbox(lcb_dir):
    async def scores():
        async with LocalSandbox(SandboxConfig(workers=1, preload=())) as sandbox:
            checker = CodeChecker(sandbox, release="v6", timeout_s=2.0)
            add, scale = checker.load(lcb_dir)
            got = {}
            for name, problem, program in (
                ("right", add, ADD_RIGHT),
                ("decimal", add, ADD_DECIMAL),
                ("wrong", add, ADD_WRONG),
                ("crash", add, ADD_CRASH),
                ("loop", add, ADD_LOOP),
                ("functional right", scale, SCALE_RIGHT),
                ("functional wrong", scale, SCALE_WRONG),
            ):
                got[name] = await checker.check(problem, _reply(program))
            no_code = await checker.check(add, Response(text="4", raw="4", finish_reason="stop"))
            return got, no_code

    got, no_code = asyncio.run(scores())
    assert got["right"].score == 1.0 and got["right"].details["passed"] == 3  # every test ran
    assert got["decimal"].score == 1.0  # "3.0" against "3": equal as Decimals
    assert got["functional right"].score == 1.0 and got["functional right"].details["passed"] == 2
    assert {k: (v.score, v.details["why"]) for k, v in got.items() if v.score == 0} == {
        "wrong": (0.0, "wrong_answer"),
        "crash": (0.0, "runtime_error"),
        "loop": (0.0, "timeout"),
        "functional wrong": (0.0, "wrong_answer"),
    }
    assert no_code.score == 0.0 and no_code.details["why"] == "no_code"


def _lcb_equal(prediction: str, expected: str) -> bool:
    """LiveCodeBench's stdin comparison, as its testing_util.py states it (the reference)."""
    pred = [line.strip() for line in prediction.strip().split("\n")]
    gold = [line.strip() for line in expected.strip().split("\n")]
    if len(pred) != len(gold):
        return False
    for p, g in zip(pred, gold, strict=True):
        if p == g:
            continue
        try:
            if [Decimal(t) for t in p.split()] != [Decimal(t) for t in g.split()]:
                return False
        except InvalidOperation:
            return False
    return True


TOKENS = st.sampled_from(["1", "1.0", "1.00", "-0", "0", "2.5", "2.50", "1e1", "10", "x", "nan"])
LINES = st.lists(TOKENS, max_size=3).map(" ".join)
OUTPUTS = st.lists(LINES, max_size=3).map("\n".join)


@given(OUTPUTS, OUTPUTS, st.sampled_from(["", " ", "\n", "  \n"]))
def test_the_digest_matches_exactly_when_livecodebench_would(a, b, pad):
    assert (digest(a + pad) == digest(b)) == _lcb_equal(a + pad, b)

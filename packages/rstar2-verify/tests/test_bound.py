"""Every grade returns within 1 s, whatever the input: hostile LaTeX and the slow kinds.

The bound is `VerifyConfig.timeout_s` (0.8 s by default) for the whole grade: an in-process
deadline in extraction, the parser and the exact comparison, and the remainder for the worker.
Measured as the wall time of `grade()` on a started pool; a grade cut by the bound is a
definite `correct=False, reason="timeout"`, never an exception.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BOUND_S = 1.0

_N = 3000
SLOW_KINDS = [
    # a numeric gold against a sign applied to a half-open interval (the slow case)
    ("so the range is \\boxed{-\\left[\\frac{1}{2}, \\infty\\right)}", "3"),
    ("\\boxed{" + "-" * 15000 + "[1,2)}", "3"),
    ("\\boxed{2 \\pm (0, 1]}", "2"),
    # sets and lists whose comparison is quadratic
    ("\\boxed{\\{" + ",".join(map(str, range(_N))) + "\\}}", ",".join(map(str, range(_N, 0, -1)))),
    ("\\boxed{" + ",".join(["x"] * _N) + "}", ",".join(["y"] * _N)),
    # long texts and many boxes
    ("\\boxed{1}" * 150_000, "2"),
    ("x " * 900_000 + "\\boxed{-[1,2)}", "3"),
    # huge numbers and exponents, long sums, deep nesting
    ("\\boxed{\\sqrt{" + "9" * 19_000 + "}}", "3"),
    ("\\boxed{\\sqrt[7]{" + "9" * 19_000 + "}}", "3"),
    ("\\boxed{10^{10^{10}}}", "1"),
    ("\\boxed{9^{9^{9^{9}}} - 9^{9^{9^{9}}}}", "0"),
    ("\\boxed{" + "+".join(f"\\sqrt{{{k}}}" for k in range(2, 1200)) + "}", "5"),
    ("\\boxed{" + "(x+1)^{2}" * 2000 + "}", "x"),
    ("\\boxed{" + "\\frac{1}{" * 60 + "2" + "}" * 60 + "}", "3"),
    ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
]


@pytest.mark.parametrize(("response", "gold"), SLOW_KINDS, ids=range(len(SLOW_KINDS)))
def test_slow_kinds_finish_within_a_second(grader, response, gold):
    start = time.perf_counter()
    got = grader.grade(response, gold)
    took = time.perf_counter() - start
    assert took < BOUND_S, (took, got)
    assert not got.correct, got
    assert got.reason != "crash" and not got.reason.startswith("error"), got


_ATOMS = st.sampled_from(
    ["1", "2", "x", "\\pi", "e", "0.5", "\\frac{1}{3}", "\\sqrt{2}", "\\infty", "2^{4000}",
     "10^{10^{10}}", "9^{9^{9}}", "(10^{6})!", "\\sin 30^\\circ", "[1,2)", "(0,1]", "-[2,5)"]
)  # fmt: skip


def _combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pair = st.tuples(inner, inner)
    return st.one_of(
        pair.map(lambda p: "{" + p[0] + "}^{" + p[1] + "}"),  # towers of powers
        pair.map(lambda p: "\\frac{" + p[0] + "}{" + p[1] + "}"),
        inner.map(lambda a: "\\sqrt{" + a + "}"),
        st.tuples(inner, st.integers(2, 300)).map(lambda p: "+".join([p[0]] * p[1])),  # long sums
        st.tuples(st.sampled_from(["-", "+", "\\pm", "2-", "x \\in -"]), pair).map(
            lambda p: p[0] + "[" + p[1][0] + "," + p[1][1] + ")"  # signs on half-open intervals
        ),
        st.tuples(inner, st.integers(1, 60)).map(lambda p: "(" * p[1] + p[0] + ")" * p[1]),
        st.lists(inner, min_size=2, max_size=40).map(lambda xs: "\\{" + ",".join(xs) + "\\}"),
    )


HOSTILE = st.recursive(_ATOMS, _combine, max_leaves=40)
WRAPS = st.sampled_from(["\\boxed{%s}", "The answer is $%s$.", "<answer>%s</answer>", "%s"])
GOLDS = st.sampled_from(["3", "0.25", "[1,2)", "x+1", "\\frac{\\pi}{2}", "1024", "\\{1, 2\\}"])


@pytest.mark.slow  # about 17 s here: 40 examples, some cut at the bound
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(answer=HOSTILE, wrap=WRAPS, gold=GOLDS)
def test_hostile_latex_grades_within_a_second(grader, answer, wrap, gold):
    start = time.perf_counter()
    got = grader.grade(wrap % answer, gold)
    took = time.perf_counter() - start
    assert took < BOUND_S, (took, got)
    assert not got.reason.startswith("error"), got

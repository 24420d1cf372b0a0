import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_verify import Grade, VerifyConfig, grade
from rstar2_verify.check import check, load_cases
from rstar2_verify.parse import parse

LABELLED = Path(__file__).parent / "data" / "labelled.jsonl"


@pytest.mark.parametrize(
    ("response", "gold", "correct", "method"),
    [
        ("\\boxed{5}", "5", True, "string"),
        ("\\boxed{\\frac{1}{2}}", "0.5", True, "exact"),
        ("\\boxed{500}", "5", False, "exact"),
        ("\\boxed{2^{2025}}", "3^{2025}", False, "exact"),
        ("\\boxed{1.0001}", "1", False, "exact"),
        ("\\boxed{[1,2)}", "[1,2]", False, "exact"),
        ("\\boxed{3.14}", "\\pi", False, "symbolic"),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt2", True, "symbolic"),
        ("\\boxed{x = 2}", "2", True, "exact"),
        ("\\boxed{7 \\text{ or } 8}", "7", False, "exact"),
    ],
)
def test_policy(grader, response, gold, correct, method):
    got = grader.grade(response, gold)
    assert (got.correct, got.method) == (correct, method), got


def test_grade_reports_what_and_where(grader):
    got = grader.grade("<reason>\\boxed{1}</reason><answer>\\boxed{\\dfrac{3}{4}}</answer>", "0.75")
    assert got.correct
    assert got.extracted == "\\dfrac{3}{4}"
    assert got.source == "answer_box"
    assert got.gold_normalized == "0.75"
    assert got.reason == ""
    assert got.elapsed >= 0


def test_answer_text_is_never_executed(grader, tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path('{marker}').write_text('x')"
    got = grader.grade(f"\\boxed{{{code}}}", "0")
    assert not got.correct
    assert not marker.exists()


@pytest.mark.parametrize(
    ("response", "gold", "reason"),
    [
        (None, "5", "empty_response"),
        ("", "5", "empty_response"),
        ("\\boxed{5}", "", "empty_gold"),
        ("\\boxed{5}", None, "empty_gold"),
        (b"\\boxed{5}", "6", "mismatch"),
        ("\x00\xff\ufffe\x07 junk", "5", "unparsed_answer"),
        ("\\boxed{\\frac{1}{2", "1", "unparsed_answer"),
        (["not", "text"], "1", "empty_response"),
        ("x" * 5000, "5", "no_answer"),
    ],
)
def test_bad_input_is_a_grade_with_a_reason(grader, response, gold, reason):
    got = grader.grade(response, gold)
    assert isinstance(got, Grade)
    assert not got.correct
    assert got.reason == reason


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{10^{10^{10}}}", "10^{10^{10}}+1"),
        ("\\boxed{10^{10^{10}}}", "5"),
        ("\\boxed{" + "9" * 100_000 + "}", "9"),
        ("\\boxed{" + "7" * 19_000 + "}", "7" * 18_999 + "8"),  # exact, past int()'s limit
        ("\\boxed{" + "1." * 9000 + "}", "1"),
        ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
        ("{" * 5000 + "1", "1"),
        ("\\boxed{(" * 3000 + "}", "2"),
        ("\\boxed{x^{10^{8}} - (x+1)^{10^{8}}}", "0"),
        ("\\boxed{(10^{6})!}", "1"),
        ("\\boxed{" + "+".join(["2^{4000}"] * 300) + "}", "1"),
    ],
)
def test_pathological_inputs_finish_within_two_seconds(grader, response, gold):
    start = time.perf_counter()
    got = grader.grade(response, gold)
    assert time.perf_counter() - start < 2.0, got
    assert not got.correct


def test_a_timed_out_worker_is_killed_and_replaced(grader):
    before = grader.pool.replaced
    slow = "+".join(f"\\sqrt{{{k}}}" for k in range(1000, 1300))  # ~0.5 s of sympy when cold
    got = grader.grade(f"\\boxed{{{slow}}}", "\\sqrt{2}", timeout_s=0.02)
    assert (got.correct, got.reason) == (False, "timeout"), got  # in-process or in the worker
    outcome = grader.pool.run(parse(slow), parse("\\sqrt{2}"), 0.02)
    assert outcome.status == "timeout"
    assert grader.pool.replaced >= before + 1
    # The replacement imports sympy first (seconds on a loaded machine, and a grade's bound
    # counts the wait for a worker): once it is ready, the pool answers again.
    assert grader.pool.wait_ready(120)
    assert grader.grade("\\boxed{x^2+2x+1}", "(x+1)^2").correct


def test_workers_run_under_a_memory_cap(grader):
    grader.grade("\\boxed{\\sqrt{2}}", "\\sqrt{2}+0")  # make sure a worker exists
    pids = grader.pool.pids()
    assert pids
    limits = Path(f"/proc/{pids[0]}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max address space"))
    assert str(grader.config.memory_mb * 1024 * 1024) in line


def test_grade_many_from_threads_and_asyncio_agree(grader):
    pairs = [("\\boxed{\\sqrt{12}}", "2\\sqrt3"), ("\\boxed{4}", "5"), ("x^2-1", "(x-1)(x+1)")] * 4
    expected = [grader.grade(r, g).correct for r, g in pairs]
    assert expected[:3] == [True, False, True]
    assert [g.correct for g in grader.grade_many(pairs)] == expected
    with ThreadPoolExecutor(4) as threads:
        assert [g.correct for g in threads.map(lambda p: grader.grade(*p), pairs)] == expected
    assert [g.correct for g in asyncio.run(grader.agrade_many(pairs))] == expected


def test_module_level_grade_works_from_a_non_main_thread():
    results: list[Grade] = []
    config = VerifyConfig(workers=1)
    thread = threading.Thread(
        target=lambda: results.append(grade("\\boxed{\\pi/2}", "\\frac{\\pi}{2}", config))
    )
    thread.start()
    thread.join(timeout=120)
    assert results and results[0].correct


def test_labelled_sample(grader):
    """Every fifth labelled case (the full set runs in the slow test below)."""
    cases = load_cases(LABELLED)[::5]
    report = check(cases, grader)
    assert report.overall.accuracy >= 0.97, report.mistakes
    assert report.overall.false_positives == 0, report.mistakes


@pytest.mark.slow
def test_labelled_set_accuracy_and_no_false_positives_on_different_numbers(grader):
    report = check(load_cases(LABELLED), grader)
    assert report.overall.total >= 500
    assert report.overall.accuracy >= 0.97, report.mistakes
    assert report.categories["different_number"].false_positives == 0


def _forms(value: Fraction) -> list[str]:
    """Ways to write an exact rational: a LaTeX fraction, a/b, and a decimal when it terminates."""
    p, q = value.numerator, value.denominator
    forms = [f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}"]
    d = q
    for k in (2, 5):
        while d % k == 0:
            d //= k
    if d == 1:
        places = 0
        while (value * 10**places).denominator != 1:
            places += 1
        forms.append(f"{float(value):.{places}f}" if places < 15 else forms[0])
    return forms


@settings(max_examples=300, deadline=None)
@given(
    st.fractions(min_value=-(10**9), max_value=10**9, max_denominator=10**4),
    st.fractions(min_value=-(10**9), max_value=10**9, max_denominator=10**4),
    st.data(),
)
def test_different_numbers_are_never_equal_and_equal_ones_are(grader, a, b, data):
    write_a = data.draw(st.sampled_from(_forms(a)))
    write_b = data.draw(st.sampled_from(_forms(b)))
    got = grader.grade(f"\\boxed{{{write_a}}}", write_b)
    assert got.correct == (a == b), (write_a, write_b, got)
    assert grader.grade(f"\\boxed{{{write_a}}}", data.draw(st.sampled_from(_forms(a)))).correct

"""The bench's workload: reproducible, shaped like the issue's mix, and its answers are right."""

from __future__ import annotations

import contextlib
import io
import random
from collections import Counter

import pytest

from rstar2_sandbox import ExecutionResult, ExecutionStatus
from rstar2_sandbox.workload import _cpu, make_workload


def test_same_seed_same_jobs_and_the_mix_is_as_specified():
    jobs = make_workload(800, "standard", seed=3)
    assert jobs[:100] == make_workload(100, "standard", seed=3)
    assert jobs[:100] != make_workload(100, "standard", seed=4)
    share = {k: v / len(jobs) for k, v in Counter(j.kind for j in jobs).items()}
    mix = {"short": 0.65, "raise": 0.15, "loop": 0.10, "heavy": 0.05, "cpu": 0.05}
    for kind, expected in mix.items():
        assert abs(share[kind] - expected) < 0.04, (kind, share[kind])
    assert {j.kind for j in make_workload(200, "no_loops", seed=3)} == {"short", "raise", "heavy"}


@pytest.mark.slow
def test_the_cpu_calls_answers_match_plain_python():
    """One call of each kind that takes real CPU and whose answer the bench computes another
    way (sympy solve twice, integrate, a sieve), run with exec here: the cheap expectations must
    be what the code prints. (The numpy call prints its own check; here, outside the sandbox's
    one BLAS thread, it would cost seconds.)"""
    rng, firsts = random.Random(5), {}
    while len(firsts) < 5:
        code, stdout = _cpu(rng)
        firsts.setdefault(code.split("\n")[-1][:24], (code, stdout))
    for code, stdout in firsts.values():
        if "numpy" in code:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, {"__name__": "__main__"})
        assert out.getvalue() == stdout, code


def test_expected_answers_match_plain_python():
    """Run the short and raising jobs with exec here: the expectations must agree."""
    for job in make_workload(80, "no_loops", seed=11):
        if job.kind == "heavy":
            continue
        out = io.StringIO()
        namespace: dict[str, object] = {"input": lambda stdin=job.request.stdin: stdin.strip()}
        *body, last = job.request.code.splitlines()
        value, error = None, ""
        try:
            with contextlib.redirect_stdout(out):
                exec("\n".join(body), namespace)
                try:
                    value = eval(last, namespace)
                except SyntaxError:
                    exec(last, namespace)
        except Exception as exc:
            error = type(exc).__name__
        status = ExecutionStatus.ERROR if error else ExecutionStatus.OK
        shown = repr(value) if value is not None and not out.getvalue() else ""
        result = ExecutionResult(
            status=status, stdout=out.getvalue(), result_repr=shown, traceback=error
        )
        assert job.check(result), job.request.code

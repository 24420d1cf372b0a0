"""The limit and demotion rules on hand-made accounts (pure functions of what /proc says)."""

from __future__ import annotations

import pytest

from rstar2_sandbox._limit import RECHECK_RUNNABLE, demotion, judge
from rstar2_sandbox._pidfd import Usage


def _seen(cpu: float, wait: float, runnable: bool, threads: int = 1, nice: int = 0) -> Usage:
    return Usage(cpu_s=cpu, threads=threads, wait_s=wait, runnable=runnable, nice=nice)


@pytest.mark.parametrize(
    ("wall", "seen", "kind", "recheck"),
    [
        (2.0, _seen(2.0, 0.0, True), "timeout", 0.0),  # a loop alone: its CPU time
        (9.0, _seen(2.0, 7.0, True), "timeout", 0.0),  # a loop on a busy host: the same CPU
        (2.0, _seen(0.0, 0.0, False), "timeout", 0.0),  # asleep for its whole limit
        (9.0, _seen(0.5, 7.0, True), "", RECHECK_RUNNABLE),  # 0.5 s of CPU, 7 s in the queue
        (9.0, _seen(0.5, 7.0, False), "timeout", 0.0),  # ...but asleep: ran 0.5 s, slept 1.5
        (4.0, _seen(0.5, 3.0, True), "", 1.0),  # 1 s of its own so far: 1 s left at most
        (1.0, _seen(1.5, 0.0, True, threads=2), "", 0.25),  # two threads: 0.5 s of CPU left
        (20.0, _seen(0.3, 19.5, True), "starved", 0.0),  # 10 x its limit, never its own time
        (20.0, _seen(0.3, 19.5, True, nice=19), "timeout", 0.0),  # ...having lowered itself
        (20.0, _seen(0.3, 19.5, True, nice=10), "starved", 0.0),  # the worker's own renice
    ],
)
def test_the_verdict_is_on_the_programs_own_time(wall, seen, kind, recheck):
    verdict = judge(2.0, wall, seen, None, ceiling_factor=10.0, nice=10)
    assert verdict.kind == kind
    assert verdict.recheck_s == pytest.approx(recheck)  # decided: no next look
    if kind == "timeout":
        assert verdict.message.startswith("time limit of 2 s reached")
        assert ("lowered its own priority" in verdict.message) == (seen.nice == 19)
    if kind == "starved":
        assert verdict.message.startswith("sandbox: the host was too busy")


def test_a_session_cell_counts_from_its_own_start():
    before = _seen(5.0, 3.0, False)  # what earlier cells used
    assert judge(1.0, 0.5, _seen(5.4, 3.0, True), before, 30.0, 0).kind == ""
    assert judge(1.0, 1.2, _seen(6.0, 3.1, True), before, 30.0, 0).kind == "timeout"


def test_demotion_follows_the_cpu_a_call_has_used():
    assert demotion(0.05, 0.5, 0, 0.1, 0.5) == (0, 0.1)  # short so far: look again in 0.1 s
    assert demotion(0.06, 0.1, 0, 0.1, 0.5) == (10, pytest.approx(0.44))  # half a core
    assert demotion(0.2, 1.0, 0, 0.1, 0.5) == (10, pytest.approx(0.3))
    assert demotion(0.3, 2.0, 10, 0.1, 0.5) == (10, pytest.approx(0.2))
    assert demotion(0.5, 3.0, 10, 0.1, 0.5) == (19, 0.0)  # the last step: no more looks

"""How a finished child becomes a status: precedence, caps and markers (pure function)."""

from __future__ import annotations

import signal

import pytest

from rstar2_sandbox._outcome import REPORT_CAP, Outcome, classify, parse_report


def _outcome(report=None, status=0, killed="", out=b"", err=b"", cap=10, sizes=None, cpu=(0, 2)):
    out_size, err_size = sizes or (len(out), len(err))
    return Outcome(report, status, killed, cap, out, err, out_size, err_size, cpu[0], cpu[1])


def _exited(code: int) -> int:
    return code << 8


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (_outcome({"exit_code": 0}), "ok"),
        (_outcome({"exit_code": 0}, killed="timeout"), "timeout"),
        (_outcome(None, status=signal.SIGXCPU, cpu=(2.01, 2)), "timeout"),
        (_outcome(None, status=signal.SIGKILL, cpu=(3.0, 2)), "timeout"),
        (_outcome(None, status=signal.SIGKILL, cpu=(0.0, 2)), "error"),  # it killed itself
        (_outcome(None, status=signal.SIGXCPU, cpu=(0.1, 2)), "error"),
        (_outcome({"exc_type": "MemoryError", "exit_code": 1}, _exited(1)), "memory_exceeded"),
        (_outcome({"exc_type": "ValueError", "exit_code": 1}, _exited(1)), "error"),
        (_outcome({"exit_code": 3}, _exited(3)), "error"),
        (_outcome(None, status=signal.SIGSEGV), "error"),
        (_outcome(None, _exited(0), out=b"x" * 10, sizes=(100, 0)), "output_truncated"),
        (_outcome({"exc_type": "KeyError"}, _exited(1), out=b"x" * 10, sizes=(100, 0)), "error"),
        (_outcome(None, status=signal.SIGKILL, killed="cancelled"), "rejected"),
        (_outcome(None, status=signal.SIGKILL, killed="starved"), "sandbox_error"),
    ],
)
def test_status_precedence(outcome, status):
    assert classify(outcome)["status"] == status


def test_a_kill_says_which_limit_and_a_starved_call_is_the_sandboxs_fault():
    spent = Outcome(None, signal.SIGKILL, "timeout", 10, b"", b"", 0, 0,
                    kill_message="time limit of 1 s reached (CPU time)")  # fmt: skip
    assert classify(spent)["message"].startswith("time limit of 1 s reached (CPU time)")
    starved = Outcome(None, signal.SIGKILL, "starved", 10, b"", b"", 0, 0,
                      kill_message="sandbox: the host was too busy: ...")  # fmt: skip
    assert classify(starved)["status"] == "sandbox_error"
    assert classify(starved)["message"].startswith("sandbox: the host was too busy")


def test_exit_code_of_a_signal_is_negative():
    result = classify(_outcome(None, status=signal.SIGSEGV))
    assert result["exit_code"] == -signal.SIGSEGV and "SIGSEGV" in result["message"]


def test_truncation_marker_and_repr_only_without_output():
    cut = classify(_outcome({"repr": "5"}, out=b"0123456789", sizes=(1000, 0)))
    assert cut["stdout"].startswith("0123456789\n[output truncated: 1000 bytes written")
    assert cut["result_repr"] == ""
    quiet = classify(_outcome({"repr": "5"}))
    assert quiet["result_repr"] == "5"


def test_a_cut_multibyte_character_does_not_break_decoding():
    text = "é" * 20
    result = classify(_outcome({}, out=text.encode()[:9], sizes=(40, 0), cap=9))
    assert result["stdout"].startswith("éééé\n[output truncated")


def test_a_self_inflicted_kill_names_the_signal():
    result = classify(_outcome(None, status=signal.SIGKILL, cpu=(0.0, 2)))
    assert (result["status"], result["message"]) == ("error", "killed by signal SIGKILL")


GOOD = b'{"exc_type": "", "traceback": "", "repr": "1", "exit_code": 0}'


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected fields"),
        (b'{"exc_type": "", "traceback": "", "repr": "1"}', "expected fields"),
        (GOOD.replace(b'"repr": "1"', b'"repr": 1'), "repr is not str"),
        (GOOD.replace(b'"exit_code": 0', b'"exit_code": true'), "exit_code is not int"),
        (GOOD.replace(b'"exit_code": 0', b'"exit_code": 99999999999'), "out of range"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b" " * (REPORT_CAP + 1), "report over"),
    ],
    ids=["garbage", "list", "missing", "type", "bool", "range", "deep", "huge"],
)
def test_hostile_reports_are_refused_with_a_reason(data, problem):
    report, why = parse_report(data)
    assert report is None and problem in why
    outcome = _outcome(None, status=0)
    outcome.report_problem = why
    result = classify(outcome)
    assert result["status"] == "error" and "report was refused" in result["message"]


def test_a_good_report_is_taken():
    assert parse_report(GOOD) == (
        {"exc_type": "", "traceback": "", "repr": "1", "exit_code": 0},
        "",
    )

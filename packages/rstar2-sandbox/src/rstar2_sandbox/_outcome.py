"""From what a child left behind to a status: the one place that decides how a call ended.

Contract. `parse_report` reads the child's own account as hostile input: anything but a JSON
object with exactly the expected fields and types, within the size cap, is refused with a reason
(the call is then an `error` with a sandbox-side message, never the worker's death). `classify`
turns an `Outcome` (the child's own report if it got to write one, its wait status, whether the
worker killed it and why, and the captured bytes with their full sizes) into the fields of an
`ExecutionResult` as a plain dict. Precedence: a kill by the worker wins (`timeout`: the program
used its own time; starved: the host kept it from running until the wall ceiling, a
`sandbox_error`; cancelled or shut down: `rejected`), then a death by the CPU-seconds limit (a
timeout too, but only when the call really used its CPU seconds: a signal the call sent itself
is an `error` naming it), then memory (MemoryError), then an error (an exception, a non-zero
exit, a signal), then a truncated output, then ok. Captured bytes are decoded as UTF-8 with
replacement and cut at the cap with a visible marker.
Not covered: anything about running or confining code.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import Any

REPORT_CAP = 1 << 20
_ONCE_FIELDS = {"exc_type": str, "traceback": str, "repr": str, "exit_code": int}
_OPTIONAL = {"files", "profile"}  # fetched files (name -> base64); phase stamps (bench only)
_SESSION_FIELDS = _ONCE_FIELDS | {
    "stdout": str,
    "stderr": str,
    "stdout_truncated": bool,
    "stderr_truncated": bool,
}


def parse_report(data: bytes, session: bool = False) -> tuple[dict[str, Any] | None, str]:
    """The child's report and "", or None and why it was refused."""
    if not data:
        return None, ""
    if len(data) > REPORT_CAP:
        return None, f"report over {REPORT_CAP} bytes"
    try:
        report = json.loads(data)
    except (ValueError, RecursionError) as exc:
        return None, f"report is not JSON ({type(exc).__name__})"
    fields = _SESSION_FIELDS if session else _ONCE_FIELDS
    if not isinstance(report, dict) or set(report) - _OPTIONAL != set(fields):
        return None, "report does not have the expected fields"
    files = report.get("files", {})
    if session and "files" in report:
        return None, "a session cell's report has no files"
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        return None, "report field files is not a dict of str to str"
    for name, kind in fields.items():
        value = report[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return None, f"report field {name} is not {kind.__name__}"
    if not -(1 << 31) <= report["exit_code"] < 1 << 31:
        return None, "report exit_code out of range"
    return report, ""


@dataclass
class Outcome:
    """Everything known about a finished call."""

    report: dict[str, Any] | None  # the child's own account, absent if it died first
    wait_status: int | None  # None for session cells (the session process lives on)
    killed: str  # "", "timeout", "starved", "cancelled", "shutdown"
    cap: int
    stdout: bytes
    stderr: bytes
    stdout_size: int
    stderr_size: int
    cpu_s: float = 0.0
    cpu_limit_s: float | None = None  # RLIMIT_CPU of the call, if any
    report_problem: str = ""  # why the child's report was refused
    kill_message: str = ""  # the worker's account of a kill (which limit, how much time)

    @classmethod
    def from_session(cls, report: dict[str, Any], cap: int) -> Outcome:
        """A session cell's report, which carries its own captured text."""
        out, err = report["stdout"].encode(), report["stderr"].encode()
        return cls(
            report=report,
            wait_status=None,
            killed="",
            cap=cap,
            stdout=out,
            stderr=err,
            stdout_size=len(out) + (1 if report["stdout_truncated"] else 0),
            stderr_size=len(err) + (1 if report["stderr_truncated"] else 0),
        )


def _capped(data: bytes, size: int, cap: int) -> tuple[str, bool]:
    if size <= cap:
        return data.decode("utf-8", "replace"), False
    text = data[:cap].decode("utf-8", "ignore")
    return text + f"\n[output truncated: {size} bytes written, first {cap} shown]\n", True


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def classify(o: Outcome) -> dict[str, Any]:
    """The result fields (status, stdout, stderr, traceback, result_repr, exit_code, message,
    and `files` when the child fetched any)."""
    report = o.report or {}
    stdout, out_cut = _capped(o.stdout, o.stdout_size, o.cap)
    stderr, err_cut = _capped(o.stderr, o.stderr_size, o.cap)
    exit_code = report.get("exit_code", 0)
    signum = 0
    if o.wait_status is not None:
        if os.WIFSIGNALED(o.wait_status):
            signum = os.WTERMSIG(o.wait_status)
            exit_code = -signum
        else:
            exit_code = os.WEXITSTATUS(o.wait_status)
    traceback_text = report.get("traceback", "")
    exc_type = report.get("exc_type", "")
    message = ""
    if o.killed == "timeout":
        status = "timeout"
        message = f"{o.kill_message or 'time limit reached'}; the process group was killed"
    elif o.killed == "starved":
        status, message = "sandbox_error", o.kill_message or "sandbox: starved of CPU"
    elif o.killed:
        status, message = "rejected", f"call {o.killed}; the process group was killed"
    elif (
        signum in (signal.SIGXCPU, signal.SIGKILL)
        and not report
        and o.cpu_limit_s is not None
        and o.cpu_s >= 0.9 * o.cpu_limit_s  # rusage may trail the kernel's own accounting
    ):
        status, message = "timeout", f"CPU-seconds limit reached (signal {signum})"
    elif o.report_problem and not signum:
        status = "error"
        message = f"sandbox: the call's report was refused ({o.report_problem})"
    elif exc_type == "MemoryError":
        status, message = "memory_exceeded", "address-space limit reached (MemoryError)"
    elif exc_type or exit_code != 0:
        status = "error"
        if signum:
            message = f"killed by signal {_signal_name(signum)}"
        elif exc_type:
            message = exc_type
        else:
            message = f"exited with code {exit_code}"
    elif out_cut or err_cut:
        status, message = "output_truncated", f"output over the {o.cap}-byte cap"
    else:
        status = "ok"
    result_repr = report.get("repr", "") if not o.stdout_size else ""
    files = {"files": report["files"]} if report.get("files") else {}
    return files | {
        "status": status,
        "stdout": stdout,
        "stderr": stderr,
        "traceback": traceback_text,
        "result_repr": result_repr,
        "exit_code": exit_code,
        "message": message,
    }

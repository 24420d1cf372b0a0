"""What runs inside a forked, confined child: the user's code, as IPython would show it.

Contract. `run_cell` compiles the source as the cell `<cell>`, runs every statement and, when the
last statement is an expression, evaluates it and returns its repr (the caller shows it only if
nothing was printed, as a notebook does). It reports the outcome as a plain dict: the exception's
type name, a traceback trimmed to the user's own frames (library frames the user called into are
kept; the harness's are not), the repr, and an exit code (SystemExit is an exit, not an error).

`run_once` is the body of a one-shot child: the code arrives in a memfd, standard streams are
already the worker's pipes. It ends as `python file.py` ends: non-daemon threads are joined, atexit
handlers run, the program's globals are released (finalizers run) and the buffers are flushed;
then it writes the outcome as JSON to the result descriptor and leaves with os._exit (the
interpreter's own teardown of the preloaded maths stack would cost more than the call). The JSON
encoder is bound at import, so a program that replaces `json.dumps` cannot break the report; the
worker still treats the report as hostile (`_outcome.parse_report`). `serve_session` is the body
of a session child: cells arrive as frames, output is captured in memory with a cap, globals
persist until the worker kills it. Nothing here confines: `_confine` did that.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import io
import json
import linecache
import os
import struct
import sys
import threading
import traceback
from types import TracebackType
from typing import Any

CELL = "<cell>"
_REPR_CAP = 1 << 16
_TRACEBACK_CAP = 1 << 16
_ENCODE = json.JSONEncoder(ensure_ascii=True).encode  # bound before any user code runs
_PACK = struct.Struct("!I").pack
_WRITE = os.write


def _capped_text(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    half = cap // 2
    return f"{text[:half]}\n[... {len(text) - cap} characters omitted ...]\n{text[-half:]}"


def _trimmed_traceback(exc: BaseException) -> str:
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    if tb is None and not isinstance(exc, SyntaxError):  # raised before any user frame ran
        lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _compile(code: str) -> tuple[Any, Any]:
    tree = ast.parse(code, CELL, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    body = compile(tree, CELL, "exec")
    return body, (compile(last, CELL, "eval") if last is not None else None)


def run_cell(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run one cell in `namespace`; never raises for the cell's own failures."""
    linecache.cache[CELL] = (len(code), None, code.splitlines(keepends=True), CELL)
    outcome: dict[str, Any] = {"exc_type": "", "traceback": "", "repr": "", "exit_code": 0}
    try:
        body, last = _compile(code)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                outcome["repr"] = repr(value)[:_REPR_CAP]
    except SystemExit as exc:
        code_ = exc.code
        if code_ is None or isinstance(code_, int):
            outcome["exit_code"] = code_ or 0
        else:
            print(code_, file=sys.stderr)
            outcome["exit_code"] = 1
    except BaseException as exc:  # the user's code may raise anything, KeyboardInterrupt included
        outcome["exc_type"] = "MemoryError" if isinstance(exc, MemoryError) else type(exc).__name__
        try:
            outcome["traceback"] = _capped_text(_trimmed_traceback(exc), _TRACEBACK_CAP)
        except MemoryError:
            outcome["traceback"] = "MemoryError\n"
        outcome["exit_code"] = 1
    return outcome


def _fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": __builtins__}


def _reset_process() -> None:
    os.environ.clear()
    os.environ.update({"HOME": os.getcwd(), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    sys.argv = [""]


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def _finish_like_python(namespace: dict[str, Any]) -> None:
    """What the interpreter does at the end of `python file.py`, short of its own teardown."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        namespace.clear()  # the program's objects go: their finalizers run
    with contextlib.suppress(BaseException):
        import gc

        gc.collect()


def run_once(code_fd: int, result_fd: int) -> None:
    """Body of a one-shot child: read the code from `code_fd`, run it, report, exit."""
    code = _read_all(code_fd).decode("utf-8", "surrogatepass")
    os.close(code_fd)
    _reset_process()
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    namespace = _fresh_namespace()
    outcome = run_cell(code, namespace)
    _finish_like_python(namespace)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        # A broken pipe or a full disk must not hide the outcome.
        with contextlib.suppress(BaseException):
            stream.flush()  # type: ignore[union-attr]
    with contextlib.suppress(BaseException):
        data = _ENCODE(outcome).encode()
        view = memoryview(data)
        while view:
            view = view[_WRITE(result_fd, view) :]
    os._exit(outcome["exit_code"] & 0xFF if isinstance(outcome["exit_code"], int) else 1)


class _CappedText(io.TextIOBase):
    """A text sink that keeps the first `cap` bytes and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.size, self.parts = cap, 0, []

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self.size < self.cap:
            self.parts.append(s[: self.cap - self.size])
        self.size += len(s)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte went out (pipes take at most their buffer at a time)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int) -> bytes | None:
    """One length-prefixed frame from a blocking descriptor; None at EOF."""
    header = b""
    while len(header) < 4:
        chunk = os.read(fd, 4 - len(header))
        if not chunk:
            return None
        header += chunk
    (size,) = struct.unpack("!I", header)
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(1 << 20, size - len(data)))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def serve_session(in_fd: int, out_fd: int) -> None:
    """Body of a session child: run cells from `in_fd` in one namespace until EOF."""
    _reset_process()
    namespace = _fresh_namespace()
    while True:
        frame = read_frame(in_fd)
        if frame is None:
            os._exit(0)
        cell = json.loads(frame)
        out, err = _CappedText(cell["max_output"]), _CappedText(cell["max_output"])
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(cell["stdin"]), out, err
        outcome = run_cell(cell["code"], namespace)
        outcome.update(
            stdout=out.text(),
            stderr=err.text(),
            stdout_truncated=out.size > out.cap,
            stderr_truncated=err.size > err.cap,
        )
        data = _ENCODE(outcome).encode()
        write_all(out_fd, _PACK(len(data)) + data)

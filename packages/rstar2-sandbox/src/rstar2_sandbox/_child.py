"""What runs inside a forked, confined child: the user's code, as IPython would show it.

Contract. `run_cell` compiles the source as the cell `<cell>`, runs every statement and, when the
last statement is an expression, evaluates it and returns its repr (the caller shows it only if
nothing was printed, as a notebook does). It reports the outcome as a plain dict: the exception's
type name, a traceback trimmed to the user's own frames (library frames the user called into are
kept; the harness's are not), the repr, and an exit code (SystemExit is an exit, not an error).

`run_once` is the body of a one-shot child: the code arrives in a memfd, standard streams are
already the worker's pipes. The program runs as the module `__main__` (in `sys.modules`, as under
`python file.py`). It ends as `python file.py` ends: non-daemon threads are joined, atexit
handlers run, then `__main__` goes as the interpreter's shutdown lets it go: removed from
`sys.modules`, its reference cycles collected with their finalizers seeing the globals intact
(PEP 442), and only if something still holds it, its globals set to None (single-underscore
names first, as `_PyModule_ClearDict`); the buffers are flushed; then it writes the outcome as
JSON to the result descriptor and leaves with os._exit (the interpreter's own teardown of the
preloaded maths stack would cost more than the call). A finalizer that loops forever therefore
holds the call until its timeout, as under `python`.

Files (SandboxFusion's `files` / `fetch_files`): when the memfd starts with a NUL byte it holds a
JSON envelope `{"code", "files": {name: base64}, "fetch": [name]}`; the files are written under
the call's working directory (its private `/tmp`) before the code runs, with the call's own
rights, and the fetched ones are read back after the program ended, base64, into the report's
`files` (at most `FETCH_CAP` bytes of base64 in all; a missing or unreadable file, or one past
the cap, is left out). The JSON
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
import resource
import struct
import sys
import threading
import time
import traceback
import types
import weakref
from base64 import b64decode, b64encode
from types import TracebackType
from typing import Any

CELL = "<cell>"
_REPR_CAP = 1 << 16
_TRACEBACK_CAP = 1 << 16
_ENCODE = json.JSONEncoder(ensure_ascii=True).encode  # bound before any user code runs
_PACK = struct.Struct("!I").pack
_WRITE = os.write
_OPEN = os.open
_B64 = b64encode
FETCH_CAP = 768 << 10  # base64 bytes of fetched files in one report (the report's cap is 1 MiB)


def stamper(stamps: list[Any] | None):
    """Bench only: a function appending (phase, perf_counter_ns, CPU ns, minor faults) to
    `stamps`, or doing nothing when it is None (bound here, before any user code runs)."""
    if stamps is None:
        return lambda phase: None
    clock, cpu, usage = time.perf_counter_ns, time.process_time_ns, resource.getrusage
    return lambda phase: stamps.append((phase, clock(), cpu(), usage(0).ru_minflt))


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


def _read_all(fd: int, limit: int = 1 << 62) -> bytes:
    parts, size = [], 0
    while size <= limit and (chunk := os.read(fd, 1 << 20)):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def _clear_like_cpython(namespace: dict[str, Any]) -> None:
    """`_PyModule_ClearDict`: single-underscore names to None first, then all but builtins."""
    for key in list(namespace):
        if key.startswith("_") and not key.startswith("__") and namespace.get(key) is not None:
            namespace[key] = None
    for key in list(namespace):
        if key != "__builtins__" and namespace.get(key) is not None:
            namespace[key] = None


def _finish_like_python(main: weakref.ref[types.ModuleType]) -> None:
    """What the interpreter does at the end of `python file.py`, short of its own teardown."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    import gc

    with contextlib.suppress(BaseException):
        if sys.modules.get("__main__") is main():
            del sys.modules["__main__"]
    with contextlib.suppress(BaseException):
        gc.collect()  # __main__'s cycles: finalizers run with its globals still in place
    with contextlib.suppress(BaseException):
        module = main()
        if module is not None:  # held from elsewhere: cleared as the interpreter clears it
            namespace = module.__dict__
            del module
            _clear_like_cpython(namespace)
            del namespace
            gc.collect()


def _run_main(code: str, files: dict[str, bytes]) -> tuple[dict[str, Any], weakref.ref]:
    """Run `code` as a fresh `__main__`; only a weak reference to the module is kept."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    try:
        _write_files(files)
    except OSError as exc:
        why = f"sandbox: cannot write file {exc.filename!r}: {exc.strerror}\n"
        return {"exc_type": "OSError", "traceback": why, "repr": "", "exit_code": 1}, weakref.ref(
            module
        )
    return run_cell(code, module.__dict__), weakref.ref(module)


def _write_files(files: dict[str, bytes]) -> None:
    for name, content in files.items():
        folder = os.path.dirname(name)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(name, "wb") as handle:
            handle.write(content)


def _unpack(data: bytes) -> tuple[str, dict[str, bytes], list[str]]:
    """The code, files to write and names to fetch (see the module's contract)."""
    if data.startswith(b"\0"):
        with contextlib.suppress(Exception):
            envelope = json.loads(data[1:])
            files = {str(k): b64decode(v) for k, v in envelope["files"].items()}
            return str(envelope["code"]), files, [str(n) for n in envelope["fetch"]]
    return data.decode("utf-8", "surrogatepass"), {}, []


def _fetch(home: str, names: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    room = FETCH_CAP
    for name in names:
        with contextlib.suppress(Exception):
            fd = _OPEN(os.path.join(home, name), os.O_RDONLY)
            try:
                data = _read_all(fd, room)
            finally:
                os.close(fd)
            text = _B64(data).decode()
            if len(text) <= room:
                found[name] = text
                room -= len(text)
    return found


def run_once(code_fd: int, result_fd: int, stamps: list[Any] | None = None) -> None:
    """Body of a one-shot child: read the code from `code_fd`, run it, report, exit.

    `stamps` (bench only): the phases so far; this adds its own and sends them in the report.
    """
    stamp = stamper(stamps)
    code, files, fetch = _unpack(_read_all(code_fd))
    os.close(code_fd)
    home = os.getcwd()
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
    stamp("read_code")
    outcome, main = _run_main(code, files)
    stamp("ran")
    _finish_like_python(main)
    if fetch:
        outcome["files"] = _fetch(home, fetch)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        # A broken pipe or a full disk must not hide the outcome.
        with contextlib.suppress(BaseException):
            stream.flush()  # type: ignore[union-attr]
    stamp("finished")
    if stamps is not None:
        outcome["profile"] = stamps
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

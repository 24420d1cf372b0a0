"""The test harness LiveCodeBench tests run in: this file's text is sent to rstar2-sandbox.

One sandbox call runs one test. The evaluator sends this module's source with the program and
the test's kind appended (`harness_code`); inside the sandbox it runs as `__main__`:

- `stdin` tests: the call's standard input is the test input. The program runs as a fresh
  `__main__` namespace after LiveCodeBench's import preamble (`PREAMBLE`, executed before the
  capture, as LiveCodeBench does), with `sys.stdout` captured; `SystemExit` ends it normally.
  The harness prints one line: the verdict and `digest(output)`, so the program's output,
  however long, never leaves the sandbox; the evaluator compares it with `digest(expected)`.
- `functional` tests (LeetCode's `class Solution`): the call's standard input is JSON with the
  function's name, the arguments (one JSON value per line) and the expected value; the harness
  calls `Solution().<name>(*args)` (or the module-level function), turns a tuple into a list and
  compares with `==`, as LiveCodeBench does, and prints the verdict.

`digest` is LiveCodeBench's output comparison made canonical: the output is stripped, split
into lines and each line stripped; two lines match when equal as text, or when every
whitespace-separated token of both parses as a `Decimal` and the lists are equal. Each line is
written as `S:<text>`, or `D:<tokens>` with each finite Decimal in exact canonical form (sign,
digits without trailing zeros, exponent; zero is `0`), so equal digests mean every line matches.
NaN never equals anything as a number (as in LiveCodeBench), so a line holding one stays text.

Not covered: programs in other languages; LiveCodeBench's wrapping of a stdin program in a
function (here it runs at module level, as a judge runs it).
"""

from __future__ import annotations

import hashlib
import json
import sys
from decimal import Decimal, InvalidOperation

MARK = "@@rstar2-lcb-verdict@@"
_OUT = sys.stdout  # the call's own stdout, whatever the sandbox made it
_MODULES = (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
    "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing",
)  # fmt: skip
PREAMBLE = (
    "".join(f"from {m} import *\n" for m in _MODULES)
    + "".join(f"import {m}\n" for m in _MODULES if m not in ("builtins", "typing"))
    + "sys.setrecursionlimit(50000)\n"
)


def _canonical_token(token: str) -> str | None:
    try:
        value = Decimal(token)
    except (InvalidOperation, ValueError):
        return None
    if value.is_nan():
        return None
    if value.is_infinite():
        return "-Inf" if value < 0 else "Inf"
    if value.is_zero():
        return "0"
    sign, digits, exponent = value.as_tuple()
    text = "".join(map(str, digits)).rstrip("0")
    exponent = int(exponent) + len(digits) - len(text)
    return f"{'-' if sign else ''}{text}e{exponent}"


def _canonical_line(line: str) -> str:
    tokens = [_canonical_token(t) for t in line.split()]
    if all(t is not None for t in tokens):
        return "D:" + " ".join(t for t in tokens if t is not None)
    return "S:" + line


def digest(output: str) -> str:
    """The canonical digest of a program's output (module docstring)."""
    lines = [line.strip() for line in output.strip().split("\n")]
    text = "\n".join(_canonical_line(line) for line in lines)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _report(**verdict: object) -> None:
    _OUT.write("\n" + MARK + json.dumps(verdict) + "\n")
    _OUT.flush()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def run_stdin(program: str) -> None:
    import io

    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(PREAMBLE, namespace)
    captured = io.StringIO()
    sys.stdout = captured
    try:
        exec(compile(program, "<solution>", "exec"), namespace)
    except SystemExit:
        pass
    except BaseException as exc:
        sys.stdout = _OUT
        _report(status="runtime_error", error=_error(exc))
        return
    sys.stdout = _OUT
    _report(status="ran", digest=digest(captured.getvalue()))


def run_functional(program: str) -> None:
    import io

    test = json.loads(sys.stdin.read())
    namespace: dict[str, object] = {"__name__": "__main__"}
    sys.stdout = io.StringIO()  # what the program prints is not its answer
    try:
        exec(PREAMBLE + "\n" + program, namespace)
        solution = namespace.get("Solution")
        owner = solution() if "class Solution" in program and callable(solution) else None
        method = getattr(owner, test["fn_name"], None) if owner is not None else None
        method = method or namespace.get(test["fn_name"])
        if not callable(method):
            raise NameError(f"no function {test['fn_name']!r}")
        args = [json.loads(line) for line in test["inputs"].split("\n")]
        result = method(*args)
        if isinstance(result, tuple):
            result = list(result)
        passed = result == json.loads(test["expected"])
    except BaseException as exc:
        sys.stdout = _OUT
        _report(status="runtime_error", error=_error(exc))
        return
    sys.stdout = _OUT
    _report(status="passed" if passed else "wrong_answer")


def harness_code(program: str, testtype: str) -> str:
    """The source of one sandbox call: this module, then the call of its runner."""
    runner = "run_functional" if testtype == "functional" else "run_stdin"
    with open(__file__, encoding="utf-8") as handle:
        source = handle.read()
    return f"{source}\n\n{runner}({program!r})\n"

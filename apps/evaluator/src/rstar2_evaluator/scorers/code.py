"""LiveCodeBench code generation: the model's program run against every test in rstar2-sandbox.

Data: LiveCodeBench's published `code_generation_lite` JSONL (`test.jsonl`, `test2.jsonl` ...
`test6.jsonl`; each row `question_id`, `question_title`, `question_content`, `platform`,
`contest_date`, `starter_code`, `difficulty`, `public_test_cases`, `private_test_cases`,
`metadata`). `--data` is one such file, or the folder holding them, from which `release` picks
the files (`release_v6`: test.jsonl to test6.jsonl, as LiveCodeBench's loader; `v6`: test6.jsonl
alone); `start_date` / `end_date` keep the problems of a contest-date window. The private tests
are JSON or, in later releases, base64 of zlib of a pickle of that JSON text: they are unpacked
by `_unpickle`, which admits no class or function at all (a pickle that names one is refused
before anything is built), so nothing downloaded is ever run in this process.

Scoring follows LiveCodeBench's (lcb_runner/evaluation/testing_util.py): the program is the
first fenced code block of the answer (reasoning and tool blocks removed first); every public
and private test runs, each in its own rstar2-sandbox call (`_harness.py`, the same service the
tool uses, and no other execution path), stopping at the first failure; a sample passes when
all pass, and pass@1 is the mean over samples. stdin tests compare the output line by line
(equal text, or equal lists of Decimals); functional tests compare the return value with `==`.
Where this differs from LiveCodeBench: the program reads a real standard input (so
`sys.stdin.buffer` and `open(0)` work, where LiveCodeBench's patched `StringIO` fails), runs at
module level rather than wrapped in a function, and is limited by the sandbox (`timeout_s` of
wall time per test, the sandbox's memory limit) instead of a 6 s alarm and no memory limit; a
test larger than the sandbox's stdin limit is the system's failure (`CheckFailed`), not the
model's.

Not covered: LiveCodeBench's other scenarios (self-repair, test output prediction, execution).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import pickle
import re
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rstar2_curriculum import BenchmarkError, Problem
from rstar2_evaluator.scorers import CheckFailed, Prompt, Response, Verdict
from rstar2_evaluator.scorers._harness import MARK, digest, harness_code
from rstar2_sandbox import ExecutionRequest, ExecutionResult, ExecutionStatus, Sandbox

FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")
DOWNLOAD = (
    "huggingface.co/datasets/livecodebench/code_generation_lite: test.jsonl ... test6.jsonl "
    "(a folder of them, or one file)"
)
SYSTEM = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all "
    "tests."
)
WITH_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose "
    "your code within delimiters."
)
WITHOUT_STARTER = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure "
    "that when the python program runs, it reads the inputs, runs the algorithm and writes "
    "output to STDOUT."
)
MAX_TESTS_BYTES = 1 << 30  # one problem's unpacked tests at most


def release_files(release: str) -> tuple[str, ...]:
    """The files of a release: `release_vN` (cumulative, as LiveCodeBench) or `vN` (one)."""
    m = re.fullmatch(r"(release_)?v([1-6])", release)
    if m is None:
        raise BenchmarkError(f"livecodebench: unknown release {release!r} (release_v1..v6, v1..v6)")
    n = int(m.group(2))
    return FILES[:n] if m.group(1) else (FILES[n - 1],)


class _PlainUnpickler(pickle.Unpickler):
    """Builds only plain values (str, bytes, numbers, lists, dicts, tuples): any class or
    function a pickle names is refused, so no downloaded code can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle names {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: a persistent id")


def _unpickle(text: str) -> Any:
    packed = base64.b64decode(text.encode("ascii"), validate=True)
    unzip = zlib.decompressobj()
    raw = unzip.decompress(packed, MAX_TESTS_BYTES)
    if unzip.unconsumed_tail:
        raise ValueError(f"unpacks to more than {MAX_TESTS_BYTES} bytes")
    return _PlainUnpickler(io.BytesIO(raw)).load()


def decode_tests(value: Any) -> list[dict[str, str]]:
    """Test cases from their published form: JSON text, or base64(zlib(pickle(JSON text)))."""
    if isinstance(value, list):
        tests = value
    else:
        try:
            tests = json.loads(value)
        except (TypeError, ValueError):
            tests = json.loads(_unpickle(value))
    if not isinstance(tests, list) or not all(
        isinstance(t, dict) and {"input", "output"} <= set(t) for t in tests
    ):
        raise ValueError("not a list of {input, output, testtype} objects")
    return [
        {"input": str(t["input"]), "output": str(t["output"]), "testtype": t.get("testtype", "")}
        for t in tests
    ]


def _rows(path: Path, release: str) -> Iterator[tuple[str, dict[str, Any]]]:
    files = [path] if path.is_file() else [path / f for f in release_files(release)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise BenchmarkError(
            f"livecodebench: {path} lacks {', '.join(missing)}; download {DOWNLOAD} and pass "
            "it with --data PATH"
        )
    for file in files:
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        yield f"{file.name}:{number}", json.loads(line)
                    except ValueError:
                        raise BenchmarkError(
                            f"livecodebench: {file.name}:{number} is not a JSON object"
                        ) from None


def question_text(content: str, starter_code: str) -> str:
    """LiveCodeBench's user turn for a problem (its generic chat template)."""
    text = f"### Question:\n{content}\n\n"
    if starter_code:
        text += f"### Format: {WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        text += f"### Format: {WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    return text + "### Answer: (use the provided format with backticks)\n\n"


def _problem(where: str, row: dict[str, Any]) -> Problem:
    try:
        meta = json.loads(row.get("metadata") or "{}")
        public = decode_tests(row["public_test_cases"])
        private = decode_tests(row["private_test_cases"])
        return Problem(
            id=str(row["question_id"]),
            question=question_text(str(row["question_content"]), str(row.get("starter_code", ""))),
            answer="",
            source="livecodebench",
            metadata={
                "public_tests": row["public_test_cases"],
                "private_tests": row["private_test_cases"],
                "tests": len(public) + len(private),
                "fn_name": meta.get("func_name"),
                "difficulty": str(row.get("difficulty", "")),
                "platform": str(row.get("platform", "")),
                "contest_date": str(row.get("contest_date", "")),
                "title": str(row.get("question_title", "")),
            },
        )
    except (KeyError, TypeError, ValueError, pickle.UnpicklingError, zlib.error) as error:
        raise BenchmarkError(
            f"livecodebench: {where}: cannot read the problem ({type(error).__name__}: "
            f"{str(error)[:200]})"
        ) from None


def extract_program(response: Response) -> str | None:
    """The program: the first fenced block (LiveCodeBench's rule) of the reply as a benchmark
    reads it (`Response.text`: reasoning and tool blocks removed, the `<answer>` block's
    content when there is one)."""
    lines = response.text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    return "\n".join(lines[fences[0] + 1 : fences[1]])


def _outcome(result: ExecutionResult, test: dict[str, str]) -> str:
    """passed, wrong_answer, runtime_error, timeout or memory; CheckFailed for the sandbox's own
    failure."""
    status = result.status
    if status == ExecutionStatus.SANDBOX_ERROR or status == ExecutionStatus.REJECTED:
        raise CheckFailed(f"livecodebench: the sandbox could not run a test ({result.message})")
    if status == ExecutionStatus.TIMEOUT:
        return "timeout"
    if status == ExecutionStatus.MEMORY_EXCEEDED:
        return "memory"
    line = next((ln for ln in reversed(result.stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        return "runtime_error"  # the program ended the process, or flooded the output
    verdict = json.loads(line[len(MARK) :])
    if verdict["status"] == "ran":
        return "passed" if verdict["digest"] == digest(test["output"]) else "wrong_answer"
    return str(verdict["status"])


class CodeChecker:
    """LiveCodeBench's code generation (module docstring); `sandbox` runs the tests."""

    metric = "pass@1"

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        *,
        release: str = "release_v6",
        start_date: str = "",
        end_date: str = "",
        timeout_s: float = 6.0,
        tests_at_once: int = 8,
    ) -> None:
        self.sandbox = sandbox
        self.release = release
        self.window = (start_date, end_date)
        self.timeout_s = timeout_s
        self.tests_at_once = tests_at_once

    def load(self, path: Path | None) -> list[Problem]:
        if path is None:
            raise BenchmarkError(
                f"livecodebench has no copy here: download {DOWNLOAD} and pass it with --data PATH"
            )
        start, end = self.window
        problems = []
        for where, row in _rows(path, self.release):
            date = str(row.get("contest_date", ""))[:10]
            if (start and date < start) or (end and date >= end):
                continue
            problems.append(_problem(where, row))
        if not problems:
            raise BenchmarkError(f"livecodebench: no problem in {path} within {start}..{end}")
        return problems

    def prompt(self, problem: Problem) -> Prompt:
        return Prompt(
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": problem.question},
            ]
        )

    async def check(self, problem: Problem, response: Response) -> Verdict:
        program = extract_program(response)
        meta = problem.metadata
        if program is None or not program.strip():
            return Verdict(score=0.0, details={"difficulty": meta["difficulty"], "why": "no_code"})
        if self.sandbox is None:
            raise CheckFailed("livecodebench: no sandbox to run the tests in")
        tests = decode_tests(meta["public_tests"]) + decode_tests(meta["private_tests"])
        passed = 0
        for start in range(0, len(tests), self.tests_at_once):
            chunk = tests[start : start + self.tests_at_once]
            requests = [self._request(program, test, meta) for test in chunk]
            results = await self.sandbox.execute_many(requests)
            for test, result in zip(chunk, results, strict=True):
                outcome = _outcome(result, test)
                if outcome != "passed":
                    return Verdict(
                        score=0.0,
                        answer=program,
                        details={
                            "difficulty": meta["difficulty"],
                            "why": outcome,
                            "passed": passed,
                            "tests": len(tests),
                        },
                    )
                passed += 1
        details = {"difficulty": meta["difficulty"], "passed": passed, "tests": len(tests)}
        return Verdict(score=1.0, answer=program, details=details)

    def _request(
        self, program: str, test: dict[str, str], meta: dict[str, Any]
    ) -> ExecutionRequest:
        functional = test["testtype"] == "functional" or (
            meta.get("fn_name") and test["testtype"] != "stdin"
        )
        if functional:
            stdin = json.dumps(
                {"fn_name": meta["fn_name"], "inputs": test["input"], "expected": test["output"]}
            )
            code = harness_code(program, "functional")
        else:
            stdin, code = test["input"], harness_code(program, "stdin")
        return ExecutionRequest(code=code, stdin=stdin, timeout_s=self.timeout_s)

    def metrics(self, checked: Sequence[tuple[Problem, Verdict]]) -> dict[str, float]:
        by: dict[str, list[float]] = defaultdict(list)
        for _, verdict in checked:
            by["pass@1"].append(verdict.score)
            by[f"pass@1_{verdict.details.get('difficulty') or 'unknown'}"].append(verdict.score)
        return {key: sum(v) / len(v) for key, v in sorted(by.items()) if v}

    async def close(self) -> None:
        await asyncio.sleep(0)  # the sandbox belongs to the run, which closes it

"""`grade(response, gold)`: the reward. Cheap checks in the caller, sympy in killable workers.

Order, cheapest first; the first that decides wins and is named in `Grade.method`:

1. input checks (type, size) and extraction (`extract.py`);
2. `string`: the raw or the normalised (`_latex.py`) strings are equal;
3. `text`: neither side is maths (words, choice letters) and they match ignoring case and spaces;
4. `exact`: both trees (`parse.py`) decided by `compare.judge` with exact rationals;
5. `symbolic`: the undecided pair goes to a worker (`pool.py`) with a hard time limit.

`grade` never raises and never hangs: bad input, unparsable text, a timeout or a dead worker
are all a `Grade` with `correct=False` and a `reason`. One grade's own work is bounded by
`timeout_s` (default 0.8 s) in all: steps 1-4 run under an in-process deadline (`_budget.py`,
checked per token and per node compared), and the worker gets what is left of it, waiting for
an idle worker included; past it the grade is `reason="timeout"`. In `grade_many` and
`agrade_many` the wait for a free worker (the batch's queue) is not charged to a grade. `Grader` owns the worker pool and is
safe to share between threads and event loops; the module-level `grade*` functions use one
lazily started `Grader` per `VerifyConfig`, closed at interpreter exit.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rstar2_verify._budget import DeadlineExceeded, deadline
from rstar2_verify._latex import modulus, normalize
from rstar2_verify.compare import TooComplexError, exact_scalar, judge
from rstar2_verify.config import VerifyConfig
from rstar2_verify.expr import Node
from rstar2_verify.extract import extract_answer, gold_answer
from rstar2_verify.parse import ParseError, nesting_depth, parse
from rstar2_verify.pool import WorkerPool

__all__ = ["Grade", "Grader", "agrade", "agrade_many", "grade", "grade_many", "shared_grader"]


@dataclass(frozen=True, slots=True)
class Grade:
    """One verdict. `reason` is "" when correct; `elapsed` is seconds spent grading."""

    correct: bool
    extracted: str | None
    gold_normalized: str
    method: str
    reason: str
    elapsed: float
    source: str


@dataclass(frozen=True, slots=True)
class _Pending:
    """A pair the exact path could not decide: to be finished in a worker."""

    gold: Node
    answer: Node
    extracted: str
    gold_normalized: str
    source: str
    spent: float  # seconds the cheap path took


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | str):
        return str(value)
    return None


def _squash(s: str) -> str:
    return "".join(s.split()).lower().replace("{", "").replace("}", "").strip("()")


def _prepare(
    response: Any, gold: Any, config: VerifyConfig, timeout_s: float | None = None
) -> Grade | _Pending:
    start = time.perf_counter()
    try:
        with deadline(timeout_s or config.timeout_s):
            return _prepare_unsafe(response, gold, config, start)
    except DeadlineExceeded:
        elapsed = time.perf_counter() - start
        return Grade(False, None, "", "", "timeout", elapsed, "none")
    except Exception as exc:  # a parser bug must cost one reward, not a training step
        elapsed = time.perf_counter() - start
        return Grade(False, None, "", "", f"error: {type(exc).__name__}", elapsed, "none")


def _prepare_unsafe(
    response: Any, gold: Any, config: VerifyConfig, start: float
) -> Grade | _Pending:

    def done(correct: bool, method: str, reason: str, extracted=None, gold_n="", source="none"):
        elapsed = time.perf_counter() - start
        return Grade(correct, extracted, gold_n, method, reason, elapsed, source)

    response_text, gold_text = _text(response), _text(gold)
    if gold_text is None or not gold_text.strip():
        return done(False, "", "empty_gold")
    if response_text is None or not response_text.strip():
        return done(False, "", "empty_response")
    if len(response_text) > config.max_response_chars:
        return done(False, "", "too_long")
    extraction = extract_answer(response_text, config.max_raw_chars)
    gold_text = gold_answer(gold_text)
    if extraction.text is None:
        return done(False, "", "no_answer", None, gold_text, extraction.source)
    answer = extraction.text.strip()
    where = (answer, extraction.source)
    if answer == gold_text:
        return done(True, "string", "", answer, gold_text, extraction.source)
    if len(gold_text) > config.max_answer_chars:
        return done(False, "", "gold_too_long", *where[:1], gold_text[:200], where[1])
    if len(answer) > config.max_answer_chars:
        return done(False, "", "too_long", answer[:200], gold_text, where[1])
    g_mod, a_mod = modulus(gold_text), modulus(answer)
    if g_mod is not None and a_mod is not None and g_mod != a_mod:  # residues mod different m
        return done(False, "", "modulus", answer, gold_text, where[1])
    g_norm, a_norm = normalize(gold_text), normalize(answer)
    if g_norm == a_norm or g_norm.replace(" ", "") == a_norm.replace(" ", ""):
        return done(True, "string", "", *where[:1], g_norm, where[1])
    if max(nesting_depth(g_norm), nesting_depth(a_norm)) > config.max_depth:
        return done(False, "", "too_deep", answer, g_norm, where[1])
    try:
        gold_tree = parse(g_norm, config.max_depth)
    except ParseError:
        same = _squash(g_norm) == _squash(a_norm)
        return done(same, "text", "" if same else "mismatch", answer, g_norm, where[1])
    try:
        answer_tree = parse(a_norm, config.max_depth)
    except ParseError:
        same = _squash(g_norm) == _squash(a_norm)
        return done(same, "text", "" if same else "unparsed_answer", answer, g_norm, where[1])
    try:
        if gold_tree == answer_tree:
            return done(True, "exact", "", answer, g_norm, where[1])
        verdict = judge(gold_tree, answer_tree, exact_scalar(config.max_digits))
    except TooComplexError:
        return done(False, "", "too_complex", answer, g_norm, where[1])
    except RecursionError:
        return done(False, "", "too_deep", answer, g_norm, where[1])
    if verdict is not None:
        return done(verdict, "exact", "" if verdict else "mismatch", answer, g_norm, where[1])
    spent = time.perf_counter() - start
    return _Pending(gold_tree, answer_tree, answer, g_norm, where[1], spent)


_BATCH_QUEUE_S = 60.0  # how long a batch's pair may wait for a free worker, uncharged


class Grader:
    """Owns the worker pool; `grade`, `grade_many`, `agrade`, `agrade_many`; a context manager."""

    def __init__(self, config: VerifyConfig | None = None) -> None:
        self.config = config or VerifyConfig()
        size = self.config.workers or os.cpu_count() or 1
        self.pool = WorkerPool(size, self.config.memory_mb, self.config.max_digits)
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="rstar2-verify")

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the worker processes; later calls raise RuntimeError."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.pool.close()

    def start(self, wait_s: float = 0.0) -> None:
        """Start the workers now rather than on the first symbolic check; with `wait_s`, wait
        up to that long until all are ready (a grade never waits longer than its bound)."""
        self.pool.start()
        if wait_s > 0:
            self.pool.wait_ready(wait_s)

    def _finish(self, pending: _Pending, timeout_s: float | None, batch: bool = False) -> Grade:
        began = time.perf_counter()
        left = (timeout_s or self.config.timeout_s) - pending.spent
        queue_s = _BATCH_QUEUE_S if batch else None  # a batch's queue is not a grade's time
        outcome = self.pool.run(pending.gold, pending.answer, max(left, 0.001), queue_s)
        correct = outcome.status == "ok" and outcome.correct
        reason = ("" if correct else "mismatch") if outcome.status == "ok" else outcome.status
        elapsed = pending.spent + time.perf_counter() - began
        method = "symbolic" if outcome.status == "ok" else ""
        return Grade(
            correct,
            pending.extracted,
            pending.gold_normalized,
            method,
            reason,
            elapsed,
            pending.source,
        )

    def grade(self, response: Any, gold: Any, timeout_s: float | None = None) -> Grade:
        """Grade one response against one gold answer; never raises on bad input."""
        prepared = _prepare(response, gold, self.config, timeout_s)
        return prepared if isinstance(prepared, Grade) else self._finish(prepared, timeout_s)

    def grade_many(self, pairs: Iterable[tuple[Any, Any]]) -> list[Grade]:
        """Grade many (response, gold) pairs; symbolic checks run on every worker at once."""
        prepared = [_prepare(r, g, self.config) for r, g in pairs]
        futures = {
            k: self._threads.submit(self._finish, p, None, True)
            for k, p in enumerate(prepared)
            if isinstance(p, _Pending)
        }
        return [futures[k].result() if k in futures else p for k, p in enumerate(prepared)]  # type: ignore[misc]

    async def agrade(
        self, response: Any, gold: Any, timeout_s: float | None = None, batch: bool = False
    ) -> Grade:
        """`grade` for an event loop: the cheap path inline, the worker wait in a thread."""
        prepared = _prepare(response, gold, self.config, timeout_s)
        if isinstance(prepared, Grade):
            return prepared
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._finish, prepared, timeout_s, batch)

    async def agrade_many(
        self, pairs: Iterable[tuple[Any, Any]], timeout_s: float | None = None
    ) -> list[Grade]:
        """`grade_many` for an event loop."""
        return list(await asyncio.gather(*(self.agrade(r, g, timeout_s, True) for r, g in pairs)))


_graders: dict[VerifyConfig, Grader] = {}
_graders_lock = threading.Lock()


def shared_grader(config: VerifyConfig | None = None) -> Grader:
    """The one `Grader` of `config` behind the module functions. Created on first use, when its
    workers are started and waited for (once, up to 60 s), so that no grade's bound is spent
    on start-up; closed at interpreter exit."""
    config = config or VerifyConfig()
    with _graders_lock:
        grader = _graders.get(config)
        if grader is None:
            grader = _graders[config] = Grader(config)
            grader.start(wait_s=60.0)
        return grader


_shared = shared_grader


@atexit.register
def _close_shared() -> None:
    with _graders_lock:
        for grader in _graders.values():
            grader.close()
        _graders.clear()


def grade(response: Any, gold: Any, config: VerifyConfig | None = None) -> Grade:
    """Grade one response with the shared `Grader` of `config`."""
    return _shared(config).grade(response, gold)


def grade_many(pairs: Iterable[tuple[Any, Any]], config: VerifyConfig | None = None) -> list[Grade]:
    """Grade many pairs with the shared `Grader` of `config`, using every worker."""
    return _shared(config).grade_many(pairs)


async def agrade(response: Any, gold: Any, config: VerifyConfig | None = None) -> Grade:
    """Async `grade`."""
    return await _shared(config).agrade(response, gold)


async def agrade_many(
    pairs: Iterable[tuple[Any, Any]], config: VerifyConfig | None = None
) -> list[Grade]:
    """Async `grade_many`."""
    return await _shared(config).agrade_many(pairs)

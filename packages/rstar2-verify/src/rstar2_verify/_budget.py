"""An in-process deadline for one grade, checked in the loops of the parser and the comparer.

`grader.py` opens a `deadline(seconds)` around the cheap path of one grade; `check()` (called
per token, per tree node compared, per term evaluated) raises `DeadlineExceeded` once the clock
passes it, and the grade becomes `reason="timeout"`, `correct=False`. Outside a deadline
`check()` does nothing. The deadline is a context variable, so threads and event-loop tasks
each see their own. What a loop cannot interrupt (one big-integer operation, one regex) is
bounded by size caps instead (`VerifyConfig.max_answer_chars`, `max_digits`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["DeadlineExceeded", "check", "deadline", "remaining"]

_until: ContextVar[float] = ContextVar("rstar2_verify_deadline", default=math.inf)


class DeadlineExceeded(Exception):
    """The grade ran past its deadline (not a ValueError: parsers must not swallow it)."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Make `check()` raise once `seconds` have passed (nested deadlines keep the earlier)."""
    token = _until.set(min(_until.get(), time.perf_counter() + seconds))
    try:
        yield
    finally:
        _until.reset(token)


def check() -> None:
    """Raise `DeadlineExceeded` when the current deadline has passed."""
    if time.perf_counter() > _until.get():
        raise DeadlineExceeded


def remaining() -> float:
    """Seconds left before the current deadline (inf outside one)."""
    return _until.get() - time.perf_counter()

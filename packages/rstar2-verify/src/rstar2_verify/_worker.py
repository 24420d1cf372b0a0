"""The worker process: `python -m rstar2_verify._worker FD MEMORY_MB MAX_DIGITS`.

Started by `pool.py` as a plain subprocess (not `multiprocessing`, so the parent's `__main__` is
never re-imported and a script without an `if __name__ == "__main__"` guard, a notebook or a Ray
actor can start it). It caps its own address space, imports sympy, warms it up
on a few comparisons, says "ready" on the inherited
socket, then answers (gold, answer) tree pairs with an `Outcome` until it reads None or EOF.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from multiprocessing.connection import Connection

from rstar2_verify.pool import Outcome

_WARM_UP = (
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\frac{22}{7}", "\\pi"),
    ("x^2+2x+1", "(x+1)^2"),
    ("x + y = 1", "2x + 2y = 2"),
    ("\\sin^2 x + \\cos^2 x", "1"),
    ("1.41", "\\sqrt{2}"),
)


def _warm_up(max_digits: int) -> None:
    """Pay sympy's first-call costs (lazy imports, caches) before the worker joins the pool,
    so that a fresh worker's first task is not the one that runs past the time limit."""
    from rstar2_verify._latex import normalize
    from rstar2_verify._symbolic import compare_trees
    from rstar2_verify.parse import parse

    for gold, answer in _WARM_UP:
        with contextlib.suppress(Exception):  # a warm-up failure must not stop the worker
            compare_trees(parse(normalize(gold)), parse(normalize(answer)), max_digits)


def serve(conn: Connection, max_digits: int) -> None:
    """Answer comparison tasks on `conn` until None or EOF."""
    from rstar2_verify._symbolic import compare_trees
    from rstar2_verify.compare import TooComplexError

    _warm_up(max_digits)
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        gold, answer = task
        try:
            outcome = Outcome("ok", compare_trees(gold, answer, max_digits))
        except TooComplexError as exc:
            outcome = Outcome("too_complex", detail=str(exc))
        except MemoryError:
            outcome = Outcome("memory", detail="worker memory cap reached")
        except RecursionError:
            outcome = Outcome("too_complex", detail="recursion limit")
        except Exception as exc:  # a sympy failure on one input is an answer, not a crash
            outcome = Outcome("error", detail=f"{type(exc).__name__}: {exc}"[:200])
        conn.send(outcome)


def main(argv: list[str]) -> None:
    fd, memory_mb, max_digits = (int(a) for a in argv)
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.set_int_max_str_digits(0)  # exact values are bounded by max_digits instead
    serve(Connection(fd), max_digits)


if __name__ == "__main__":
    main(sys.argv[1:])

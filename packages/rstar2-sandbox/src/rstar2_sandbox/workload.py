"""A seeded, realistic mix of maths tool calls, each with the outcome it must have.

Contract. `make_workload(n, mix, seed)` returns `n` `Job`s: a request and what a correct sandbox
answers (status, and stdout or the trailing expression's repr). Mixes: "standard" is about 65 %
short arithmetic / sympy / itertools snippets, 15 % that raise, 10 % infinite loops, 5 %
heavier numpy / sympy (tens of ms) and 5 % calls that take real CPU as a maths agent's do (0.1
to 0.5 s alone on this project's 2-core machine: sympy `solve` in a loop and `integrate`, numpy
eigenvalues, a pure-Python sieve to a few million); "no_loops" is the per-call mix: no loops and
none of the CPU calls, the rest rescaled. Expected outputs are computed here with the same
libraries (sympy's printing is what a user sees) or by arithmetic that costs far less than the
call. The same seed gives the same jobs. Not covered: timing (see `bench`).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import sympy

from rstar2_sandbox.execution import ExecutionRequest, ExecutionResult, ExecutionStatus

Mix = Literal["standard", "no_loops"]
_WEIGHTS = {
    "standard": {"short": 65, "raise": 15, "loop": 10, "heavy": 5, "cpu": 5},
    "no_loops": {"short": 70, "raise": 15, "loop": 0, "heavy": 5, "cpu": 0},
}


@dataclass(frozen=True)
class Job:
    """One call and its correct outcome."""

    kind: str  # short | raise | loop | heavy | cpu
    request: ExecutionRequest
    status: ExecutionStatus
    stdout: str | None = None  # expected stdout, when checked
    result_repr: str | None = None  # expected repr of the trailing expression, when checked
    exception: str | None = None  # expected exception name in the traceback

    def check(self, result: ExecutionResult) -> bool:
        """True when `result` is what a correct sandbox returns for this job."""
        if result.status != self.status:
            return False
        if self.stdout is not None and result.stdout != self.stdout:
            return False
        if self.result_repr is not None and result.result_repr != self.result_repr:
            return False
        return self.exception is None or self.exception in result.traceback


def _short(rng: random.Random) -> tuple[str, str | None, str | None]:
    """(code, expected stdout, expected repr) of a short snippet (the stdin one: its input)."""
    kind = rng.randrange(8)
    if kind == 0:
        a, b = rng.randrange(1, 10**6), rng.randrange(10**6, 10**7)
        return f"print(sum(range({a}, {b}, 7)))", f"{sum(range(a, b, 7))}\n", None
    if kind == 1:
        n, k = rng.randrange(20, 200), rng.randrange(2, 15)
        return (
            f"from math import comb\nprint(comb({n}, {k}) % 1000000007)",
            f"{math.comb(n, k) % 1000000007}\n",
            None,
        )
    if kind == 2:
        n = rng.randrange(10**8, 10**12)
        factors = sorted(sympy.factorint(n).items())  # sorted: factorint's order is not fixed
        return f"import sympy\nprint(sorted(sympy.factorint({n}).items()))", f"{factors}\n", None
    if kind == 3:
        k = rng.randrange(4, 8)
        code = f"import itertools\nlen([p for p in itertools.permutations(range({k})) if p[0] < p[-1]])"
        count = sum(1 for p in itertools.permutations(range(k)) if p[0] < p[-1])
        return code, "", repr(count)
    if kind == 4:
        n = rng.randrange(10, 60)
        code = f"from fractions import Fraction\nprint(sum(Fraction(1, i) for i in range(1, {n})))"
        return code, f"{sum(Fraction(1, i) for i in range(1, n))}\n", None
    if kind == 5:
        a, m = rng.randrange(2, 1000), rng.randrange(10**5, 10**6)
        e = rng.randrange(10**5, 10**9)
        return f"pow({a}, {e}, {m})", "", repr(pow(a, e, m))
    if kind == 6:
        c = rng.randrange(2, 50)
        x = sympy.Symbol("x")
        roots = sympy.solve(x**2 - 5 * x - c, x)
        code = f"import sympy\nx = sympy.Symbol('x')\nprint(sympy.solve(x**2 - 5*x - {c}, x))"
        return code, f"{roots}\n", None
    n = rng.randrange(100, 5000)  # the stdin case: `n` arrives on standard input
    return (
        "n = int(input())\nprint(sum(i * i for i in range(n)))",
        f"{sum(i * i for i in range(n))}\n",
        str(n),
    )


_RAISES = [
    ("1 / 0", "ZeroDivisionError"),
    ("[][3]", "IndexError"),
    ("int('seven')", "ValueError"),
    ("undefined_name + 1", "NameError"),
    ("import sympy\nsympy.Symbol('x') < 1 and None or {}['k']", "TypeError"),
    ("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
]


def _heavy(rng: random.Random) -> tuple[str, str | None, str | None]:
    if rng.random() < 0.5:
        n = rng.randrange(150, 300)
        code = (
            "import numpy as np\n"
            f"rng = np.random.default_rng({rng.randrange(1000)})\n"
            f"a = rng.random(({n}, {n}))\n"
            "print(int(np.linalg.matrix_rank(a @ a.T)))"
        )
        return code, f"{n}\n", None
    n = rng.randrange(30, 90)
    x = sympy.Symbol("x")
    code = f"import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**{n} - 1))"
    return code, f"{sympy.factor(x**n - 1)}\n", None


def _primes_to(n: int) -> int:
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\0\0"
    for i in range(2, math.isqrt(n) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytes(len(range(i * i, n + 1, i)))
    return sum(sieve)


def _rational_roots(low: int, high: int, c: int) -> int:
    """Distinct rational roots of x**2 + b*x + c over b in [low, high)."""
    roots = set()
    for b in range(low, high):
        disc = b * b - 4 * c
        if disc >= 0 and math.isqrt(disc) ** 2 == disc:
            roots |= {Fraction(-b + math.isqrt(disc), 2), Fraction(-b - math.isqrt(disc), 2)}
    return len(roots)


def _cpu(rng: random.Random) -> tuple[str, str]:
    """(code, expected stdout) of a call that takes real CPU, as a maths agent writes them."""
    kind = rng.randrange(5)
    if kind == 0:  # sympy solve, one equation after another (about 10 ms each)
        m, c = rng.randrange(10, 20), -rng.choice([6, 12, 20, 30, 42, 56])
        code = (
            "import sympy\nx = sympy.Symbol('x')\nroots = set()\n"
            f"for b in range(-{m}, {m}):\n"
            f"    for r in sympy.solve(x**2 + b*x + {c}, x):\n"
            "        if r.is_rational:\n            roots.add(r)\nprint(len(roots))"
        )
        return code, f"{_rational_roots(-m, m, c)}\n"
    if kind == 1:  # sympy solve of a trigonometric equation, several right-hand sides
        m = rng.randrange(4, 8)
        d = m + rng.randrange(0, 4)  # k/d <= 1 < sqrt(2): two solutions each
        code = (
            "import sympy\nx = sympy.Symbol('x')\nprint(sum(len(sympy.solve(sympy.sin(x) + "
            f"sympy.cos(x) - sympy.Rational(k, {d}), x)) for k in range(1, {m})))"
        )
        return code, f"{2 * (m - 1)}\n"
    if kind == 2:  # sympy integrate, checked by differentiating back
        k, a = rng.choice([(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)])
        code = (
            "import sympy\nx = sympy.Symbol('x')\n"
            f"f = x**{k} * sympy.exp(x) * sympy.sin({a}*x)\n"
            "F = sympy.integrate(f, x)\nprint(sympy.expand(sympy.diff(F, x) - f))"
        )
        return code, "0\n"
    if kind == 3:  # numpy eigenvalues of a dense matrix
        n = rng.randrange(500, 801, 50)
        code = (
            "import numpy as np\n"
            f"a = np.random.default_rng({rng.randrange(1000)}).random(({n}, {n}))\n"
            "w = np.linalg.eigvals(a)\n"
            f"print(len(w), bool(abs(w.sum() - np.trace(a)) < 1e-6 * {n}))"
        )
        return code, f"{n} True\n"
    n = rng.randrange(1_500_000, 4_000_001, 250_000)  # a pure-Python sieve
    code = (
        f"n = {n}\nis_prime = [True] * (n + 1)\nis_prime[0] = is_prime[1] = False\n"
        "for i in range(2, int(n ** 0.5) + 1):\n    if is_prime[i]:\n"
        "        for j in range(i * i, n + 1, i):\n            is_prime[j] = False\n"
        "print(sum(is_prime))"
    )
    return code, f"{_primes_to(n)}\n"


def make_workload(
    n: int, mix: Mix = "standard", seed: int = 0, timeout_s: float = 2.0
) -> list[Job]:
    """`n` jobs of `mix`, reproducible from `seed`."""
    rng = random.Random(seed)
    kinds, weights = zip(*_WEIGHTS[mix].items(), strict=True)
    jobs = []
    for index in range(n):
        kind = rng.choices(kinds, weights)[0]
        stdin = ""
        if kind == "short":
            code, stdout, value = _short(rng)
            if "input()" in code:
                stdin, value = f"{value}\n", None
            job = Job(
                kind, ExecutionRequest(code=code, stdin=stdin), ExecutionStatus.OK, stdout, value
            )
        elif kind == "raise":
            code, name = rng.choice(_RAISES)
            job = Job(kind, ExecutionRequest(code=code), ExecutionStatus.ERROR, exception=name)
        elif kind == "loop":
            code = rng.choice(["while True: pass", "i = 0\nwhile i >= 0:\n    i += 1"])
            job = Job(kind, ExecutionRequest(code=code), ExecutionStatus.TIMEOUT)
        elif kind == "heavy":
            code, stdout, value = _heavy(rng)
            job = Job(kind, ExecutionRequest(code=code), ExecutionStatus.OK, stdout, value)
        else:
            code, stdout = _cpu(rng)
            job = Job(kind, ExecutionRequest(code=code), ExecutionStatus.OK, stdout)
        request = job.request.model_copy(update={"timeout_s": timeout_s, "request_id": str(index)})
        jobs.append(Job(job.kind, request, job.status, job.stdout, job.result_repr, job.exception))
    return jobs

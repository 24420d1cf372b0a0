"""The sympy side: answer trees to sympy objects, and the comparer that runs in a worker.

Runs only inside a worker process (`pool.py`), which holds the wall-clock limit and the memory
cap; nothing here tries to bound its own time. Trees become sympy objects node by node (no
`sympify` of text, no `eval`). Numeric powers whose result would pass `max_digits` raise
`TooComplexError` before sympy is asked to build them.

Scalar equality, cheapest first: structural equality; with no free symbols, sympy's adaptive
evaluation of a - b to 60 significant digits (zero when no significant digit can be found, so a
difference of 10^-300 is still a difference); with free symbols, the difference at four fixed points
(60-digit floats, so `x^{10^8}` costs nothing); `simplify(a - b) == 0` only where the numbers cannot be had (poles). Mode "prop" (equations) asks whether the
two sides' differences are a nonzero constant multiple of each other; mode "round" evaluates the
answer to 60 digits and applies `compare.round_matches`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy
from sympy.core.evalf import PrecisionExhausted

from rstar2_verify.compare import Scalar, TooComplexError, exact_value, judge, near, round_matches
from rstar2_verify.expr import (
    Add,
    Const,
    Fact,
    Func,
    Mul,
    Node,
    Num,
    Percent,
    Pow,
    Sym,
)

__all__ = ["compare_trees", "to_sympy"]

_FUNCS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "sec": sympy.sec, "csc": sympy.csc,
    "cot": sympy.cot, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh, "ln": sympy.log,
    "exp": sympy.exp, "abs": sympy.Abs, "floor": sympy.floor, "ceiling": sympy.ceiling,
    "sqrt": sympy.sqrt, "binom": sympy.binomial, "gcd": sympy.gcd, "lcm": sympy.lcm,
    "max": sympy.Max, "min": sympy.Min,
}  # fmt: skip
_CONSTS = {"pi": sympy.pi, "e": sympy.E, "i": sympy.I, "oo": sympy.oo}
_POINTS = (Fraction(7, 10), Fraction(13, 7), Fraction(-5, 3), Fraction(29, 11))


def to_sympy(node: Node, max_digits: int) -> sympy.Expr:
    """The sympy expression of a scalar tree; ValueError for structures (sets, relations)."""
    exact = exact_value(node, max_digits)
    if exact is not None:
        return sympy.Rational(exact.numerator, exact.denominator)
    if isinstance(node, Num):
        return sympy.Rational(node.value.numerator, node.value.denominator)
    if isinstance(node, Sym):
        return sympy.Symbol(node.name)
    if isinstance(node, Const):
        return _CONSTS[node.name]
    if isinstance(node, Add):
        return sympy.Add(*(to_sympy(t, max_digits) for t in node.terms))
    if isinstance(node, Mul):
        parts = [
            1 / to_sympy(f, max_digits) if inv else to_sympy(f, max_digits)
            for f, inv in zip(node.factors, node.inverse, strict=True)
        ]
        return sympy.Mul(*parts)
    if isinstance(node, Pow):
        base, exp = to_sympy(node.base, max_digits), to_sympy(node.exp, max_digits)
        if exp.is_number and base.is_number and abs(sympy.N(exp, 15)) > 10 * max_digits:
            raise TooComplexError("power too large")
        return sympy.Pow(base, exp)
    if isinstance(node, Percent):
        return to_sympy(node.arg, max_digits) / 100
    if isinstance(node, Fact):
        return sympy.factorial(to_sympy(node.arg, max_digits))
    if isinstance(node, Func):
        args = [to_sympy(a, max_digits) for a in node.args]
        if node.name == "root":
            return sympy.root(args[0], args[1])
        if node.name == "log":
            return sympy.log(*args)
        return _FUNCS[node.name](*args)
    raise ValueError(f"not a scalar: {type(node).__name__}")


def _small(value: sympy.Basic, scale: sympy.Basic) -> bool | None:
    """|value| below 1e-45 of the scale: True/False; None when it is not a finite number."""
    if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    magnitude = sympy.Abs(sympy.N(scale, 60)) if scale.is_number else sympy.Integer(1)
    if not magnitude.is_number or magnitude.has(sympy.zoo, sympy.nan, sympy.oo):
        magnitude = sympy.Integer(1)
    return bool(sympy.Abs(value) < sympy.Float(10, 60) ** -45 * max(magnitude, sympy.Integer(1)))


def _is_zero(diff: sympy.Expr, scale: sympy.Expr) -> bool:
    """Whether `diff` is zero: 60-digit numerics first, `simplify` only when they cannot tell."""
    if diff == 0:
        return True
    free = sorted(diff.free_symbols, key=str)
    if not free:
        # evalf is adaptive: a nonzero difference comes back with full relative precision
        # (so 10^{-300} is not zero); an exact zero exhausts the precision search.
        try:
            value = diff.evalf(60, strict=True)
        except PrecisionExhausted:
            return True
        if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return sympy.simplify(diff) == 0
        return value == 0
    evaluated = 0
    for k in range(len(_POINTS) + 2):
        subs: dict[sympy.Basic, sympy.Basic] = {
            s: sympy.Float(sympy.Rational(*_point(k + j)), 60) for j, s in enumerate(free)
        }
        verdict = _small(sympy.N(diff.xreplace(subs), 60), scale.xreplace(subs))
        if verdict is False:
            return False
        evaluated += verdict is True
        if evaluated == len(_POINTS):
            return True
    return sympy.simplify(diff) == 0


def _point(k: int) -> tuple[int, int]:
    p = _POINTS[k % len(_POINTS)] + k // len(_POINTS)
    return p.numerator, p.denominator


def symbolic_scalar(max_digits: int) -> Scalar:
    """The worker's scalar comparer: always True or False."""

    def scalar(gold: Node, answer: Node, mode: str) -> bool:
        try:
            g, a = to_sympy(gold, max_digits), to_sympy(answer, max_digits)
        except (ValueError, TypeError, ZeroDivisionError):
            return False
        if mode == "round":
            assert isinstance(gold, Num) and gold.places is not None
            value = sympy.N(a, 60)
            if not value.is_real:
                return False
            approx = Fraction(str(value))
            return round_matches(gold.value, approx, gold.places) or near(
                gold.value, approx, gold.places
            )
        if mode == "long":
            assert isinstance(answer, Num) and answer.places is not None
            value = sympy.N(g, 60)
            if not value.is_real:
                return False
            return near(answer.value, Fraction(str(value)), answer.places)
        if mode == "prop":
            if g == 0 or a == 0:
                return g == a
            free = sorted(g.free_symbols | a.free_symbols, key=str)
            if free:  # the ratio at one point, then g - ratio * a must vanish everywhere
                subs = {s: sympy.Rational(*_point(k + 5)) for k, s in enumerate(free)}
                at_g: Any = g.xreplace(subs)
                at_a: Any = a.xreplace(subs)
                ratio = sympy.nsimplify(at_g / at_a) if at_a != 0 else None
                if ratio is not None and ratio.is_number and ratio.is_finite and ratio != 0:
                    return _is_zero(g - ratio * a, g)
            ratio = sympy.simplify(g / a)
            return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
        if g.has(sympy.oo, -sympy.oo) or a.has(sympy.oo, -sympy.oo):
            return bool(g == a)
        return _is_zero(g - a, g)

    return scalar


def compare_trees(gold: Node, answer: Node, max_digits: int) -> bool:
    """The full judgement with sympy scalars (runs in a worker)."""
    return bool(judge(gold, answer, symbolic_scalar(max_digits)))

"""Decide whether two answer trees are the same answer: structure here, scalars by a callback.

`judge(gold, answer, scalar)` walks the structure (relations, sets, tuples, intervals, unions,
matrices, +-) and asks `scalar(gold, answer, mode)` about pairs of plain expressions. The
callback answers True, False or None (cannot tell); `judge` returns None when any needed answer
was None. The parent process calls it with `exact_scalar` (Fractions only, microseconds); a None
sends the pair to a worker, which calls it again with the sympy comparer of `_symbolic.py`.

Rules (the README's policy section says why):
- `x = 2` equals `2` when the left side is a symbol or a product of symbols only (`f(x) = 2x`,
  `AB = 5`); `x \\in S` equals `S`.
- A one-variable inequality (`x > 2`, `1 < x \\le 3`) is the interval it describes.
- `a \\pm b` is the set {a + b, a - b}.
- Sets (`\\{...\\}`) and bare lists (`2, 3`) are unordered; bracketed tuples are ordered; a
  bracketed pair keeps its brackets, so `[1,2)` differs from `[1,2]` and `(1,2)`.
- A list (also one joined by "or", a hedge) never equals a single value.
- Exact values compare exactly. A gold written with two or more decimal places also accepts an
  exact answer that is not a decimal literal (`1/3`, `\\sqrt2`, `\\pi/4`) when it rounds to the
  gold; a decimal literal answer must equal the gold exactly.
- A written `%` divides by 100; a `%` dropped on one side is also accepted (`50\\%` vs `50`).

Not covered: units conversions, degree/radian conversion, approximate answers to exact golds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from rstar2_verify._budget import check
from rstar2_verify.expr import (
    Add,
    Const,
    Fact,
    Func,
    Matrix,
    Mul,
    Node,
    Num,
    Percent,
    PlusMinus,
    Pow,
    Rel,
    Seq,
    Sym,
    Union,
)

__all__ = [
    "LONG_PLACES",
    "Scalar",
    "TooComplexError",
    "exact_scalar",
    "exact_value",
    "judge",
    "near",
    "round_matches",
]

Scalar = Callable[[Node, Node, str], bool | None]  # mode: "eq", "prop", "round" or "long"


class TooComplexError(ValueError):
    """Evaluating the answer exactly would exceed the digit bound (`10^{10^{10}}`, `10^6!`)."""


def _root(value: int, n: int) -> int | None:
    """The exact integer n-th root of a non-negative int, or None."""
    if value < 2:
        return value
    if n == 2:
        guess = math.isqrt(value)
    elif value.bit_length() < 1000:
        guess = round(math.exp(math.log(value) / n))
    else:  # a float estimate of the top bits (from above), then integer Newton: O(log bits)
        shift = value.bit_length() - 1000
        shift -= shift % n
        estimate = math.exp(math.log(value >> shift) / n) * (1 + 1e-9)
        guess = (int(estimate) + 1) << (shift // n)
        while True:
            check()
            nxt = ((n - 1) * guess + value // guess ** (n - 1)) // n
            if nxt >= guess:
                break
            guess = nxt
    for g in (guess - 1, guess, guess + 1):
        if g >= 0 and g**n == value:
            return g
    return None


def _bounded(value: Fraction, max_digits: int) -> Fraction:
    bits = max(value.numerator.bit_length(), value.denominator.bit_length())
    if bits > 3.33 * max_digits:
        raise TooComplexError(f"a value over {max_digits} digits")
    return value


def exact_value(node: Node, max_digits: int = 20_000) -> Fraction | None:
    """The exact rational value of `node`, None when it is not (or not obviously) rational.

    Raises `TooComplexError` when an intermediate value would pass `max_digits` digits.
    """
    check()
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Add):
        total = Fraction(0)
        for term in node.terms:
            v = exact_value(term, max_digits)
            if v is None:
                return None
            total = _bounded(total + v, max_digits)
        return total
    if isinstance(node, Mul):
        product = Fraction(1)
        for factor, inverse in zip(node.factors, node.inverse, strict=True):
            v = exact_value(factor, max_digits)
            if v is None or (inverse and v == 0):
                return None
            product = _bounded(product / v if inverse else product * v, max_digits)
        return product
    if isinstance(node, Pow):
        return _power(node, max_digits)
    if isinstance(node, Percent):
        v = exact_value(node.arg, max_digits)
        return None if v is None else v / 100
    if isinstance(node, Fact):
        v = exact_value(node.arg, max_digits)
        if v is None or v.denominator != 1 or v < 0:
            return None
        if v > 10**7 or math.lgamma(float(v) + 1) / math.log(10) > max_digits:
            raise TooComplexError("factorial too large")
        return Fraction(math.factorial(int(v)))
    if isinstance(node, Func):
        return _function(node, max_digits)
    return None


def _power(node: Pow, max_digits: int) -> Fraction | None:
    base = exact_value(node.base, max_digits)
    exp = exact_value(node.exp, max_digits)
    if base is None or exp is None:
        if exp is not None and abs(exp) > 10 * max_digits and isinstance(node.base, Num | Const):
            raise TooComplexError("power too large")
        return None
    if exp == 0:
        return Fraction(1)  # including 0^0, as sympy has it
    if base == 0:
        return None if exp < 0 else Fraction(0)
    size = max(abs(base.numerator), base.denominator)
    if size > 1 and (
        abs(exp.numerator).bit_length() > 60 or abs(exp) * math.log10(size) > max_digits
    ):
        raise TooComplexError("power too large")
    if size == 1:  # 1 or -1
        if base == 1:
            return Fraction(1)
        return Fraction(-1) ** exp.numerator if exp.denominator == 1 else None
    p, q = exp.numerator, exp.denominator
    if q != 1:
        if base < 0 or q > 64:
            return None
        num, den = _root(base.numerator, q), _root(base.denominator, q)
        if num is None or den is None:
            return None
        base = Fraction(num, den)
    return _bounded(base**p, max_digits)


def _function(node: Func, max_digits: int) -> Fraction | None:
    args = [exact_value(a, max_digits) for a in node.args]
    if any(a is None for a in args):
        return None
    vals: list[Fraction] = [a for a in args if a is not None]
    if node.name == "sqrt" and vals[0] >= 0:
        num, den = _root(vals[0].numerator, 2), _root(vals[0].denominator, 2)
        return None if num is None or den is None else Fraction(num, den)
    if node.name == "abs":
        return abs(vals[0])
    if node.name == "floor":
        return Fraction(math.floor(vals[0]))
    if node.name == "ceiling":
        return Fraction(math.ceil(vals[0]))
    if node.name == "binom" and all(v.denominator == 1 for v in vals):
        n, k = int(vals[0]), int(vals[1])
        if n > 10 * max_digits:
            raise TooComplexError("binomial too large")
        return Fraction(math.comb(n, k)) if k >= 0 and n >= 0 else None
    return None


LONG_PLACES = 10


def near(expansion: Fraction, value: Fraction, places: int) -> bool:
    """A decimal of `LONG_PLACES` places or more is an expansion of `value` when it is
    within one unit of its last place (rounded or truncated); shorter decimals never are."""
    return places >= LONG_PLACES and abs(expansion - value) < Fraction(1, 10**places)


def round_matches(gold: Fraction, value: Fraction, places: int) -> bool:
    """True when `value` rounded half away from zero to `places` decimals is `gold`."""
    scaled = math.floor(abs(value) * 10**places + Fraction(1, 2))
    return Fraction(-scaled if value < 0 else scaled, 10**places) == gold


def exact_scalar(max_digits: int) -> Scalar:
    """The parent's scalar comparer: exact rationals only, None for anything else."""

    def scalar(gold: Node, answer: Node, mode: str) -> bool | None:
        if mode == "prop":
            return None
        g, a = exact_value(gold, max_digits), exact_value(answer, max_digits)
        if g is None or a is None:
            return None
        if mode == "round":
            assert isinstance(gold, Num) and gold.places is not None
            return g == a or round_matches(g, a, gold.places) or near(g, a, gold.places)
        if mode == "long":
            assert isinstance(answer, Num) and answer.places is not None
            return near(a, g, answer.places)
        return g == a

    return scalar


def _and(results: list[bool | None]) -> bool | None:
    if any(r is False for r in results):
        return False
    return None if any(r is None for r in results) else True


def _has_symbol(node: object) -> bool:
    if isinstance(node, Sym):
        return True
    if isinstance(node, tuple):
        return any(_has_symbol(x) for x in node)
    slots = getattr(type(node), "__slots__", ())
    return any(_has_symbol(getattr(node, s)) for s in slots)


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_OO = Const("oo")


def _negate(node: Node) -> Node:
    return Mul((Num(Fraction(-1)), node), (False, False))


def _variable(node: Node) -> str | None:
    """How an inequality item holds its variable: `x`, `-x` or `|x|`; None for neither."""
    if isinstance(node, Sym):
        return "x"
    if (
        isinstance(node, Mul)
        and len(node.factors) == 2
        and node.factors[0] == Num(Fraction(-1))
        and isinstance(node.factors[1], Sym)
        and not any(node.inverse)
    ):
        return "-x"
    if isinstance(node, Func) and node.name == "abs" and isinstance(node.args[0], Sym):
        return "|x|"
    return None


def _interval(rel: Rel) -> Node | None:
    """`1 < x <= 3` as the interval (1, 3], `-x > -1` as x < 1, `|x| <= 3` as [-3, 3] and
    `|x| > 3` as (-oo, -3) U (3, oo); None when it is not a one-variable inequality."""
    ops = list(rel.ops)
    if not ops or any(op not in _FLIP for op in ops):
        return None
    items = list(rel.items)
    if ops[0] in {">", ">="}:
        if any(op in {"<", "<="} for op in ops):
            return None
        items.reverse()
        ops = [_FLIP[op] for op in reversed(ops)]
    elif any(op in {">", ">="} for op in ops):
        return None
    kinds = [_variable(item) for item in items]
    found = [k for k, kind in enumerate(kinds) if kind is not None]
    if len(found) != 1 or any(_has_symbol(x) for k, x in enumerate(items) if k != found[0]):
        return None
    k = found[0]
    if kinds[k] == "-x":  # -x < 1 is x > -1
        var = items[k].factors[1]  # type: ignore[union-attr]
        items = [var if j == k else _negate(x) for j, x in enumerate(items)][::-1]
        ops = ops[::-1]  # negating flips each op, reversing flips it back
        k = len(items) - 1 - k
    if kinds[found[0]] == "|x|":
        if len(items) != 2:
            return None
        c, closed = items[1 - k], ops[0] == "<="
        if k == 0:  # |x| < c
            return Seq((_negate(c), c), "[" if closed else "(", "]" if closed else ")")
        return Union(
            (
                Seq((_negate(_OO), _negate(c)), "(", "]" if closed else ")"),
                Seq((c, _OO), "[" if closed else "(", ")"),
            )
        )
    if len(items) == 2:
        lo, lo_op, hi, hi_op = (
            (_negate(_OO), "<", items[1], ops[0]) if k == 0 else (items[0], ops[0], _OO, "<")
        )
    elif len(items) == 3 and k == 1:
        lo, lo_op, hi, hi_op = items[0], ops[0], items[2], ops[1]
    else:
        return None
    return Seq((lo, hi), "[" if lo_op == "<=" else "(", "]" if hi_op == "<=" else ")")


def _canon(node: Node) -> Node:
    """Rewrite forms that mean the same thing into one shape (see the module docstring)."""
    if isinstance(node, Rel):
        interval = _interval(node)
        if interval is not None:
            return interval
        if node.ops == ("in",):
            return _canon(node.items[1])
    if isinstance(node, PlusMinus):
        base = node.base if node.base is not None else Num(Fraction(0))
        minus = Mul((Num(Fraction(-1)), node.delta), (False, False))
        return Seq((Add((base, node.delta)), Add((base, minus))), "{", "}")
    if isinstance(node, Seq) and node.left == "{" and len(node.items) > 1:
        unique = tuple(dict.fromkeys(node.items))  # {1, 1, 2} is {1, 2}: written repeats
        if len(unique) < len(node.items):
            return Seq(unique, "{", "}")
    if isinstance(node, Seq) and not node.left:
        solutions = _assignments(node)
        if solutions is not None:
            return solutions
    if isinstance(node, Union) and len(node.parts) == 1:
        return node.parts[0]
    if isinstance(node, Add | Mul):
        return _matrix_arithmetic(node) or node
    return node


def _assignments(node: Seq) -> Seq | None:
    """`x=1, y=2; x=3, y=4` (the same symbols assigned in the same order, twice or more) as
    the solutions `(1, 2), (3, 4)`; None for anything else."""
    items = node.items
    if not all(
        isinstance(r, Rel) and r.ops == ("=",) and isinstance(r.items[0], Sym) for r in items
    ):
        return None
    names = [r.items[0].name for r in items]  # type: ignore[union-attr]
    width = len(dict.fromkeys(names))
    if width < 2 or len(items) % width or len(items) == width:
        return None
    if any(names[k] != names[k % width] for k in range(len(names))):
        return None
    rows = [items[k : k + width] for k in range(0, len(items), width)]
    return Seq(tuple(Seq(tuple(r.items[1] for r in row), "(", ")") for row in rows), "", "")  # type: ignore[union-attr]


def _matrix_arithmetic(node: Add | Mul) -> Matrix | None:
    """`A + B` and `A B` (also `2A`) of written matrices as one matrix of unevaluated entries;
    None when the shapes do not fit or nothing is a matrix (the cost is linear in the entries
    for sums and cubic for products of at most 8x8)."""
    if isinstance(node, Add):
        terms = [t for t in node.terms if isinstance(t, Matrix)]
        shapes = {(len(t.rows), len(t.rows[0])) for t in terms}
        if len(terms) != len(node.terms) or len(shapes) != 1:
            return None
        rows, cols = shapes.pop()
        return Matrix(
            tuple(
                tuple(Add(tuple(t.rows[r][c] for t in terms)) for c in range(cols))
                for r in range(rows)
            )
        )
    if any(node.inverse) or not any(isinstance(f, Matrix) for f in node.factors):
        return None
    scalars = tuple(f for f in node.factors if not isinstance(f, Matrix))
    if any(_has_matrix(f) for f in scalars):
        return None
    product: Matrix | None = None
    for factor in node.factors:
        if not isinstance(factor, Matrix):
            continue
        if product is None:
            product = factor
            continue
        n, m, k = len(product.rows), len(factor.rows), len(factor.rows[0])
        if len(product.rows[0]) != m or max(n, m, k) > 8:
            return None
        product = Matrix(
            tuple(
                tuple(
                    Add(
                        tuple(
                            Mul((product.rows[i][t], factor.rows[t][j]), (False, False))
                            for t in range(m)
                        )
                    )
                    for j in range(k)
                )
                for i in range(n)
            )
        )
    assert product is not None
    if not scalars:
        return product
    return Matrix(
        tuple(
            tuple(Mul((*scalars, e), (False,) * (len(scalars) + 1)) for e in row)
            for row in product.rows
        )
    )


def _has_matrix(node: object) -> bool:
    if isinstance(node, Matrix):
        return True
    if isinstance(node, tuple):
        return any(_has_matrix(x) for x in node)
    return any(_has_matrix(getattr(node, s)) for s in getattr(type(node), "__slots__", ()))


def _is_label(node: Node) -> bool:
    """Symbols only: `x`, `AB`, `f(x)`, `\\frac{AB}{CD}`, a tuple `(a, b)`, a ratio `S_1:S_2`."""
    if isinstance(node, Sym):
        return True
    if isinstance(node, Mul):
        return all(_is_label(f) for f in node.factors)
    if isinstance(node, Seq) and node.left in {"(", ":"} and node.items:
        return all(_is_label(item) for item in node.items)
    return False


def _chain(rel: Rel) -> Rel:
    """`y = 2+3 = 9 = 14` as `y = 14`: a chain of equalities states its first and last items."""
    if len(rel.items) > 2 and all(op == "=" for op in rel.ops):
        return Rel(("=",), (rel.items[0], rel.items[-1]))
    return rel


def _value_of(node: Node) -> Node:
    """`x = 2` (also `f(x) = 2x`, `AB = 5`, `(a, b) = (5, 1)`) as its right side, and a
    numeric equality (`\\sqrt{9} = 3`) as its last value, to compare with a non-relation."""
    if isinstance(node, Rel):
        node = _chain(node)
    if isinstance(node, Rel) and node.ops == ("=",):
        lhs, rhs = node.items
        if _is_label(lhs) or not (_has_symbol(lhs) or _has_symbol(rhs)):
            return rhs
    return node


def _ordered(gold: tuple[Node, ...], answer: tuple[Node, ...], scalar: Scalar) -> bool | None:
    if len(gold) != len(answer):
        return False
    return _and([judge(g, a, scalar) for g, a in zip(gold, answer, strict=True)])


def _unordered(gold: tuple[Node, ...], answer: tuple[Node, ...], scalar: Scalar) -> bool | None:
    if len(gold) != len(answer):
        return False
    unused = list(range(len(answer)))
    unknown = False
    for g in gold:
        found = False
        for k in unused:
            r = judge(g, answer[k], scalar)
            if r:
                unused.remove(k)
                found = True
                break
            unknown |= r is None
        if not found:
            return None if unknown else False
    return True


def _sequence(gold: Seq, answer: Seq, scalar: Scalar) -> bool | None:
    unordered = {gold.left, answer.left} <= {"{", ""}
    if unordered:
        return _unordered(gold.items, answer.items, scalar)
    if gold.left == "{" or answer.left == "{":
        return False  # a set is not a tuple or an interval
    same_brackets = (gold.left, gold.right) == (answer.left, answer.right)
    if gold.left and answer.left and len(gold.items) == 2 and not same_brackets:
        return False  # interval ends (or a point vs an interval)
    return _ordered(gold.items, answer.items, scalar)


def judge(gold: Node, answer: Node, scalar: Scalar) -> bool | None:
    """True/False when `answer` is/is not the same answer as `gold`; None when unsure."""
    check()
    if gold == answer:  # the same tree (`x` and `x`): no scalar needed
        return True
    gold, answer = _canon(gold), _canon(answer)
    if isinstance(gold, Rel) != isinstance(answer, Rel):
        gold, answer = _canon(_value_of(gold)), _canon(_value_of(answer))
    if isinstance(gold, Rel) and isinstance(answer, Rel):
        gold, answer = _chain(gold), _chain(answer)
        if gold.ops == answer.ops and gold.ops != ("=",):
            return _ordered(gold.items, answer.items, scalar)
        if gold.ops == answer.ops == ("=",):
            if _ordered(gold.items, answer.items, scalar) is True:
                return True
            return scalar(_difference(gold), _difference(answer), "prop")
        return False
    if isinstance(gold, Seq) and isinstance(answer, Seq):
        return _sequence(gold, answer, scalar)
    if isinstance(gold, Union) and isinstance(answer, Union):
        return _unordered(gold.parts, answer.parts, scalar)
    if isinstance(gold, Matrix) or isinstance(answer, Matrix):
        return _matrix(gold, answer, scalar)
    if any(isinstance(x, Seq | Union | Rel) for x in (gold, answer)):
        return False
    return _scalar(gold, answer, scalar)


def _difference(rel: Rel) -> Node:
    minus = Mul((Num(Fraction(-1)), rel.items[1]), (False, False))
    return Add((rel.items[0], minus))


def _matrix(gold: Node, answer: Node, scalar: Scalar) -> bool | None:
    def cells(node: Node) -> tuple[tuple[int, int], tuple[Node, ...]] | None:
        if isinstance(node, Matrix):
            return (len(node.rows), len(node.rows[0])), tuple(c for r in node.rows for c in r)
        if isinstance(node, Seq) and node.left in {"(", "["} and len(node.items) > 2:
            return (len(node.items), 1), node.items
        return None

    g, a = cells(gold), cells(answer)
    if g is None or a is None:
        return False
    if g[0] != a[0] and not (1 in g[0] and 1 in a[0]):
        return False  # a column vector may be written as a row tuple
    return _ordered(g[1], a[1], scalar)


def _scalar(gold: Node, answer: Node, scalar: Scalar) -> bool | None:
    long_answer = isinstance(answer, Num) and (answer.places or 0) >= LONG_PLACES
    if long_answer and not (isinstance(gold, Num) and gold.places is not None):
        return scalar(gold, answer, "long")  # 0.0833333333333333 for 1/12
    dropped: bool | None = False
    if isinstance(gold, Percent) or isinstance(answer, Percent):
        bare_g = gold.arg if isinstance(gold, Percent) else gold
        bare_a = answer.arg if isinstance(answer, Percent) else answer
        # the side without `%` must be a number as percentages are written (50, 12.5), not
        # `40/9`, which is a quantity: `4\frac49\%` is 4/90, never 40/9
        both = isinstance(gold, Percent) and isinstance(answer, Percent)
        plain = both or isinstance(gold if bare_g is gold else answer, Num)
        dropped = scalar(bare_g, bare_a, "eq") if plain else False
        if dropped:
            return True
    written = gold
    if isinstance(gold, Percent) and isinstance(gold.arg, Num) and gold.arg.places is not None:
        written = Num(gold.arg.value / 100, gold.arg.places + 2)  # 16.67% is 0.1667
    if isinstance(written, Num) and written.places is not None and written.places >= 2:
        if isinstance(answer, Num | Percent):  # a decimal literal must be exact
            same = scalar(gold, answer, "eq")
        else:
            same = scalar(written, answer, "round")
    else:
        same = scalar(gold, answer, "eq")
    if same is False and dropped is None:
        return None
    return same

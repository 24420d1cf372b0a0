"""Parse a normalised answer (LaTeX or plain maths) into an answer tree, without evaluating it.

A hand-written tokenizer and recursive-descent parser; no `eval`, no `sympy.parse_expr`, no
ANTLR. Grammar, loosest first:

    list    := rel ((',' | ';' | 'or' | 'and') rel)*          several items: Seq with no brackets
    rel     := ratio (relop ratio)*                          = \\ne < \\le > \\ge \\in
    ratio   := union (':' union)*                            3:8, a Seq with ":" brackets
    union   := pm ('\\cup' pm)*
    pm      := ['\\pm'] sum ['\\pm' sum]
    sum     := term (('+' | '-') term)*
    term    := unary (('*' | '/' | '\\cdot' | '\\times' | '\\div' | juxtaposition) unary)*
    unary   := ('-' | '+') unary | power
    power   := postfix ['^' unary-or-group]
    postfix := atom ('!' | '%')*
    atom    := number | letter[_sub] | \\pi | e | i | \\infty | (...) | [...] | \\{...\\} | {...}
             | \\frac | \\sqrt[n] | \\binom | function | |x| | \\lfloor x \\rfloor | matrix

Juxtaposition of two plain numbers ("2 3") is an error, not a product. A group `{a, b}` or `\\{a, b\\}`
is a set. Brackets are kept so the comparer can tell `[1,2)` from `[1,2]`. Inputs deeper than
`max_depth` raise `ParseError` before recursion can get deep.
"""

from __future__ import annotations

import re
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

__all__ = ["ParseError", "nesting_depth", "parse"]


class ParseError(ValueError):
    """The text is not an answer this parser understands."""


_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.?\d*|\.\d+)|(?P<env>\\(?:begin|end)\{[a-zA-Z*]+\})|(?P<cmd>\\[a-zA-Z]+|\\[{}|]|\\\\)|(?P<word>[a-zA-Z]+)"
    r"|(?P<op><=|>=|!=|[-+*/^_!=<>,;|&%'(){}\[\]:]))"
)
_FUNCS = {
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh",
    "tanh", "ln", "log", "exp", "gcd", "lcm", "max", "min", "det",
}  # fmt: skip
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "vartheta", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "phi", "varphi", "chi",
    "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Sigma", "Phi", "Psi", "Omega",
}  # fmt: skip
_RELOPS = {
    "=": "=", "\\ne": "!=", "\\neq": "!=", "!=": "!=", "<": "<", "\\lt": "<", ">": ">",
    "\\gt": ">", "\\le": "<=", "\\leq": "<=", "\\leqslant": "<=", "<=": "<=", "\\ge": ">=",
    "\\geq": ">=", "\\geqslant": ">=", ">=": ">=", "\\in": "in",
}  # fmt: skip
_MULOPS = {"*": False, "\\cdot": False, "\\times": False, "/": True, "\\div": True}
_CLOSE = {"(": ")", "[": "]", "{": "}", "\\{": "\\}", "|": "|"}
_MATRIX_ENVS = {"pmatrix", "bmatrix", "Bmatrix", "vmatrix", "matrix", "array", "smallmatrix"}


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting in `text`, counted in one linear pass."""
    depth = best = 0
    for c in text:
        if c in "({[":
            depth += 1
            best = max(best, depth)
        elif c in ")}]":
            depth -= 1
    return best


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos, n = 0, len(text)
    while pos < n:
        if len(tokens) & 255 == 0:
            check()
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ParseError(f"unexpected character {text[pos]!r}")
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        value = m.group(kind)
        if kind == "word":
            low = value.lower()
            if low in _FUNCS or low in {"or", "and", "pi", "sqrt", "infinity", "inf", "oo"}:
                tokens.append(("word", low))
            elif len(value) > 2 and not (value.isupper() and len(value) <= 4):
                raise ParseError(f"text {value!r} is not maths")  # ABC, ABCD: point names
            else:
                tokens.extend(("letter", c) for c in value)
        else:
            tokens.append((kind, value))
    tokens.append(("end", ""))
    return tokens


def _neg(node: Node) -> Node:
    if isinstance(node, Num):
        return Num(-node.value, node.places)
    return Mul((Num(Fraction(-1)), node), (False, False))


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i]

    def next(self) -> tuple[str, str]:
        check()
        tok = self.tokens[self.i]
        if tok[0] != "end":  # the end token is never consumed
            self.i += 1
        return tok

    def accept(self, value: str) -> bool:
        if self.tokens[self.i][1] == value and self.tokens[self.i][0] != "end":
            self.i += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.accept(value):
            raise ParseError(f"expected {value!r}, found {self.peek()[1]!r}")

    # list, rel, union, pm, sum, term, unary, power, postfix, atom

    def list_(self) -> Node:
        items = [self.rel()]
        while self.peek()[1] in {",", ";", "or", "and"} and self.peek()[0] != "end":
            if self.next()[1] in {",", ";"} and self.peek()[1] in {"or", "and"}:
                self.next()  # "19, 46, and 82"
            items.append(self.rel())
        return items[0] if len(items) == 1 else Seq(tuple(items), "", "")

    def rel(self) -> Node:
        items, ops = [self.ratio()], []
        while (op := _RELOPS.get(self.peek()[1])) is not None:
            self.next()
            ops.append(op)
            items.append(self.ratio())
        return Rel(tuple(ops), tuple(items)) if ops else items[0]

    def ratio(self) -> Node:
        """`3:8` (also `S_1:S_2`): an ordered Seq with ":" brackets."""
        items = [self.union()]
        while self.accept(":"):
            items.append(self.union())
        return Seq(tuple(items), ":", ":") if len(items) > 1 else items[0]

    def union(self) -> Node:
        parts = [self.pm()]
        while self.accept("\\cup"):
            parts.append(self.pm())
        return Union(tuple(parts)) if len(parts) > 1 else parts[0]

    def pm(self) -> Node:
        if self.peek()[1] in {"\\pm", "\\mp"}:
            self.next()
            return PlusMinus(None, self.sum_())
        base = self.sum_()
        if self.peek()[1] in {"\\pm", "\\mp"}:
            self.next()
            return PlusMinus(base, self.sum_())
        return base

    def sum_(self) -> Node:
        terms = [self.term()]
        while self.peek()[1] in {"+", "-"}:
            sign = self.next()[1]
            t = self.term()
            terms.append(_neg(t) if sign == "-" else t)
        return Add(tuple(terms)) if len(terms) > 1 else terms[0]

    def term(self) -> Node:
        factors, inverse = [self.unary()], [False]
        while True:
            kind, value = self.peek()
            if value in _MULOPS and kind != "end":
                self.next()
                factors.append(self.unary())
                inverse.append(_MULOPS[value])
            elif self._starts_atom(kind, value):
                if kind == "num" and isinstance(factors[-1], Num):
                    raise ParseError("two numbers side by side")
                factors.append(self.power())
                inverse.append(False)
            else:
                break
        return Mul(tuple(factors), tuple(inverse)) if len(factors) > 1 else factors[0]

    @staticmethod
    def _starts_atom(kind: str, value: str) -> bool:
        if kind in {"num", "letter"}:
            return True
        if kind == "env":
            return value.startswith("\\begin")
        if kind == "word":
            return value not in {"or", "and"}
        if kind == "cmd":
            return value in {"\\frac", "\\sqrt", "\\pi", "\\infty", "\\binom", "\\dbinom",
                             "\\lfloor", "\\lceil", "\\mathbb", "\\{", "\\lvert",
                             "\\vert", "\\exp"} or value[1:] in _FUNCS or value[1:] in _GREEK  # fmt: skip
        return value in {"(", "["}

    def unary(self) -> Node:
        if self.accept("-"):
            return _neg(self.unary())
        if self.accept("+"):
            return self.unary()
        return self.power()

    def power(self) -> Node:
        base = self.postfix()
        if self.accept("^"):
            if self.peek()[1] == "{":
                self.next()
                exp = self.list_()
                self.expect("}")
            else:
                exp = self.unary()
            node: Node = Pow(base, exp)
            while self.peek()[1] in {"!", "%"}:  # (2^3)! is written 2^3! rarely; keep order
                node = Fact(node) if self.next()[1] == "!" else Percent(node)
            return node
        return base

    def postfix(self) -> Node:
        node = self.atom()
        while self.peek()[1] in {"!", "%", "'"}:
            op = self.next()[1]
            if op == "!":
                node = Fact(node)
            elif op == "%":
                node = Percent(node)
        return node

    def group(self) -> Node:
        """A `{...}` argument of a command."""
        if self.accept("{"):
            node = self.list_()
            self.expect("}")
            return node
        kind, value = self.peek()
        if kind == "num" and value.isdigit():  # \frac12 is \frac{1}{2}: one character
            if len(value) > 1:
                self.tokens.insert(self.i + 1, ("num", value[1:]))
            self.next()
            return Num(Fraction(int(value[0])))
        if kind == "letter":
            self.next()
            return Sym(value)
        return self.atom()

    def atom(self) -> Node:
        kind, value = self.next()
        if kind == "num":
            if "." in value:
                whole, _, frac = value.partition(".")
                exact = Fraction(_int(whole + frac or "0"), 10 ** len(frac))
                return Num(exact, len(frac) if frac else None)
            return Num(Fraction(_int(value)))
        if kind == "letter":
            name = value
            if self.accept("_"):
                sub = self.group()
                name = f"{value}_{_key(sub)}"
            if name == "e":
                return Const("e")
            if name == "i":
                return Const("i")
            return Sym(name)
        if kind == "word":
            if value in {"or", "and"}:
                raise ParseError(f"unexpected {value!r}")
            if value in {"pi"}:
                return Const("pi")
            if value in {"infinity", "inf", "oo"}:
                return Const("oo")
            return self.function(value)
        if value in {"(", "["}:
            return self.bracket(value)
        if value in {"{", "\\{"}:
            close = _CLOSE[value]
            if self.accept(close):
                return Seq((), "{", "}")
            node = self.list_()
            self.expect(close)
            if value == "\\{" or isinstance(node, Seq):
                items = node.items if isinstance(node, Seq) and not node.left else (node,)
                return Seq(items, "{", "}")
            return node
        if value in {"|", "\\lvert", "\\vert"}:
            node = self.sum_()
            if not (self.accept("|") or self.accept("\\rvert") or self.accept("\\vert")):
                raise ParseError("unclosed |")
            return Func("abs", (node,))
        if kind == "cmd":
            return self.command(value)
        if kind == "env" and value.startswith("\\begin"):
            return self.matrix(value[len("\\begin{") : -1])
        raise ParseError(f"unexpected {value!r}" if value else "unexpected end")

    def bracket(self, left: str) -> Node:
        if self.peek()[1] in {")", "]"}:
            return Seq((), left, self.next()[1])
        node = self.list_()
        right = self.next()[1]
        if right not in {")", "]"}:
            raise ParseError(f"unclosed {left!r}")
        if isinstance(node, Seq) and not node.left:
            return Seq(node.items, left, right)
        if (left == "(" and right == ")") or (left + right == "[]" and isinstance(node, Matrix)):
            return node  # `\left[\begin{array}...\end{array}\right]` is that matrix
        return Seq((node,), left, right)

    def function(self, name: str) -> Node:
        if name == "sqrt":
            return self.command("\\sqrt")
        if name == "log" and self.accept("_"):
            base = self.group()
            return Func("log", (self._fn_arg(), base))
        power: Node | None = None
        if self.accept("^"):  # \sin^2 x
            power = self.group()
        node = Func(name, (self._fn_arg(),))
        return Pow(node, power) if power is not None else node

    def _fn_arg(self) -> Node:
        """`\\sin(x)`, or without brackets a juxtaposed product: `\\sin 2x` is sin(2x)."""
        if self.peek()[1] == "(":
            self.next()
            node = self.list_()
            self.expect(")")
            if isinstance(node, Seq):
                raise ParseError("several arguments")
            return node
        factors = [self.power()]
        while self.peek()[0] == "letter" or self.peek()[1] in {"\\pi", "pi"}:
            factors.append(self.power())
        return factors[0] if len(factors) == 1 else Mul(tuple(factors), (False,) * len(factors))

    def command(self, cmd: str) -> Node:
        name = cmd[1:]
        if name == "frac":
            num = self.group()
            den = self.group()
            return Mul((num, den), (False, True))
        if name in {"binom", "dbinom", "tbinom"}:
            return Func("binom", (self.group(), self.group()))
        if name == "sqrt":
            index: Node | None = None
            if self.accept("["):
                index = self.sum_()
                self.expect("]")
            arg = self.group()
            return Func("root", (arg, index)) if index is not None else Func("sqrt", (arg,))
        if name == "pi":
            return Const("pi")
        if name == "infty":
            return Const("oo")
        if name == "emptyset":
            return Seq((), "{", "}")
        if name in {"lfloor", "lceil"}:
            node = self.sum_()
            self.expect("\\rfloor" if name == "lfloor" else "\\rceil")
            return Func("floor" if name == "lfloor" else "ceiling", (node,))
        if name == "mathbb":
            self.expect("{")
            _kind, letter = self.next()
            self.expect("}")
            if letter == "R":
                return Seq((_neg(Const("oo")), Const("oo")), "(", ")")
            return Sym(f"set_{letter}")

        if name in _GREEK:
            return Sym(name)
        if name in _FUNCS:
            return self.function(name)
        raise ParseError(f"unsupported command {cmd}")

    def matrix(self, env: str) -> Node:
        if env not in _MATRIX_ENVS:
            raise ParseError(f"unsupported environment {env}")
        if env == "array" and self.accept("{"):  # column spec
            while not self.accept("}"):
                if self.next()[0] == "end":
                    raise ParseError("unclosed array spec")
        rows: list[tuple[Node, ...]] = []
        row: list[Node] = []
        while True:
            if self.peek()[0] == "env":
                if self.next()[1] != f"\\end{{{env}}}":
                    raise ParseError(f"unclosed {env}")
                break
            row.append(self.sum_())
            sep = self.peek()[1]
            if sep == "\\\\":
                self.next()
                rows.append(tuple(row))
                row = []
            elif sep == "&":
                self.next()
            elif self.peek()[0] != "env":
                raise ParseError("bad matrix")
        if row:
            rows.append(tuple(row))
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return Matrix(tuple(rows))


def _int(digits: str) -> int:
    """int() of a digit string of any length (Python refuses over 4300 digits in one call)."""
    if len(digits) <= 4000:
        return int(digits)
    value = 0
    for k in range(0, len(digits), 4000):
        chunk = digits[k : k + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def _key(node: Node) -> str:
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Sym):
        return node.name
    return repr(node)


def parse(text: str, max_depth: int = 64) -> Node:
    """The answer tree of a normalised answer; `ParseError` when it is not maths we read."""
    if not text.strip():
        raise ParseError("empty answer")
    if nesting_depth(text) > max_depth:
        raise ParseError("nested too deeply")
    parser = _Parser(_tokenize(text))
    try:
        node = parser.list_()
    except RecursionError:
        raise ParseError("nested too deeply") from None
    if parser.peek()[0] != "end":
        raise ParseError(f"unexpected {parser.peek()[1]!r}")
    return node

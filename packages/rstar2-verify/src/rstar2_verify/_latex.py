"""Normalise an answer string: remove LaTeX noise, units and unicode variants, keep the maths.

`normalize(s)` returns a compact string that the parser reads and that the cheap string match
compares. It removes sizing (`\\left`, `\\big`), spacing (`\\,`, `\\!`, `\\quad`), `\\text{}`
wrappers, trailing unit words, degree marks, dollar signs, thousands separators and trailing
punctuation, maps unicode maths (½, √, −, ×, π, ∞, ≤, ², ∅) to LaTeX, turns repeating decimals
(`0.1\\overline{6}`, `0.\\dot{3}`, `0.333...`) into exact fractions, and keeps a written `%`.

It does not decide anything about equality and never evaluates anything.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["UNIT_WORDS", "modulus", "normalize", "repeating_to_fraction"]

_UNICODE = {
    "−": "-", "–": "-", "—": "-", "×": "\\times ", "·": "\\cdot ", "⋅": "\\cdot ", "÷": "\\div ",
    "π": "\\pi ", "∞": "\\infty ", "≤": "\\le ", "≥": "\\ge ", "≠": "\\ne ", "±": "\\pm ",
    "∓": "\\mp ", "∪": "\\cup ", "∩": "\\cap ", "∈": "\\in ", "∅": "\\emptyset ", "√": "\\sqrt",
    "∛": "\\sqrt[3]", "°": "\\circ ", "⁰": "^0", "¹": "^1", "²": "^2", "³": "^3", "⁴": "^4",
    "⁵": "^5", "⁶": "^6", "⁷": "^7", "⁸": "^8", "⁹": "^9", "⁻": "^-", "½": "\\frac{1}{2}",
    "⅓": "\\frac{1}{3}", "⅔": "\\frac{2}{3}", "¼": "\\frac{1}{4}", "¾": "\\frac{3}{4}", "⅕": "\\frac{1}{5}", "⅖": "\\frac{2}{5}",
    "⅗": "\\frac{3}{5}", "⅘": "\\frac{4}{5}", "⅙": "\\frac{1}{6}", "⅚": "\\frac{5}{6}", "⅛": "\\frac{1}{8}", "⅜": "\\frac{3}{8}",
    "⅝": "\\frac{5}{8}", "⅞": "\\frac{7}{8}", "\u2009": " ", "\u00a0": " ", "\u202f": " ", "，": ",",
    "（": "(", "）": ")", "：": ":", "≈": "\\approx ", "≡": "\\equiv ", "€": "", "£": "", "¥": "", "α": "\\alpha ", "β": "\\beta ", "θ": "\\theta ",
}  # fmt: skip
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))

# Words removed when they trail a quantity (or sit inside \text{}); never single letters
# written without a space, which may be variables.
UNIT_WORDS = frozenset(
    [
        "cm",
        "m",
        "mm",
        "km",
        "kg",
        "g",
        "mg",
        "s",
        "sec",
        "secs",
        "second",
        "seconds",
        "min",
        "mins",
        "minute",
        "minutes",
        "h",
        "hr",
        "hrs",
        "hour",
        "hours",
        "day",
        "days",
        "week",
        "weeks",
        "month",
        "months",
        "year",
        "years",
        "ft",
        "feet",
        "foot",
        "in",
        "inch",
        "inches",
        "yd",
        "yard",
        "yards",
        "mi",
        "mile",
        "miles",
        "mph",
        "kmh",
        "l",
        "ml",
        "liter",
        "liters",
        "litre",
        "litres",
        "dollar",
        "dollars",
        "cent",
        "cents",
        "units",
        "unit",
        "sq",
        "square",
        "cubic",
        "meter",
        "meters",
        "metre",
        "metres",
        "centimeter",
        "centimeters",
        "kilometer",
        "kilometers",
        "gram",
        "grams",
        "kilogram",
        "kilograms",
        "degree",
        "degrees",
        "deg",
        "radians",
        "rad",
        "people",
        "students",
        "ways",
        "times",
        "points",
        "pounds",
        "lb",
        "lbs",
        "oz",
        "ounces",
        "gallons",
        "gallon",
        "cups",
        "cup",
        "percent",
    ]
)
_SIZING = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|Biggl|Biggr|big|Big|bigg|Bigg)(?![a-zA-Z])\.?"
)
_TEXT_CMD = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname|textnormal)\s*\{([^{}]*)\}"
)
_THOUSANDS_LATEX = re.compile(
    r"(?<=\d)(?:\\,|\{,\}|\\;|\\:|\\ |~|\\!|\\thinspace|'|\s)(?=\d{3}(?!\d))"
)
_THOUSANDS_COMMA = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SPACING = re.compile(
    r"(?<!\\)\\[,;:! ]|\\q?quad(?![a-zA-Z])|~|\\displaystyle|\\textstyle|\\limits"
)
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree")
_OVERLINE = re.compile(r"(?<!\d)(\d*)\.(\d*)\\(?:overline|bar|dot)\s*\{?(\d+)\}?")
_ELLIPSIS = re.compile(r"(?<!\d)(\d*)\.(\d+)(?:\\ldots|\\cdots|\\dots|\.\.\.|…)")
_UNIT_TAIL = re.compile(r"(?<=[\d}).])((?:\s+[a-zA-Z]+(?:\s*\^?\{?[23]\}?)?)+)\s*$")
# 3\frac{1}{2} (or 3\frac12, or 3½) is the mixed number 3 + 1/2, not 3 * 1/2
_MIXED = re.compile(r"(?<![\w.^_{}\\])(-?)(\d+)\s*\\frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))")
_PERCENT_WORD = re.compile(
    r"\s*(?:\\text\s*\{\s*(?:percent|percentage|pct)\s*\}|\b(?:percent|percentage|pct)\b)",
    re.IGNORECASE,
)
# 4 4/9 (a space, digits, a slash) is the mixed number 4 + 4/9; 11/10 4/9 or 11.0 4/9 is not
_MIXED_PLAIN = re.compile(r"(?<![\w.)/^_}])([-+]?)(\d+) +(\d+)/(\d+)(?![\d./])")
# 14{,}916, 14 {, }916 and 11,\! 111 are thousands separators
_THOUSANDS_GROUP = re.compile(r"(?<=\d)(?:\s*\{\s*,\s*\}\s*|,\\!\s*)(?=\d{3}(?!\d))")
_APPROX = re.compile(r"\\approx(?![a-zA-Z])")
_LABEL = re.compile(r"\s*[a-zA-Z](?:_\{?\w+\}?)?\s*")
# A trailing \text{words} after a quantity is a unit or a noun ("12\text{ apples}").
_TEXT_TAIL = re.compile(
    r"(?<=[\d}).])\s*\\(?:text|mbox|mathrm|textrm|textnormal)\s*\{\s*[a-zA-Z][a-zA-Z .]*\}"
    r"(?:\s*\^\s*\{?[23]\}?)?\s*$"
)


def repeating_to_fraction(whole: str, fixed: str, period: str) -> Fraction:
    """The exact value of `whole.fixed(period)(period)...`."""
    base = Fraction(int(whole or "0"))
    head = Fraction(int(fixed), 10 ** len(fixed)) if fixed else Fraction(0)
    tail = Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    return base + head + tail


def _overline(match: re.Match[str]) -> str:
    value = repeating_to_fraction(match.group(1), match.group(2), match.group(3))
    return f"({value.numerator}/{value.denominator})"


def _ellipsis(match: re.Match[str]) -> str:
    whole, digits = match.group(1), match.group(2)
    for period in range(1, len(digits) // 2 + 1):
        if digits.endswith(digits[-period:] * 2):
            fixed = digits[: len(digits) - 2 * period]
            while fixed.endswith(digits[-period:]):  # 0.3333... has fixed ""
                fixed = fixed[:-period]
            value = repeating_to_fraction(whole, fixed, digits[-period:])
            return f"({value.numerator}/{value.denominator})"
    return match.group(0)[: len(whole) + 1 + len(digits)]


def _mixed(match: re.Match[str]) -> str:
    sign, whole = match.group(1), match.group(2)
    num, den = match.group(3) or match.group(4), match.group(5) or match.group(6)
    return f"{sign}({whole}+{num}/{den})"


def _strip_outer(s: str) -> str:
    while True:
        t = s.strip().rstrip(".").strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if t.startswith(left) and t.endswith(right) and len(t) >= len(left) + len(right):
                t = t[len(left) : len(t) - len(right)]
                break
        if t == s:
            return t
        s = t


def _approx(s: str) -> str:
    """`x \\approx 11` is `x = 11`; anything else ends at its first `\\approx`."""
    parts = _APPROX.split(s)
    if len(parts) == 1 or not parts[0].strip():
        return s
    if _LABEL.fullmatch(parts[0]):
        return f"{parts[0]}={parts[1]}"
    return parts[0]


def _mixed_plain(match: re.Match[str]) -> str:
    sign, whole, num, den = match.groups()
    return f"{'-' if sign == '-' else ''}({whole}+{num}/{den})"


_TRIG_DEGREES = re.compile(
    r"\\(sin|cos|tan|sec|csc|cot)\s*(\()?\s*(\d+(?:\.\d+)?)\s*\^\s*\{?\s*\\circ\s*\}?\s*(?(2)\))"
)
# 101_2, 1A_{16}: a numeral (a digit first) with a base subscript, read as its value
_BASE = re.compile(r"(?<![\w.])(\d[0-9A-Z]*)_\{?(\d{1,2})\}?(?![\w.])")
_LIMIT = re.compile(r"^\s*\\lim_\{[^{}]*\}[^=]*=")  # \lim_{x \to 0} f(x) = 2 states 2
# A residue: `x \equiv 3 \pmod{7}`, `3 \pmod 7`, `x \equiv 3 (\mathrm{mod}\ 7)`, `x \equiv 3
# \bmod 7`, read as its value (`x = 3`, `3`); `modulus` gives the 7, which the grader compares
# apart. A bare `\bmod` / `\mod` counts only after an `\equiv` (else it is the operator).
_MOD_WORD = r"(?:\\(?:mathrm|text|operatorname|textrm)\s*\{\s*mod\s*\}|\\b?mod(?![a-zA-Z])|mod)"
_MODULUS = re.compile(
    r"\s*(?:\\pmod\s*(?:\{([^{}]+)\}|(\w+))"
    r"|\(\s*" + _MOD_WORD + r"\s*(?:\\[ ,;:]|~)?\s*([^()]+?)\s*\)"
    r"|(?<=\S)\s*\\b?mod(?![a-zA-Z])\s*(?:\{([^{}]+)\}|(\w+)))\s*[.,;]?\s*$"
)


def modulus(s: str) -> str | None:
    """The modulus a residue answer states (`x \\equiv 3 \\pmod{7}`: "7"), else None."""
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], s)
    match = _MODULUS.search(s)
    if match is None:
        return None
    bare = match.group(4) is not None or match.group(5) is not None
    if bare and "\\equiv" not in s[: match.start()]:  # a bare \bmod counts after \equiv only
        return None
    found = next(g for g in match.groups() if g is not None)
    return re.sub(r"\s+|\\[ ,;:!]", "", found)


def _residue(s: str) -> str:
    if modulus(s) is None:
        return s
    return _MODULUS.sub("", s, count=1).replace("\\equiv", "=")


_INVERSE = re.compile(r"(?<![a-zA-Z\\])([a-zA-Z])\^\{?-1\}?(?=\s*\()")  # f^{-1}(x): a name


def _trig_degrees(match: re.Match[str]) -> str:
    """`\\sin 30^\\circ` is sin(30 pi/180): degrees are dropped elsewhere, not inside trig."""
    name, _, value = match.groups()
    return f"\\{name}({value}\\pi/180)"


def _base(match: re.Match[str]) -> str:
    digits, base = match.group(1), int(match.group(2))
    if not 2 <= base <= 36:
        return match.group(0)
    try:
        return str(int(digits, base))
    except ValueError:
        return match.group(0)  # a digit out of range: left as written


def normalize(s: str) -> str:
    """The answer with LaTeX noise removed; see the module docstring."""
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], s)
    s = _TRIG_DEGREES.sub(_trig_degrees, s)
    s = _BASE.sub(_base, s)
    s = _LIMIT.sub("L =", s)
    s = _residue(s)
    s = _INVERSE.sub(r"\1_{-1}", s)
    s = _approx(s)
    s = _THOUSANDS_GROUP.sub("", s)
    s = re.sub(r"(?<!\\)\\\s*$", "", s).replace("**", "^")
    s = re.sub(r"(?<=\d)_\{(\d+)\}", r"_\1", s)
    s = _ELLIPSIS.sub(_ellipsis, s)
    s = _strip_outer(s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "%").replace("\\!", "")
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = _SIZING.sub("", s)
    s = re.sub(r"\\(?:measuredangle|angle)(?![a-zA-Z])", " ", s)
    s = _DEGREE.sub("", s)
    s = _PERCENT_WORD.sub("%", s)
    s = _TEXT_TAIL.sub("", s)
    for _ in range(4):  # \text{\textbf{...}}
        s = _TEXT_CMD.sub(lambda m: f" {m.group(1)} ", s)
    s = _THOUSANDS_LATEX.sub("", s)
    s = _SPACING.sub(" ", s)
    s = s.replace("{,}", ",")
    s = _OVERLINE.sub(_overline, s)
    s = re.sub(r"\\(?:emptyset|varnothing)|\\\{\s*\\\}", "\\\\emptyset", s)
    s = _PERCENT_WORD.sub("%", s)
    s = _MIXED.sub(_mixed, s)
    s = _THOUSANDS_LATEX.sub("", s)
    s = _MIXED_PLAIN.sub(_mixed_plain, s)
    s = " ".join(s.split())
    tail = _UNIT_TAIL.search(s)
    if tail is not None and tail.start() > 0:
        words = re.findall(r"[a-zA-Z]+", tail.group(1))
        if all(len(w) > 1 and w.lower() in UNIT_WORDS for w in words):  # `2 h` may be 2h
            s = s[: tail.start()].rstrip()
    s = s.strip().rstrip(".").strip()
    if _THOUSANDS_COMMA.match(s):
        s = s.replace(",", "")
    return s

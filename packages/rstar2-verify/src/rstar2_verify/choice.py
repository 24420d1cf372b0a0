"""Multiple-choice answers (GPQA and the like): the chosen letter, read and compared as a letter.

A choice is an answer kind of its own: `grade_choice(response, gold)` never parses a number or an
expression, so `\\boxed{4}` is no answer to a question whose options are lettered, and `C` never
equals `3`. The letter is read, first that yields:

1. `answer_box`: the last box (`\\boxed{}`, `\\fbox{}`) in the last `<answer>` block;
2. `boxed`: the last box outside thinking and tool blocks (`<think>`, `<reason>`, `<tool_call>`,
   `<tool_response>`), as `extract.py` finds it;
3. `answer_tag`: the `<answer>` block's own answer line, or its whole text when that is a letter;
4. `final_answer_line`: the last "Answer: X" / "the answer is (X)" / "final answer: **X**" /
   "correct option is X" line outside thinking;
5. `raw`: the whole visible text, when it is nothing but a letter ("C", "(C)").

Inside a box, or as the whole text, a lone letter counts in either case (`\\boxed{c}`); in an
answer line only a capital does ("the answer is a ..." is prose). A letter may be wrapped
(`(C)`, `**C**`, `$C$`, `\\text{C}`, `\\textbf{(C)}`), followed by its option's text ("(C) 42 eV")
or named ("Option C", "choice (C)"). Two letters ("C or D", "A, B") are a hedge, not an answer.
The letters allowed are the first `choices` capitals (4: A-D); any other letter is no answer.

Not covered: mapping an option's text back to its letter (a box holding "42 eV" has no letter),
and questions with several right letters.
"""

from __future__ import annotations

import re
import time
from string import ascii_uppercase

from rstar2_verify._prose import clean
from rstar2_verify.extract import Extraction, _strip_hidden, find_boxes
from rstar2_verify.grader import Grade

__all__ = ["extract_choice", "grade_choice", "letter_of"]

MAX_CHOICE_RESPONSE_CHARS = 2_000_000  # as VerifyConfig.max_response_chars
_WRAPPERS = re.compile(r"^(?:\\(?:text|textbf|mathrm|mathbf|mathit|textit|bf)\s*\{(.*)\}|\*\*(.*)\*\*"
                       r"|\$(.*)\$|\\\((.*)\\\))$", re.DOTALL)  # fmt: skip
_NAMED = re.compile(r"^(?:option|choice|letter|answer)\s*:?\s*", re.IGNORECASE)
_LETTER = re.compile(r"^([(\[]?)\s*([A-Za-z])\s*([)\]]?)(?=$|[\s.,:;$}]|\*)")
_HEDGE = re.compile(r"^\s*(?:,|/|\bor\b|\band\b|&)\s*[(\[]?\s*([A-Za-z])(?![a-zA-Z])")
_ANSWER_LINE = re.compile(
    r"(?:final\s+answer|correct\s+(?:answer|option|choice)|the\s+answer|answer|option|choice)"
    r"\s*(?:is|:|=)\s*(?:option\s+|choice\s+|letter\s+)?(?P<rest>[^\n]*)",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^(?:\s|\*|\$|\\boxed\{|\\text\{|\\textbf\{|:"
    r"|(?:for\s+sure|definitely|clearly|certainly|indeed)\b,?)+",
    re.IGNORECASE,
)


def _allowed(choices: int) -> str:
    return ascii_uppercase[: max(1, min(choices, 26))]


def _unwrap(text: str) -> str:
    text = text.strip()
    for _ in range(4):  # `\textbf{(C)}`, `**$C$**`: a bounded number of layers
        m = _WRAPPERS.match(text)
        if m is None:
            break
        text = next(g for g in m.groups() if g is not None).strip()
    return text


def letter_of(content: str, choices: int = 4, *, any_case: bool = True) -> str | None:
    """The letter `content` names ("C", "(c)", "\\text{C}", "(C) 42 eV", "Option C"), or None
    (no letter, a letter out of range, or two letters).

    `any_case` (a box, a whole text): a lone letter may be small, and text may follow it only
    after a bracket, a dot or a colon ("(C) 42 eV", "C. 42 eV"), so "a + b" names no letter.
    Otherwise (an answer line) the letter must be a capital, and may be followed by prose
    ("B, which is cold")."""
    text = _unwrap(_NAMED.sub("", _unwrap(content), count=1))
    m = _LETTER.match(text)
    if m is None:
        return None
    opened, letter, closed = m.group(1), m.group(2), m.group(3)
    if not any_case and not letter.isupper():
        return None
    rest = text[m.end() :]
    hedge = _HEDGE.match(rest)
    if hedge is not None and hedge.group(1).upper() in _allowed(choices):
        return None
    if rest.strip() and any_case and not (opened or closed or rest[:1] in ".:"):
        return None
    letter = letter.upper()
    return letter if letter in _allowed(choices) else None


def _answer_line(text: str, choices: int) -> str | None:
    matches = list(_ANSWER_LINE.finditer(text[-5000:]))
    for m in reversed(matches):  # the last anchor that names a letter
        rest = _FILLER.sub("", m.group("rest"))
        letter = letter_of(rest, choices, any_case=False)
        if letter is not None:
            return letter
        if rest.strip():
            return None  # the last anchor answers with something that is not a letter
    return None


def _box_letter(text: str, choices: int) -> tuple[bool, str | None]:
    """Whether `text` has a box, and the letter its last box names."""
    boxes = find_boxes(text)
    return (True, letter_of(boxes[-1][0], choices)) if boxes else (False, None)


def extract_choice(response: str, choices: int = 4) -> Extraction:
    """The letter `response` chooses among the first `choices` capitals, and where it was found."""
    visible = _strip_hidden(clean(response))
    start = visible.rfind("<answer>")
    if start >= 0:
        end = visible.find("</answer>", start)
        block = visible[start + len("<answer>") : end if end >= 0 else len(visible)]
        boxed, letter = _box_letter(block, choices)
        if boxed:
            return Extraction(letter, "answer_box")
        letter = _answer_line(block, choices) or letter_of(block, choices)
        if letter is not None:
            return Extraction(letter, "answer_tag")
    boxed, letter = _box_letter(visible, choices)
    if boxed:
        return Extraction(letter, "boxed")
    letter = _answer_line(visible, choices)
    if letter is not None:
        return Extraction(letter, "final_answer_line")
    stripped = visible.strip()
    if len(stripped) <= 12 and _ANSWER_LINE.search(stripped) is None:
        letter = letter_of(stripped, choices)
        bare = _NAMED.sub("", _unwrap(stripped), count=1)
        if letter is not None and len(_unwrap(bare).strip("()[]. ")) == 1:
            return Extraction(letter, "raw")
    return Extraction(None, "none")


def grade_choice(response: object, gold: object, choices: int = 4) -> Grade:
    """Whether `response` chooses the letter `gold`; never raises. `Grade.method` is "choice"."""
    began = time.perf_counter()

    def done(correct: bool, reason: str, extracted: str | None, gold_n: str, source: str) -> Grade:
        method = "choice" if reason in ("", "mismatch") else ""
        elapsed = time.perf_counter() - began
        return Grade(correct, extracted, gold_n, method, reason, elapsed, source)

    gold_letter = letter_of(str(gold), choices) if isinstance(gold, str) else None
    if gold_letter is None:
        return done(False, "empty_gold" if not gold else "error: gold is not a letter", None, "",
                    "none")  # fmt: skip
    if not isinstance(response, str) or not response.strip():
        return done(False, "empty_response", None, gold_letter, "none")
    if len(response) > MAX_CHOICE_RESPONSE_CHARS:
        return done(False, "too_long", None, gold_letter, "none")
    try:
        found = extract_choice(response, choices)
    except Exception as exc:  # an extraction bug costs one grade, never a run
        return done(False, f"error: {type(exc).__name__}", None, gold_letter, "none")
    if found.text is None:
        return done(False, "no_answer", None, gold_letter, found.source)
    right = found.text == gold_letter
    return done(right, "" if right else "mismatch", found.text, gold_letter, found.source)

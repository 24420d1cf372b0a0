"""Read an answer out of prose: chat-template debris, maths delimiters and answer sentences.

`clean(text)` cuts a response at the first chat-template token (`<|im_end|>`, `<|im_start|>`,
`<|eot_id|>`, `<|endoftext|>`, `</s>`, ...) when only debris follows it (a multi-turn transcript,
where another turn starts after it, keeps every turn), drops "I hope it is correct." and undoes doubled
LaTeX escapes (`\\\\frac` written for `\\frac`) when the whole text is written that way.

`answer_in(sentence)` reads one answer sentence ("The final answer is $42$.", "so the
probability is 3/7.", "Jane started growing Sphere 3 hours ago."), first that applies:

1. a maths span (`$..$`, `$$..$$`, `\\(..\\)`, `\\[..\\]`) at the start of the sentence;
2. the last maths span, when nothing after it in the sentence holds a digit;
3. what follows the last " is " / " are " / " equals ", when that is one number or one span;
4. the only number in the sentence (with a trailing `%`), when there is exactly one and no
   maths span holds a digit (rules 3 and 4 only for prose: two words or more);
5. the sentence itself (the parser and the text match then decide).

`last_sentence(text)` is the last sentence of a text, with maths spans kept whole (a period
inside `$1.5$` or in `7.78` is not a sentence end). Hedges ("either 3 or 5", "3, not 5") keep
both numbers, so rules 3-4 never pick one of them. All scans are linear regular expressions
over a bounded tail of the text. This module does not normalise or judge answers.
"""

from __future__ import annotations

import re

__all__ = ["answer_in", "clean", "is_prose", "last_sentence", "math_spans"]

_CHAT_TOKEN = re.compile(
    r"<\|(?:im_end|im_start|eot_id|endoftext|end|end_of_text|start_header_id)\|>|</s>"
    r"|<｜end▁of▁sentence｜>|<\|assistant\|>|<\|user\|>"
)
_HOPE = re.compile(r"I hope (?:it|this|that) is correct\.?", re.IGNORECASE)
_DOUBLED = re.compile(r"\\\\(?:[dtc]?frac|sqrt|left|right|boxed|le|ge|leq|geq|neq|pi|cdot|times"
                      r"|infty|text|begin|end|circ|pm|in|cup)(?![a-zA-Z])")  # fmt: skip
_SINGLE = re.compile(r"(?<!\\)\\(?:[dtc]?frac|sqrt|boxed|begin)(?![a-zA-Z])")
_PAIRS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))  # longer "$$" first
_NUMBER = re.compile(r"(?<![\w.^_])[-+]?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*\\?%)?(?![\w.]*\d)")
_VERB = re.compile(r"\b(?:is|are|equals|was|be|it's)\s+(?:equal\s+to\s+|approximately\s+|about\s+)?",
                   re.IGNORECASE)  # fmt: skip
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|\n\s*")
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_TAIL = 4000
_NEXT_TURN = re.compile(r"<\|im_start\|>|<\|start_header_id\|>")


def clean(text: str) -> str:
    """The response without chat-template debris and with single LaTeX escapes."""
    m = _CHAT_TOKEN.search(text)
    if m is not None and text[: m.start()].strip():
        # A multi-turn transcript keeps every turn; otherwise what follows is debris.
        multi_turn = _NEXT_TURN.search(text, m.end()) is not None
        text = _CHAT_TOKEN.sub("\n", text) if multi_turn else text[: m.start()]
    head, tail = text[:-_TAIL], text[-_TAIL:]  # the sign-off matters only near the end
    text = head + _HOPE.sub(" ", tail)
    if _DOUBLED.search(text) and not _SINGLE.search(text.replace("\\\\", "")):
        text = text.replace("\\\\", "\\")
    return text


def _find(text: str, token: str, pos: int) -> int:
    """The next `token` at or after `pos`; a `$` written `\\$` does not count."""
    at = text.find(token, pos)
    while token == "$" and at > 0 and text[at - 1] == "\\":
        at = text.find(token, at + 1)
    return at


def math_spans(text: str) -> list[tuple[str, int, int]]:
    """Every maths span of `text` as (content, start, end), left to right.

    Linear: the next opener of each kind is cached, and a kind whose closer does not occur
    again is dropped (no later opener of that kind can close either).
    """
    spans: list[tuple[str, int, int]] = []
    ahead: dict[str, int] = {}
    pos = 0
    while True:
        best: tuple[int, str, str] | None = None
        for opener, closer in _PAIRS:
            at = ahead.get(opener, -2)
            if at == -1:
                continue
            if at < pos:
                at = ahead[opener] = _find(text, opener, pos)
                if at == -1:
                    continue
            if best is None or at < best[0]:
                best = (at, opener, closer)
        if best is None:
            return spans
        at, opener, closer = best
        end = _find(text, closer, at + len(opener))
        if end == -1:
            ahead[opener] = -1
            continue
        content = text[at + len(opener) : end].strip()
        if content:
            spans.append((content, at, end + len(closer)))
        pos = end + len(closer)


def _mask(text: str, spans: list[tuple[str, int, int]]) -> str:
    out, pos = [], 0
    for _, start, end in spans:
        out.append(text[pos:start])
        out.append("#" * (end - start))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def is_prose(text: str) -> bool:
    """Two or more words of three letters or more outside maths spans and LaTeX commands."""
    masked = _mask(text, math_spans(text))
    masked = re.sub(r"\\text\w*\s*\{[^{}]*\}", " ", masked)
    return len(_PROSE_WORD.findall(masked)) >= 2


def last_sentence(text: str) -> str:
    """The last sentence of `text` (maths spans and decimal points do not end a sentence)."""
    text = text[-_TAIL:].strip().rstrip(".!?").strip()
    masked = _mask(text, math_spans(text))
    masked = re.sub(r"(?<=\d)\.(?=\d)", "#", masked)
    start = 0
    for m in _SENTENCE_END.finditer(masked):
        if m.end() < len(masked):
            start = m.end()
    return text[start:].strip()


def answer_in(sentence: str) -> str:
    """The answer stated by one sentence (see the module docstring)."""
    sentence = sentence.strip().rstrip(".").strip()
    spans = math_spans(sentence)
    if spans and spans[0][1] == 0:
        return spans[0][0]
    if spans:
        content, _, end = spans[-1]
        if not re.search(r"\d|\\boxed", sentence[end:]):
            return content
    if not is_prose(sentence):
        return sentence
    masked = _mask(sentence, spans)
    verbs = list(_VERB.finditer(masked))
    if verbs:
        rest = sentence[verbs[-1].end() :].strip()
        rest_spans = math_spans(rest)
        if len(rest_spans) == 1 and rest_spans[0][1] == 0:
            return rest_spans[0][0]
        numbers = list(_NUMBER.finditer(rest))
        if not rest_spans and len(numbers) == 1 and numbers[0].start() == 0:
            return numbers[0].group().strip()
    if not any(re.search(r"\d", content) for content, _, _ in spans):
        numbers = list(_NUMBER.finditer(masked))
        if len(numbers) == 1:
            return numbers[0].group().strip()
    return sentence

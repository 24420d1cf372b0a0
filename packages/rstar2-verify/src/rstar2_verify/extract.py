"""Find the final answer in a model response, and say where it came from.

The response is first cleaned (`_prose.clean`: cut at a chat-template token, "I hope it is
correct." dropped, doubled escapes undone). Order (first that yields wins):

1. `answer_box`: the last `\\boxed{}` / `\\fbox{}` inside the last `<answer>...</answer>` block.
2. `boxed`: the last box anywhere outside `<think>`, `<reason>`, `<tool_call>` and
   `<tool_response>` blocks (a response that starts inside a pre-filled `<reason>` and only closes
   it is handled: everything before the last closing tag is thinking).
3. `answer_tag`: the text of the `<answer>` block itself when it holds no box and is short
   (its answer sentence when it is prose).
4. `final_answer_line`: the answer sentence after the last "final answer:" / "the answer is" /
   "answer:" / "Answer $..$" / `####` anchor (a display block after it may span lines).
5. `raw`: the whole (thinking-free) text when it is short and not prose, i.e. already an answer.
6. `last_sentence`: the answer sentence (`_prose.answer_in`) of the last sentence of prose;
   a long text must end a sentence (".", "!"), so a rollout cut off mid-sentence by the token
   limit never has its last intermediate value read as its answer.

`gold_answer(gold)` applies the same reading to a gold that is a worked solution.

Several boxes: the last one wins (a retracted "\\boxed{5} ... no, \\boxed{7}" gives 7), except
that boxes separated only by commas, "and", semicolons, dollars or spaces are one list answer
("\\boxed{2}, \\boxed{3}" gives "2, 3").

Every scan is linear in the text length (no backtracking regular expressions over the response),
so a 100,000-character or deeply nested input costs microseconds to milliseconds. This module does
not judge the answer and does not normalise LaTeX beyond removing the box.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rstar2_verify._budget import check
from rstar2_verify._prose import answer_in, clean, is_prose, last_sentence, math_spans

__all__ = ["Extraction", "extract_answer", "find_boxes", "gold_answer"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BOX_SCAN = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*|\\[{}]|[{}]")
_HIDDEN_TAGS = ("think", "reason", "tool_call", "tool_response")
_SEPARATOR = re.compile(
    r"^(?:\s|\$|,|;|\\quad|\\qquad|\\text\{\s*(?:and|or)\s*\}|and|or|\\,"
    r"|for\s+part\s+\(?[a-z0-9]\)?:?)*$"
)  # one box per root or part: `\boxed{2} or \boxed{-3}`, `\boxed{5}, for part (b) \boxed{7}`
_FINISHED = re.compile(r"[.!]\s*(?:\$+|\\\]|\\\))?\s*$")
_ANSWER_LINE = re.compile(
    r"(?:final\s+answer|the\s+answer\s+is|answer\s*:|\banswer\b(?=\s*(?:\$|\\\(|\\\[))|####)"
    r"\s*(?:is\s*)?:?\s*(?P<rest>[^\n]*)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Extraction:
    """What was extracted (`text`, None when nothing was found) and from where (`source`)."""

    text: str | None
    source: str


def _strip_hidden(text: str) -> str:
    """Remove thinking and tool blocks; text before a dangling closing tag is thinking too."""
    for tag in _HIDDEN_TAGS:
        close = f"</{tag}>"
        last_close = text.rfind(close)
        if last_close >= 0:
            opened = text.rfind(f"<{tag}>", 0, last_close)
            if opened < 0:  # the opening tag was in the prompt (a pre-filled `<reason>`)
                text = text[last_close + len(close) :]
        parts: list[str] = []
        pos = 0
        open_tag = f"<{tag}>"
        while True:
            start = text.find(open_tag, pos)
            if start < 0:
                parts.append(text[pos:])
                break
            parts.append(text[pos:start])
            end = text.find(close, start)
            if end < 0:  # unclosed: the rest is thinking
                break
            pos = end + len(close)
        text = " ".join(parts)
    return text


def _box_at(text: str, start: int, command: str) -> tuple[str, int] | None:
    """The content of the box whose command starts at `start`, and the index after it."""
    i = start + len(command)
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        # `\boxed 5`: one token up to whitespace, a dollar or the end
        if command == "\\boxed" and i > start + len(command):
            j = i
            while j < n and not text[j].isspace() and text[j] != "$":
                j += 1
            return (text[i:j], j) if j > i else None
        return None
    depth = 0
    for j in range(i, n):
        c = text[j]
        if c == "\\":
            continue
        if c == "{" and text[j - 1] != "\\":
            depth += 1
        elif c == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
    return None  # unbalanced


def find_boxes(text: str) -> list[tuple[str, int, int]]:
    """Every outermost box as (content, start, end), left to right; unbalanced boxes skipped.

    One left-to-right pass over the braces with a stack, so unclosed or deeply nested boxes
    cost linear time.
    """
    spans: list[tuple[int, int, int, int]] = []  # box start, content start, content end, end
    stack: list[tuple[int, int]] = []  # per open brace: (start of its box command or -1, after it)
    pending = -1
    n = len(text)
    starts = [k for k in (text.find("\\boxed"), text.find("\\fbox")) if k >= 0]
    if not starts:
        return []
    # braces before the first box command cannot enclose or close a box: start there
    for count, m in enumerate(_BOX_SCAN.finditer(text, min(starts))):
        if count & 4095 == 4095:
            check()
        tok = m.group()
        if len(tok) > 2:  # \boxed or \fbox
            end = m.end()
            if end < n and text[end] == "{":
                pending = m.start()
            elif tok.startswith("\\boxed") and end > m.start() + len("\\boxed"):
                j = end  # `\boxed 5`: one token
                while j < n and not text[j].isspace() and text[j] != "$":
                    j += 1
                if j > end:
                    spans.append((m.start(), end, j, j))
        elif tok == "{":
            stack.append((pending, m.end()))
            pending = -1
        elif tok == "}" and stack:
            box_start, content_start = stack.pop()
            if box_start >= 0:
                spans.append((box_start, content_start, m.start(), m.end()))
    spans.sort()
    boxes: list[tuple[str, int, int]] = []
    last_end = -1
    for start, c_start, c_end, end in spans:
        if start < last_end:
            continue  # inside an outer box
        last_end = end
        content = text[c_start:c_end]
        for _ in range(8):  # `\boxed{\boxed{5}}` is 5 (a bounded number of times)
            inner = _single_box(content.strip())
            if inner is None:
                break
            content = inner
        boxes.append((content, start, end))
    return boxes


def _single_box(text: str) -> str | None:
    """The content when `text` is exactly one box, else None."""
    for command in _BOX_COMMANDS:
        if text.startswith(command):
            got = _box_at(text, 0, command)
            if got is not None and got[1] == len(text):
                return got[0]
    return None


MAX_JOINED_BOXES = 64  # one box per root or part: more than this is not one answer


def _last_answer(text: str) -> str | None:
    boxes = find_boxes(text)
    if not boxes:
        return None
    group = [boxes[-1]]  # the last box, then the ones before it that it joins, latest first
    for box in reversed(boxes[:-1]):
        if len(group) >= MAX_JOINED_BOXES or not _SEPARATOR.match(text[box[2] : group[-1][1]]):
            break
        group.append(box)
    return ", ".join(content.strip() for content, _, _ in reversed(group))


def extract_answer(response: str, max_raw_chars: int = 300) -> Extraction:
    """The final answer of `response` and its source; `text` is None when none is found."""
    visible = _strip_hidden(clean(response))
    block: str | None = None
    start = visible.rfind("<answer>")
    if start >= 0:
        end = visible.find("</answer>", start)
        block = visible[start + len("<answer>") : end if end >= 0 else len(visible)]
        boxed = _last_answer(block)
        if boxed is not None:
            return Extraction(boxed, "answer_box")
    boxed = _last_answer(visible)
    if boxed is not None:
        return Extraction(boxed, "boxed")
    if block is not None and block.strip() and len(block.strip()) <= max_raw_chars:
        inner = _answer_line(block)
        if inner is None:
            inner = answer_in(last_sentence(block)) if is_prose(block) else block.strip()
        return Extraction(inner, "answer_tag")
    line = _answer_line(visible)
    if line is not None:
        return Extraction(line, "final_answer_line")
    stripped = visible.strip()
    if stripped and len(stripped) <= max_raw_chars and not is_prose(stripped):
        return Extraction(stripped, "raw")
    long_and_cut = len(stripped) > max_raw_chars and not _FINISHED.search(stripped[-20:])
    if stripped and not long_and_cut:  # a long text cut mid-sentence (out of tokens) has none
        sentence = last_sentence(stripped)
        found = answer_in(sentence)
        if found != sentence.strip().rstrip(".").strip() or len(stripped) <= max_raw_chars:
            return Extraction(found, "last_sentence")
    return Extraction(None, "none")


def gold_answer(gold: str) -> str:
    """The answer of a gold that is a worked solution (last box, GSM8K `####`, an answer
    sentence); a gold that is already an answer comes back as it is, stripped."""
    text = clean(gold)
    boxed = _last_answer(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    if is_prose(text):
        found = extract_answer(text).text
        if found:
            return found.strip()
    return text.strip()


def _answer_line(text: str) -> str | None:
    # Only the tail is searched: an answer line is near the end, and this bounds the cost.
    tail = text[-5000:]
    matches = list(_ANSWER_LINE.finditer(tail))
    if not matches:
        return None
    rest = matches[-1].group("rest")
    for opener, closer in (("$$", "$$"), ("\\[", "\\]")):  # a display block over several lines
        begin = matches[-1].start("rest")
        if rest.strip().startswith(opener) and closer not in rest.strip()[len(opener) :]:
            close = tail.find(closer, tail.find(opener, begin) + len(opener))
            if close >= 0:
                rest = tail[begin : close + len(closer)].replace("\n", " ")
    for _ in range(3):  # "Final answer: the answer is 5" (bounded: each search is linear)
        again = _ANSWER_LINE.search(rest)
        if again is None:
            break
        rest = again.group("rest")
    rest = rest.strip().strip("*").strip()  # "**Answer:** 5."
    if not rest:
        return None
    return answer_in(_first_sentence(rest)) or None


def _first_sentence(text: str) -> str:
    """`text` up to the first sentence end outside maths spans and decimal points."""
    spans = math_spans(text)
    if spans and spans[0][1] == 0:
        return text[: spans[0][2]]
    masked = list(text)
    for _, a, b in spans:
        masked[a:b] = "#" * (b - a)
    flat = re.sub(r"(?<=\d)\.(?=\d)", "#", "".join(masked))
    m = re.search(r"[.!?](?:\s|$)|\n", flat)
    return text[: m.start()] if m else text

"""Cleaning as the paper did it (section 4 of the reference), with a report of every drop.

Rules, in order; each dropped problem is recorded with its reason and a detail:
1. `empty_question`.
2. The answer, normalised (`normalise_answer`: math delimiters, \\boxed, thousands separators,
   degree signs and `12.0` are undone), must be usable: `empty_answer`, `unverifiable` ("the
   limit does not exist", "no solution", infinity), `compound` (several parts: "P = 54, A =
   180", "3 and 5", lists), `answer_too_large` (more than `max_answer_digits` digits, or
   scientific notation beyond it, e.g. 6.5e27330467; or longer than `max_answer_chars`),
   `not_integer` (when `integer_answers`). Kept problems carry the normalised answer, and the
   original under `metadata["raw_answer"]` when it changed.
3. `duplicate`: the same normalised question (case, spacing and punctuation folded) seen before
   with the same answer; `conflicting_duplicate`: seen with a different answer (all copies go,
   since the label is in doubt); `duplicate_id`: a different question under a kept problem's id.
4. `contaminated`: an n-gram (n = 8) shared with an evaluation problem.

The paper's model-based label check (keep problems a strong model answers like the label at least
twice) needs a model: labels.py and `rstar2-curriculum verify-labels`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from pydantic import BaseModel, Field

from rstar2_curriculum.config import CleanConfig
from rstar2_curriculum.decontaminate import NgramIndex, words
from rstar2_curriculum.problem import Problem

_UNVERIFIABLE = re.compile(
    r"does\s*n[o']t\s+exist|not\s+exist|\bdne\b|no\s+(real\s+)?solutions?|undefined|"
    r"infinit|\\infty|∞|cannot\s+be\s+determined|impossible|not\s+possible|no\s+such|^none$",
    re.IGNORECASE,
)
_COMPOUND = re.compile(r"[=;]|\band\b|\bor\b|\\pm|±|,|\\quad|\\text\{\s*(and|or)\s*\}")
_THOUSANDS = re.compile(r"[+-]?[0-9]{1,3}((,|\\,|\{,\}|\s)[0-9]{3})+(\.[0-9]+)?")
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("\\boxed{", "}"), ("\\text{", "}"))


def normalise_answer(text: str) -> str:
    """Undo presentation: delimiters, \\boxed{}, thousands separators, degrees, '12.0'."""
    s = text.strip()
    changed = True
    while changed:
        changed = False
        for head, tail in _WRAPPERS:
            if s.startswith(head) and s.endswith(tail) and len(s) >= len(head) + len(tail):
                s, changed = s[len(head) : len(s) - len(tail)].strip(), True
    s = s.rstrip(".").strip()
    if labelled := re.fullmatch(r"[A-Za-z]\w*\s*=\s*([^=]+)", s):  # "x = 5" -> "5"
        s = labelled.group(1).strip()
    for degree in ("^\\circ", "^{\\circ}", "°"):
        s = s.removesuffix(degree).strip()
    if _THOUSANDS.fullmatch(s):
        s = re.sub(r"\\,|\{,\}|,|\s", "", s)
    if re.fullmatch(r"[+-]?[0-9]+\.0*", s):
        s = s.split(".")[0]
    if re.fullmatch(r"[+-]?[0-9]+", s):
        s = str(int(s)) if len(s) < 4000 else s.lstrip("+")
    return s


def classify_answer(raw: str, config: CleanConfig) -> tuple[str, str | None, str]:
    """(normalised answer, drop reason or None, detail)."""
    s = normalise_answer(raw)
    if not s:
        return s, "empty_answer", ""
    if config.drop_unverifiable and _UNVERIFIABLE.search(s):
        return s, "unverifiable", s[:60]
    if config.drop_compound and _COMPOUND.search(s):
        return s, "compound", s[:60]
    digits = len(s.lstrip("+-"))
    if re.fullmatch(r"[+-]?[0-9]+", s):
        if digits > config.max_answer_digits:
            return s, "answer_too_large", f"{digits} digits > {config.max_answer_digits}"
        return s, None, ""
    try:
        number = Decimal(s.replace("\\times10^", "e").replace("\\times 10^", "e"))
    except (InvalidOperation, ValueError):
        number = None
    if number is not None and number.is_finite():
        if number.adjusted() + 1 > config.max_answer_digits:
            return s, "answer_too_large", f"~10^{number.adjusted()}"
        if number == number.to_integral_value():
            return str(int(number)), None, ""
    if config.integer_answers:
        return s, "not_integer", s[:60]
    if len(s) > config.max_answer_chars:
        return s, "answer_too_large", f"{len(s)} chars > {config.max_answer_chars}"
    return s, None, ""


def normalise_question(text: str) -> str:
    """The dedup key: lower-case alphanumeric words joined by single spaces."""
    return " ".join(words(text))


class Dropped(BaseModel):
    """One dropped problem and why."""

    id: str
    reason: str
    detail: str = ""


class CleanReport(BaseModel):
    """What cleaning kept and dropped, by reason."""

    input: int = Field(description="Problems given.")
    kept: int = Field(description="Problems kept.")
    counts: dict[str, int] = Field(description="Reason -> problems dropped.")
    dropped: list[Dropped] = Field(description="Every dropped problem, in input order.")

    def table(self) -> str:
        lines = [f"{'reason':<24}{'dropped':>9}", "-" * 33]
        for reason, count in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"{reason:<24}{count:>9}")
        lines += ["-" * 33, f"{'kept':<24}{self.kept:>9}", f"{'input':<24}{self.input:>9}"]
        return "\n".join(lines)


@dataclass
class CleanResult:
    """The kept problems (input order) and the report."""

    problems: list[Problem]
    report: CleanReport


def clean(
    problems: Sequence[Problem],
    config: CleanConfig | None = None,
    eval_problems: Sequence[Problem] = (),
) -> CleanResult:
    """Apply the rules of the module docstring."""
    config = config or CleanConfig()
    dropped: list[Dropped] = []
    survivors: list[Problem] = []
    for problem in problems:
        if not problem.question.strip():
            dropped.append(Dropped(id=problem.id, reason="empty_question"))
            continue
        answer, reason, detail = classify_answer(problem.answer, config)
        if reason:
            dropped.append(Dropped(id=problem.id, reason=reason, detail=detail))
            continue
        if answer != problem.answer:
            metadata = {**problem.metadata, "raw_answer": problem.answer}
            problem = problem.model_copy(update={"answer": answer, "metadata": metadata})
        survivors.append(problem)

    if config.dedup:
        survivors = _dedup(survivors, dropped)
    if config.decontaminate_ngram and eval_problems:
        index = NgramIndex(config.decontaminate_ngram)
        index.extend((p.question, p.id) for p in eval_problems)
        clean_ones = []
        for problem in survivors:
            hit = index.find(problem.question)
            if hit:
                label, gram = hit
                dropped.append(
                    Dropped(id=problem.id, reason="contaminated", detail=f"{label}: '{gram}'")
                )
            else:
                clean_ones.append(problem)
        survivors = clean_ones

    counts: dict[str, int] = {}
    for d in dropped:
        counts[d.reason] = counts.get(d.reason, 0) + 1
    order = {p.id: i for i, p in enumerate(problems)}
    dropped.sort(key=lambda d: order.get(d.id, 0))
    report = CleanReport(input=len(problems), kept=len(survivors), counts=counts, dropped=dropped)
    return CleanResult(survivors, report)


def _dedup(problems: list[Problem], dropped: list[Dropped]) -> list[Problem]:
    groups: dict[str, list[Problem]] = {}
    for problem in problems:
        groups.setdefault(normalise_question(problem.question), []).append(problem)
    kept: list[Problem] = []
    seen_ids: dict[str, str] = {}
    for problem in problems:
        group = groups[normalise_question(problem.question)]
        if len({p.answer for p in group}) > 1:
            answers = sorted({p.answer for p in group})
            dropped.append(
                Dropped(id=problem.id, reason="conflicting_duplicate", detail=f"answers {answers}")
            )
        elif group[0] is not problem:
            dropped.append(Dropped(id=problem.id, reason="duplicate", detail=f"of {group[0].id}"))
        elif problem.id in seen_ids:
            dropped.append(Dropped(id=problem.id, reason="duplicate_id", detail="id already kept"))
        else:
            seen_ids[problem.id] = problem.id
            kept.append(problem)
    return kept

"""Reference checkers: how rstar2-eval scores a benchmark that rstar2-verify does not grade.

A `Checker` is one benchmark's scoring as its authors define it, built on the maintained package
that ships their checker (IFEval's instruction registry, bfcl-eval's AST checker, arena-hard-auto's
judging, LiveCodeBench's test semantics) rather than a copy of it. rstar2-eval drives every
checker the same way, in this order:

1. `load(path)`: the benchmark's problems from a local copy in its published format (`--data
   PATH`: a file or a folder, as the benchmark publishes it). `path=None`: the copy the checker's
   package ships, if any; else `BenchmarkError` (rstar2-curriculum's, one line) naming what to
   download and where. Each problem is a `rstar2_curriculum.Problem`: a unique `id`, the
   `question` (the user turn's text), `answer` (a reference where there is one, else ""), and
   `metadata` holding whatever else the checker needs later (JSON-safe values).
2. `prompt(problem)`: the benchmark's default template as chat messages (and tools, for function
   calling); rstar2-eval renders them with the model's own chat template
   (`apply_chat_template(messages, tools=..., add_generation_prompt=True)`), samples one reply
   under the benchmark's protocol (temperature 0 by default) and hands it back as a `Response`.
   Benchmarks run through the paper's agent loop instead (code) take `problem.question` as the
   question and never call `prompt`.
3. `check(problem, response)` (async): one sample's `Verdict`. It must not raise for anything
   the model wrote (bad JSON, no code, an empty reply are a score of 0 with a reason in
   `details`); a failure that is not the model's (the judge endpoint or the sandbox is down) is
   `CheckFailed`: the sample is not recorded and a rerun retries it.
4. `metrics(checked)`: the benchmark's metrics over every (problem, verdict) pair of a run, as
   named floats; `metrics(...)[checker.metric]` is the headline number the tables show. It is
   recomputed from the run's `samples.jsonl` on every resume, so it reads nothing but the
   problems and the verdicts (a verdict's `details` must hold what it needs).
5. `close()` (async): release what the checker holds (an HTTP client, a sandbox).

Not covered here: sampling (rstar2-eval's `evaluate`), maths and multiple-choice grading
(rstar2-verify, through its `Scorer`), and which checker a benchmark uses (`catalog.py`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rstar2_curriculum import Problem
from rstar2_evaluator.scorers._data import ScorerDataError

__all__ = [
    "CheckFailed",
    "Checker",
    "Prompt",
    "Response",
    "ScorerDataError",
    "Verdict",
    "reply_text",
]

_SPECIAL = re.compile(r"<\|[a-z_]+\|>|</s>")
_HIDDEN = ("think", "reason", "tool_call", "tool_response")


def reply_text(raw: str) -> str:
    """What a benchmark reads of a reply (`Response.text`): chat-template tokens dropped, every
    reasoning and tool block removed (a closing tag with no opening one ends a reasoning the
    prompt opened; an unclosed one runs to the end), and the last `<answer>` block's content
    when there is one."""
    text = _SPECIAL.sub("", raw)
    for tag in _HIDDEN:
        opening, closing = f"<{tag}>", f"</{tag}>"
        first_close = text.find(closing)
        if first_close >= 0 and opening not in text[:first_close]:
            text = text[first_close + len(closing) :]
        parts, pos = [], 0
        while (start := text.find(opening, pos)) >= 0:
            parts.append(text[pos:start])
            end = text.find(closing, start)
            pos = len(text) if end < 0 else end + len(closing)
        text = "".join([*parts, text[pos:]])
    if "<answer>" in text:
        text = text[text.rfind("<answer>") + len("<answer>") :].split("</answer>")[0]
    return text.strip()


class CheckFailed(RuntimeError):
    """A sample could not be scored for a reason that is not the model's (a judge or sandbox
    outage); the sample is not recorded, and a rerun retries it."""


class Prompt(BaseModel):
    """A benchmark's default template for one problem, as chat messages."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    messages: list[dict[str, Any]] = Field(
        description="Chat messages in the form `apply_chat_template` takes ({role, content}, "
        "and tool calls as the template expects them)."
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None,
        description="Functions offered to the model (OpenAI's JSON-schema form), passed to the "
        "chat template's `tools`; None: no tools.",
    )


class Response(BaseModel):
    """One sampled reply, as a checker reads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = Field(
        description="The reply as the benchmark reads it (`reply_text`): chat-template tokens, "
        "reasoning and tool blocks (<think>, <reason>, <tool_call>, <tool_response>) removed, "
        "the last <answer> block's content when there is one."
    )
    raw: str = Field(description="The whole decoded reply, special tokens and reasoning kept.")
    finish_reason: str = Field(
        description="Why sampling stopped: stop, max_length, answered, no_tool_call, max_turns."
    )


class Verdict(BaseModel):
    """One sample's score; written to the run's samples.jsonl and read back on a resume."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    score: float = Field(
        ge=0, le=1, description="This sample's share of the headline metric (1: right/followed)."
    )
    answer: str | None = Field(
        default=None,
        description="What the checker read from the reply (a letter, the calls as JSON, the "
        "program), for the record; None: nothing.",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON-safe facts `metrics` needs (per-instruction results, the category, "
        "judge verdicts, per-test outcomes) and the reason for a 0.",
    )


@runtime_checkable
class Checker(Protocol):
    """A benchmark's reference checker (see the module docstring for the order of calls)."""

    metric: str  # the key of the headline number in `metrics`

    def load(self, path: Path | None) -> list[Problem]: ...

    def prompt(self, problem: Problem) -> Prompt: ...

    async def check(self, problem: Problem, response: Response) -> Verdict: ...

    def metrics(self, checked: Sequence[tuple[Problem, Verdict]]) -> dict[str, float]: ...

    async def close(self) -> None: ...

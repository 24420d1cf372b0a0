"""SFT examples from data on disk: several sources, their formats, a seeded mixture, a report.

`load_sft(sources, seed)` reads each `SFTSourceConfig` (a .jsonl or .parquet file, or a folder
written by `save_to_disk`), turns every row into an `SFTExample` (the `chat` format is this
package's own row, `{"messages": [{"role", "content"}], "tools"?, "id"?}` as `sft_traces` and
`write_sft_jsonl` write it; the other formats go through the converters in convert.py), puts each
example in the agent loop's shape and checks it, then mixes the sources by weight. A plain path
string is one `chat` source (`sft.source=PATH`).

The agent loop's shape (what `rstar2_rollout.encode_conversation` accepts, and what
`sft_traces` makes): an optional system message first, then a user message; tool messages only
after an assistant or another tool message; the last message is the assistant's; no text holds
the chat template's special tokens; and every assistant message starts with `<reason>` (the loop
pre-fills it). Converted data is non-reasoning and has no `<reason>`: with `assistant="wrap"`
(the default) a turn with tool calls becomes `<reason>{its prose}</reason>` then its
`<tool_call>` blocks, and a turn without becomes `<reason></reason>` then its text inside
`<answer>...</answer>` (as the paper's system prompt asks); `assistant="require"` skips such
rows instead. A row that fails is skipped and counted by reason; a source none of whose rows is
usable is a `DataError` naming the reasons and the fields its rows have.

Weights are uses per epoch: 2.0 repeats every example twice, 0.5 keeps a random half; the kept
set and the order of the mixture depend only on the seed. Packing, loss masks and epochs are the
trainer's business.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from rstar2_curriculum.config import SFTSourceConfig, SFTSources
from rstar2_curriculum.convert import ConvertError, convert_row, detect_format
from rstar2_curriculum.rows import DataError, RowError, detect_kind, read_rows
from rstar2_curriculum.sft import Message, SFTExample

REASON_OPEN = "<reason>"
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_FUNCTION_CALL = {"openai", "sharegpt", "glaive", "xlam"}
_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_EXAMPLES_PER_REASON = 5
_SOURCES: TypeAdapter[tuple[SFTSourceConfig, ...]] = TypeAdapter(SFTSources)


class SFTSourceReport(BaseModel):
    """What one source gave: rows read, examples kept, rows skipped by reason."""

    name: str = Field(description="The source's label.")
    path: str = Field(description="Where it was read from.")
    format: str = Field(description="The configured format.")
    rows: int = Field(default=0, description="Rows read (blank lines excluded).")
    valid: int = Field(default=0, description="Rows that became valid examples.")
    formats: dict[str, int] = Field(default_factory=dict, description="Row format -> rows.")
    wrapped: int = Field(default=0, description="Assistant turns put in the loop's shape.")
    skipped: dict[str, int] = Field(default_factory=dict, description="Reason -> rows skipped.")
    where: dict[str, list[str]] = Field(
        default_factory=dict, description="Reason -> the first few locations ('line 7')."
    )
    weight: float = Field(default=1.0, description="The configured weight.")
    used: int = Field(default=0, description="Examples in the mixture after weighting.")

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        seen = self.where.setdefault(reason, [])
        if len(seen) < _EXAMPLES_PER_REASON:
            seen.append(where)


class SFTReport(BaseModel):
    """The load report of an SFT mixture (JSON-serialisable, for the run directory)."""

    seed: int = Field(description="Seed of the weighting and the order.")
    examples: int = Field(description="Examples in the mixture.")
    sources: list[SFTSourceReport] = Field(description="One report per source, in order.")

    def table(self) -> str:
        lines = [f"{'source':<24}{'format':<14}{'rows':>8}{'valid':>8}{'used':>8}"]
        for s in self.sources:
            lines.append(f"{s.name[:23]:<24}{s.format:<14}{s.rows:>8}{s.valid:>8}{s.used:>8}")
            for reason, count in sorted(s.skipped.items(), key=lambda kv: -kv[1]):
                lines.append(
                    f"  skipped {count:>7}  {reason:<28} e.g. {', '.join(s.where[reason])}"
                )
        lines.append(f"{'mixture':<24}{'':<14}{'':>8}{'':>8}{self.examples:>8}")
        return "\n".join(lines)


@dataclass
class SFTLoadResult:
    """The mixed examples (seeded order) and the report."""

    examples: list[SFTExample]
    report: SFTReport


# ---------------------------------------------------------------------------- one row


def _chat_example(row: dict[str, Any], ident: str) -> SFTExample:
    """A row in this package's SFT format."""
    raw = row.get("messages")
    if not isinstance(raw, list):
        raise RowError("missing_field:messages")
    messages = []
    for m in raw:
        if not isinstance(m, dict):
            raise RowError("bad_message")
        if m.get("tool_calls"):
            raise RowError("tool_calls_field:use format openai")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "tool"):
            raise RowError(f"unknown_role:{role}")
        if not isinstance(content, str):
            raise RowError("bad_message")
        messages.append(Message(role=role, content=content))
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise RowError("bad_tool_schema") from None
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise RowError("bad_tool_schema")
    own = row.get("id")
    try:
        return SFTExample(
            messages=messages, tools=tools, id=own if isinstance(own, str) and own else ident
        )
    except ValidationError:
        raise RowError("invalid_example") from None


def _looks_like_chat(row: dict[str, Any]) -> bool:
    messages = row.get("messages")
    if not isinstance(messages, list) or row.get("tools") is not None:
        return False
    for m in messages:
        if not isinstance(m, dict) or m.get("tool_calls"):
            return False
        if m.get("role") == "assistant" and not str(m.get("content", "")).startswith(REASON_OPEN):
            return False
    return True


def row_format(row: Any, fmt: str) -> str:
    """The format one row is read as (`auto` and `function_call` are decided per row)."""
    if not isinstance(row, dict):
        raise RowError("not_an_object")
    if fmt in ("chat", "openai", "sharegpt", "glaive", "xlam", "instruction"):
        return fmt
    if fmt == "auto" and _looks_like_chat(row):
        return "chat"
    kind = detect_format(row)
    if fmt == "function_call" and kind not in _FUNCTION_CALL:
        raise RowError("not_function_call_data")
    return kind


def to_loop_shape(example: SFTExample, assistant: str = "wrap") -> tuple[SFTExample, int]:
    """The example with every assistant turn starting `<reason>`; and how many were wrapped."""
    messages, wrapped = [], 0
    for m in example.messages:
        if m.role != "assistant" or m.content.startswith(REASON_OPEN):
            messages.append(m)
            continue
        if assistant != "wrap":
            raise RowError("no_reason_prefix")
        calls = _CALL.findall(m.content)
        prose = _CALL.sub("", m.content).strip()
        if calls:
            content = f"<reason>{prose}</reason>\n" + "\n".join(calls)
        elif "<answer>" in m.content:
            content = f"<reason></reason>\n{m.content.strip()}"
        else:
            content = f"<reason></reason>\n<answer>{m.content.strip()}</answer>"
        messages.append(Message(role="assistant", content=content))
        wrapped += 1
    return example.model_copy(update={"messages": messages}), wrapped


def check_example(example: SFTExample) -> None:
    """Raise RowError unless the example is in the agent loop's shape (module docstring)."""
    roles = [m.role for m in example.messages]
    body = roles[1:] if roles[0] == "system" else roles
    if "system" in body:
        raise RowError("system_not_first")
    if not body or body[0] != "user":
        raise RowError("does_not_start_with_user")
    if body[-1] != "assistant":
        raise RowError(f"ends_with_{body[-1]}")
    for before, role in itertools.pairwise(body):
        if role == "tool" and before not in ("assistant", "tool"):
            raise RowError("tool_without_call")
    for m in example.messages:
        if any(token in m.content for token in SPECIAL_TOKENS):
            raise RowError("special_token_in_text")
        if m.role == "assistant":
            if not m.content.startswith(REASON_OPEN):
                raise RowError("no_reason_prefix")
            if not m.content[len(REASON_OPEN) :].strip():
                raise RowError("empty_assistant_turn")


def sft_example(
    row: Any, fmt: str, ident: str, assistant: str = "wrap"
) -> tuple[SFTExample, str, int]:
    """One row as a checked example: (example, the row's format, assistant turns wrapped)."""
    kind = row_format(row, fmt)
    try:
        example = _chat_example(row, ident) if kind == "chat" else convert_row(row, kind, ident)  # type: ignore[arg-type]
    except ConvertError as error:
        raise RowError(str(error)) from None
    example, wrapped = to_loop_shape(example, assistant)
    check_example(example)
    return example, kind, wrapped


# ---------------------------------------------------------------------------- sources


def _read_source(
    source: SFTSourceConfig, position: int
) -> tuple[list[SFTExample], SFTSourceReport]:
    name = source.name or Path(source.path).stem or f"sft{position}"
    report = SFTSourceReport(
        name=name, path=source.path, format=source.format, weight=source.weight
    )
    kind = detect_kind(source.path)
    examples: list[SFTExample] = []
    first: Any = None
    for where, row in read_rows(source.path, kind, source.split):
        if source.limit is not None and len(examples) >= source.limit:
            break
        report.rows += 1
        if first is None and not isinstance(row, RowError):
            first = row
        try:
            if isinstance(row, RowError):
                raise row
            example, fmt, wrapped = sft_example(
                row, source.format, f"{name}/{report.rows - 1}", source.assistant
            )
        except RowError as error:
            report.skip(str(error), where)
            continue
        examples.append(example)
        report.formats[fmt] = report.formats.get(fmt, 0) + 1
        report.wrapped += wrapped
    report.valid = len(examples)
    if not examples:
        raise _unusable(report, first)
    return examples, report


def _unusable(report: SFTSourceReport, first: Any) -> DataError:
    if not report.rows:
        return DataError(f"{report.path}: no rows")
    top = sorted(report.skipped.items(), key=lambda kv: -kv[1])[:3]
    reasons = ", ".join(f"{reason} x{count}" for reason, count in top)
    keys = ", ".join(sorted(first)[:12]) if isinstance(first, dict) else "not objects"
    hint = " (try format: auto)" if report.format != "auto" else ""
    return DataError(
        f"{report.path} (format {report.format}): none of {report.rows} rows is usable: "
        f"{reasons}; the rows have: {keys}{hint}"
    )


def _weighted(examples: list[SFTExample], weight: float, rng: random.Random) -> list[SFTExample]:
    whole, part = int(weight), weight - int(weight)
    picked = examples * whole
    extra = round(part * len(examples))
    if extra:
        picked += [examples[i] for i in sorted(rng.sample(range(len(examples)), extra))]
    return picked


def load_sft(
    sources: str | SFTSourceConfig | Sequence[str | SFTSourceConfig] | Iterable[Any], seed: int = 0
) -> SFTLoadResult:
    """Read, convert, check and mix SFT sources (see the module docstring)."""
    configs = _SOURCES.validate_python(sources)
    if not configs:
        raise DataError("no SFT source given")
    mixture: list[SFTExample] = []
    reports = []
    for position, source in enumerate(configs):
        examples, report = _read_source(source, position)
        rng = random.Random(f"rstar2-sft-weight:{seed}:{position}:{report.name}")
        picked = _weighted(examples, source.weight, rng)
        report.used = len(picked)
        mixture += picked
        reports.append(report)
    random.Random(f"rstar2-sft-order:{seed}").shuffle(mixture)
    return SFTLoadResult(mixture, SFTReport(seed=seed, examples=len(mixture), sources=reports))

"""Converters from public tool-calling and instruction data sets into `SFTExample`s.

Formats (pick one, or `auto` to tell them apart by their keys):
- `openai`: `{"messages": [{"role", "content", "tool_calls"?}], "tools"?}` (Tulu, Nemotron,
  most chat sets); `tool_calls[i].function.arguments` may be a JSON string or an object.
- `sharegpt`: `{"conversations": [{"from", "value"}], "system"?, "tools"?}`: APIGen-MT and
  LLaMA-Factory style (`function_call` / `observation` turns) and ToolACE style (assistant turns
  such as `[Get Weather(city="Paris")]`, tools listed as JSON inside the system text).
- `glaive`: `{"system": "SYSTEM: ... -\\n{fn}\\n{fn}", "chat": "USER: ... ASSISTANT: <functioncall>
  {...} <|endoftext|> FUNCTION RESPONSE: ..."}` (glaive-function-calling-v2).
- `xlam`: `{"query", "tools", "answers"}` (APIGen's xlam-function-calling-60k).
- `instruction`: `{"instruction", "input"?, "output"}`, `{"prompt", "response"}` and the like.

Calls become `<tool_call>{"name", "arguments"}</tool_call>` blocks in the assistant text; tool
schemas become OpenAI-style `{"type": "function", "function": {...}}` in `SFTExample.tools`
(`[]` for a plain instruction example). A system text that holds the tool list (Glaive,
ToolACE) is dropped, since the rollout package writes the tool prompt; any other system text is
kept as a system message. A row that cannot be converted is skipped with a counted
reason (`ConvertReport`); conversion never stops halfway. No rewriting by a model is done (the
paper rewrote Magicoder, Tulu and Nemotron data with o4-mini); that is data work upstream.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from rstar2_curriculum.sft import Message, SFTExample, render_tool_call

Format = Literal["auto", "openai", "sharegpt", "glaive", "xlam", "instruction"]


class ConvertError(ValueError):
    """A row cannot be converted; the message is the counted reason."""


@dataclass
class ConvertReport:
    """Rows seen, converted, and skipped by reason."""

    rows: int = 0
    converted: int = 0
    skipped: dict[str, int] = field(default_factory=dict)


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ConvertError("malformed_json") from None
    return value


_PY_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
             "list": "array", "dict": "object", "tuple": "array"}  # fmt: skip


def normalise_tool(tool: Any) -> dict[str, Any]:
    """An OpenAI-style function schema from the common variants (xlam's python types too)."""
    if not isinstance(tool, dict):
        raise ConvertError("bad_tool_schema")
    fn = tool.get("function", tool) if tool.get("type") == "function" else tool
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ConvertError("bad_tool_schema")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if isinstance(params, dict) and "properties" not in params and "type" not in params:
        props, required = {}, []
        for name, spec in params.items():
            spec = spec if isinstance(spec, dict) else {}
            raw = str(spec.get("type", "str"))
            base = re.split(r"[\[,\s]", raw.lower(), maxsplit=1)[0]
            props[name] = {"type": _PY_TYPES.get(base, "string")}
            if spec.get("description"):
                props[name]["description"] = spec["description"]
            if "optional" not in raw.lower() and "default" not in spec:
                required.append(name)
        params = {"type": "object", "properties": props, "required": required}
    out = {"name": fn["name"], "description": fn.get("description", ""), "parameters": params}
    return {"type": "function", "function": out}


def _tools(value: Any) -> list[dict[str, Any]]:
    value = _json(value or [])
    if not isinstance(value, list):
        raise ConvertError("bad_tool_schema")
    return [normalise_tool(t) for t in value]


def _call(name: Any, arguments: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ConvertError("bad_tool_call")
    arguments = _json(arguments) if arguments not in (None, "") else {}
    if not isinstance(arguments, dict):
        raise ConvertError("bad_tool_call")
    return render_tool_call(name, arguments)


def _calls(value: Any) -> str:
    """Tool-call blocks from a {name, arguments} object, a list of them, or their JSON."""
    value = _json(value)
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, dict) for i in items):
        raise ConvertError("bad_tool_call")
    return "\n".join(_call(i.get("name"), i.get("arguments", i.get("parameters"))) for i in items)


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k}
    return ast.literal_eval(node)


def _python_calls(text: str) -> str:
    """ToolACE's `[Name(a=1, b="x"), Other Name(c=[1])]` as tool-call blocks."""
    body = text.strip()[1:-1]
    blocks, i = [], 0
    while i < len(body):
        start = body.find("(", i)
        if start < 0:
            break
        name, depth, quote, j = body[i:start].strip(" ,\n"), 0, "", start
        for j in range(start, len(body)):
            c = body[j]
            if quote:
                quote = "" if c == quote and body[j - 1] != "\\" else quote
            elif c in "\"'":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0:
                    break
        try:
            call = ast.parse(f"f{body[start : j + 1]}", mode="eval").body
            assert isinstance(call, ast.Call) and not call.args
            args = {kw.arg: _literal(kw.value) for kw in call.keywords if kw.arg}
        except (SyntaxError, ValueError, TypeError, AssertionError):
            raise ConvertError("bad_tool_call") from None
        blocks.append(_call(name, args))
        i = j + 1
    if not blocks:
        raise ConvertError("bad_tool_call")
    return "\n".join(blocks)


def _tools_in_text(text: str) -> list[dict[str, Any]]:
    """The first JSON list of function schemas inside a system text (ToolACE)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\[", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) and "name" in v for v in value)
        ):
            return [normalise_tool(v) for v in value]
    return []


def _finish(messages: list[Message], tools: list[dict[str, Any]], ident: str) -> SFTExample:
    merged: list[Message] = []
    for m in messages:  # an assistant's text then its call arrive as two turns in some sets
        if merged and m.role == "assistant" == merged[-1].role:
            content = f"{merged[-1].content}\n{m.content}".strip()
            merged[-1] = Message(role="assistant", content=content)
        else:
            merged.append(m)
    if not any(m.role == "assistant" and m.content.strip() for m in merged):
        raise ConvertError("no_assistant_turn")
    first = next(m for m in merged if m.role != "system")
    if first.role != "user":
        raise ConvertError("does_not_start_with_user")
    for before, m in itertools.pairwise(merged):
        if m.role == "tool" and before.role not in ("assistant", "tool"):
            raise ConvertError("tool_without_call")
    return SFTExample(messages=merged, tools=tools, id=ident)


def from_openai(row: dict[str, Any], ident: str = "") -> SFTExample:
    raw = row.get("messages")
    if not isinstance(raw, list):
        raise ConvertError("missing_field:messages")
    tools = _tools(row.get("tools"))
    messages = []
    for m in raw:
        if not isinstance(m, dict):
            raise ConvertError("bad_message")
        role = {"function": "tool", "ipython": "tool"}.get(m.get("role", ""), m.get("role", ""))
        if role not in ("system", "user", "assistant", "tool"):
            raise ConvertError(f"unknown_role:{role}")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise ConvertError("bad_message")
        calls = [
            _call((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
            for c in m.get("tool_calls") or []
        ]
        messages.append(Message(role=role, content="\n".join([content.strip(), *calls]).strip()))
    return _finish(messages, tools, ident)


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "function_call": "call", "observation": "tool", "tool": "tool",
                   "function_response": "tool", "system": "system"}  # fmt: skip
_PY_CALL = re.compile(r"^\s*\[\s*[\w][\w .-]*\(.*\)\s*\]\s*$", re.DOTALL)


def from_sharegpt(row: dict[str, Any], ident: str = "") -> SFTExample:
    turns = row.get("conversations")
    if not isinstance(turns, list):
        raise ConvertError("missing_field:conversations")
    system = row.get("system") or ""
    tools, listed_in_system = _tools(row.get("tools")), False
    if not tools and isinstance(system, str):
        tools = _tools_in_text(system)
        listed_in_system = bool(tools)
    # a system text that carries the tool list is replaced by the rollout package's tool prompt;
    # any other (an APIGen-MT domain policy, a persona) is kept
    keep = system and not listed_in_system
    messages = [Message(role="system", content=str(system))] if keep else []
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise ConvertError("bad_message")
        role = _SHAREGPT_ROLES.get(str(turn.get("from")))
        if role is None:
            raise ConvertError(f"unknown_role:{turn.get('from')}")
        value = turn["value"]
        if role == "call":
            messages.append(Message(role="assistant", content=_calls(value)))
        elif role == "assistant" and tools and _PY_CALL.match(value):
            messages.append(Message(role="assistant", content=_python_calls(value)))
        else:
            messages.append(Message.model_validate({"role": role, "content": value.strip()}))
    return _finish(messages, tools, ident)


_GLAIVE_TURN = re.compile(r"(USER|ASSISTANT|FUNCTION RESPONSE):")
_GLAIVE_CALL = re.compile(
    r"<functioncall>\s*\{\s*\"name\"\s*:\s*\"([^\"]+)\"\s*,\s*\"arguments\"\s*:\s*'(.*)'\s*\}",
    re.DOTALL,
)


def from_glaive(row: dict[str, Any], ident: str = "") -> SFTExample:
    chat, system = row.get("chat"), row.get("system") or ""
    if not isinstance(chat, str):
        raise ConvertError("missing_field:chat")
    decoder, tools, i = json.JSONDecoder(), [], system.find("{")
    while 0 <= i < len(system):
        try:
            value, end = decoder.raw_decode(system, i)
        except json.JSONDecodeError:
            raise ConvertError("bad_tool_schema") from None
        tools.append(normalise_tool(value))
        i = system.find("{", end)
    roles = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
    parts = _GLAIVE_TURN.split(chat)
    messages = []
    for tag, text in zip(parts[1::2], parts[2::2], strict=True):
        text = text.replace("<|endoftext|>", "").strip()
        if tag == "ASSISTANT" and "<functioncall>" in text:
            head = text.split("<functioncall>")[0].strip()
            if match := _GLAIVE_CALL.search(text):
                call = _call(match.group(1), match.group(2))
            else:
                call = _calls(text.split("<functioncall>", 1)[1].strip())
            text = f"{head}\n{call}".strip()
        messages.append(Message.model_validate({"role": roles[tag], "content": text}))
    return _finish(messages, tools, ident)


def from_xlam(row: dict[str, Any], ident: str = "") -> SFTExample:
    query = row.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ConvertError("missing_field:query")
    tools = _tools(row.get("tools"))
    calls = _calls(row.get("answers", []))
    messages = [
        Message(role="user", content=query.strip()),
        Message(role="assistant", content=calls),
    ]
    return _finish(messages, tools, ident)


_PROMPTS, _RESPONSES = ("instruction", "prompt", "question", "query"), ("output", "response", "answer", "completion")  # fmt: skip


def from_instruction(row: dict[str, Any], ident: str = "") -> SFTExample:
    prompt = next(
        (row[k] for k in _PROMPTS if isinstance(row.get(k), str) and row[k].strip()), None
    )
    reply = next(
        (row[k] for k in _RESPONSES if isinstance(row.get(k), str) and row[k].strip()), None
    )
    if prompt is None or reply is None:
        raise ConvertError("missing_field:" + ("instruction" if prompt is None else "output"))
    extra = row.get("input")
    if isinstance(extra, str) and extra.strip():
        prompt = f"{prompt.strip()}\n\n{extra.strip()}"
    messages = [
        Message(role="user", content=prompt.strip()),
        Message(role="assistant", content=reply.strip()),
    ]
    return _finish(messages, [], ident)


_CONVERTERS = {"openai": from_openai, "sharegpt": from_sharegpt, "glaive": from_glaive,
               "xlam": from_xlam, "instruction": from_instruction}  # fmt: skip


def detect_format(row: dict[str, Any]) -> str:
    """The format a row looks like, from its keys."""
    for fmt, keys in (("openai", {"messages"}), ("sharegpt", {"conversations"}),
                      ("glaive", {"chat"}), ("xlam", {"query", "answers"})):  # fmt: skip
        if keys <= row.keys():
            return fmt
    return "instruction"


def convert_row(row: Any, fmt: Format = "auto", ident: str = "") -> SFTExample:
    """Convert one row; raises ConvertError whose message is the counted reason."""
    try:
        if not isinstance(row, dict):
            raise ConvertError("not_an_object")
        kind = detect_format(row) if fmt == "auto" else fmt
        return _CONVERTERS[kind](row, ident)
    except ConvertError:
        raise
    except ValidationError:
        raise ConvertError("invalid_example") from None
    except (TypeError, AttributeError, KeyError):  # a field of an unexpected shape
        raise ConvertError("malformed_row") from None


def convert_rows(
    rows: Iterable[Any], fmt: Format = "auto", source: str = "sft"
) -> tuple[list[SFTExample], ConvertReport]:
    """Convert rows (dicts, e.g. from JSONL) in order; bad rows are skipped and counted."""
    report, examples = ConvertReport(), []
    for index, row in enumerate(rows):
        report.rows += 1
        try:
            examples.append(convert_row(row, fmt, f"{source}/{index}"))
        except ConvertError as error:
            reason = str(error)
            report.skipped[reason] = report.skipped.get(reason, 0) + 1
    report.converted = len(examples)
    return examples, report

"""`ConfigError` and `error_lines`: every mistake in a config as one line a person can act on.

`error_lines(exc, Model)` turns every error of a pydantic `ValidationError` into one line
`key.path: message`. The tag of a discriminated union is dropped from the path and said after it
(`engine.x: unknown key for engine.kind vllm`); a wrong scalar is quoted (`(got -1)`). Unknown
keys of one section are one line, with a near name (`did you mean top_p?`) or, when another
variant of the union has the key, which one (`a key of engine.kind vllm`). `mistakes(lines,
source)` is the ConfigError every command raises: one line alone, or `N mistakes in SOURCE:` and
then one line each.

Not covered: dict-valued fields with free keys (no config here has one).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from rstar2_config import _schema


class ConfigError(ValueError):
    """A recipe, an override or a flag a person must fix; its message is one actionable line per
    mistake."""


class OverrideError(ConfigError):
    """An override that cannot be applied (`a.b=value` on a value, an index out of range); one
    line that names the key."""


def mistakes(lines: list[str], source: str) -> ConfigError:
    """The ConfigError for `lines`: one mistake is its line; several are headed
    `N mistakes in SOURCE:`."""
    if len(lines) > 1:
        lines = [f"{len(lines)} mistakes in {source}:", *lines]
    return ConfigError("\n".join(lines))


@dataclass
class _Issue:
    key: str  # dotted, union tags dropped
    variant: str  # "engine.kind vllm" when the key is inside a tagged variant
    type: str
    message: str
    input: Any
    siblings: list[str]  # the keys of the section the error is in (for unknown keys)
    elsewhere: str | None  # "engine.kind hf": another variant that has this key


def _issue(error: Any, model: type[BaseModel]) -> _Issue:
    annotation: Any = model  # the type at the path walked so far (None: unknown)
    path: list[str] = []
    variant, siblings, elsewhere = "", [], None
    for part in error["loc"]:
        arms = _schema.models(annotation) if annotation is not None else []
        name, tagged = _schema.variants(arms)
        if isinstance(part, str) and part in tagged:  # a discriminated union's tag
            variant = f"{'.'.join(path)}.{name} {part}"
            annotation = tagged[part]
            continue
        if isinstance(part, str) and part.startswith("function-"):  # a validator's wrapper
            continue
        if isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool")):
            # an arm of a plain union (`str | list[X]`): follow the list arm
            item = _schema.item_type(annotation) if part.startswith(("list[", "tuple[")) else None
            annotation = list[item] if item is not None else None
            continue
        path.append(str(part))
        if isinstance(part, int):
            annotation = _schema.item_type(annotation) if annotation is not None else None
            continue
        owner = arms[0] if len(arms) == 1 else None
        if owner is not None and part in _schema.fields(owner):
            annotation = _schema.fields(owner)[part].annotation
            continue
        siblings = list(_schema.fields(owner)) if owner is not None else []
        if variant:  # is it a key of another variant of the same union?
            section = ".".join(path[:-1])
            union = _schema.models(_schema.annotation_at(model, section))
            disc, others = _schema.variants(union)
            tag = next((t for t, m in others.items() if part in _schema.fields(m)), None)
            elsewhere = f"{section}.{disc} {tag}" if tag is not None else None
        annotation = None
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return _Issue(
        ".".join(path), variant, error["type"], message, error.get("input"), siblings, elsewhere
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def error_lines(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """Every error of `exc` as one line `key.path: message` (module docstring)."""
    lines: list[str] = []
    unknown: dict[tuple[str, str], list[_Issue]] = {}
    for issue in (_issue(e, model) for e in exc.errors()):
        if issue.type == "extra_forbidden":
            parent = issue.key.rpartition(".")[0]
            unknown.setdefault((parent, issue.variant), []).append(issue)
            continue
        # a validator's message says what to do; a missing key or a wrong type gets the variant
        said = issue.type in ("value_error", "assertion_error", "union_tag_invalid")
        where = f" for {issue.variant}" if issue.variant and not said else ""
        got = ""
        scalar = isinstance(issue.input, str | int | float | bool) or issue.input is None
        if issue.type not in ("missing", "value_error", "assertion_error") and scalar:
            got = f" (got {_shown(issue.input)})"
        head = f"{issue.key}: " if issue.key else ""
        lines.append(f"{head}{issue.message}{where}{got}")
    for (_, variant), group in unknown.items():
        keys = ", ".join(i.key for i in group)
        noun = "unknown key" if len(group) == 1 else "unknown keys"
        line = f"{keys}: {noun}" + (f" for {variant}" if variant else "")
        hints = []
        for issue in group:
            if issue.elsewhere:
                hints.append(f"{issue.key.rpartition('.')[2]} is a key of {issue.elsewhere}")
                continue
            near = difflib.get_close_matches(issue.key.rpartition(".")[2], issue.siblings, n=1)
            if near:
                hints.append(f"did you mean {near[0]}?")
        lines.append(line + (f" ({'; '.join(hints)})" if hints else ""))
    return lines

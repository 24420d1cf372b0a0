"""Config keys by dotted path: set by `a.b=value` overrides, named in validation errors, listed
from the schema (`--help-config`).

- `set_key(tree, "a.b.1", value, Model)` sets a key of a YAML tree before validation. A number
  indexes a list: `0 .. len-1` replace an item, `len` appends one (a section when more keys
  follow), anything else is an `OverrideError` naming the key and the list's length. A list the
  tree does not hold yet starts from the schema's default (`optim.betas.0=0.8`).
- `error_lines(exc, Model)` turns every error of a pydantic `ValidationError` into one line
  `key.path: message`, with the tag of a discriminated union dropped from the path and said
  after it (`engine.x: unknown key for engine.kind vllm`). Unknown keys of one section are one
  line, with a near name (`did you mean top_p?`) or, when another variant has the key, how to
  switch variants.
- `help_text(Model, section)` lists every key with its type, default and description, one line
  each (`  run.seed: int = 0  -- The run seed; ...`) under its section's header; each variant of
  a union of sections is a section of its own (`engine (kind: vllm)`). `describe` gives the same
  as data (a test walks it for fields without a description).

The trainer and the evaluator each hold a copy of this module (tests/test_config_keys.py checks
the copies are the same); it needs pydantic only. Not covered: dict-valued fields with free keys
(none of the configs has one), negative list indices.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python


class OverrideError(ValueError):
    """An override that cannot be applied; one line that names the key."""


# --- the schema, walked by type --------------------------------------------------------------


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> list[Any]:
    """The arms of a union (None left out), or the one type."""
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arms = [_members(a) for a in typing.get_args(annotation) if a is not type(None)]
        return [arm for nested in arms for arm in nested]  # `(A | B) | None`: A, B
    return [annotation]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in _members(annotation) if _is_model(m)]


def _item_type(annotation: Any) -> Any | None:
    """The item type of a list or tuple arm of `annotation` (tuple[X, ...] or tuple[X, Y]: X)."""
    for arm in _members(annotation):
        if typing.get_origin(arm) in (list, tuple) and typing.get_args(arm):
            return typing.get_args(arm)[0]
    return None


def _literal(field: FieldInfo | None) -> str | None:
    annotation = _strip(field.annotation) if field is not None else None
    if typing.get_origin(annotation) is not typing.Literal:
        return None
    args = typing.get_args(annotation)
    return str(args[0]) if len(args) == 1 else None


def _variants(models: list[type[BaseModel]]) -> tuple[str, dict[str, type[BaseModel]]]:
    """The discriminator of a union of sections (`kind`, `name`) and each variant by its tag;
    ("", {}) when the arms are not tagged."""
    if len(models) < 2:
        return "", {}
    for name in models[0].model_fields:
        tags = [_literal(m.model_fields.get(name)) for m in models]
        if all(t is not None for t in tags) and len(set(tags)) == len(tags):
            return name, {str(t): m for t, m in zip(tags, models, strict=True)}
    return "", {}


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        try:
            return field.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory of the validated data
            return PydanticUndefined
    return field.default


# --- overrides -------------------------------------------------------------------------------


def _schema_default(model: type[BaseModel], parts: list[str]) -> Any:
    """The schema's default at `parts` (PydanticUndefined where it has none or is unknown)."""
    annotation: Any = model
    value: Any = PydanticUndefined
    for part in parts:
        owner = type(value) if isinstance(value, BaseModel) else None
        if owner is None:
            models = _models(annotation)
            owner = models[0] if len(models) == 1 else None
        if owner is None or part not in owner.model_fields:
            return PydanticUndefined
        field = owner.model_fields[part]
        parent = value
        annotation = field.annotation
        value = getattr(parent, part) if isinstance(parent, BaseModel) else _default(field)
    return value


def set_key(tree: dict[str, Any], dotted: str, value: Any, model: type[BaseModel]) -> None:
    """Set `dotted` (module docstring) in `tree`, a config as read from YAML."""
    parts = dotted.split(".")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join(parts[:i])
        if isinstance(node, list):
            if not part.isdigit():
                raise OverrideError(f"override {dotted}: {here} is a list; index it with a number")
            index = int(part)
            if index > len(node):
                raise OverrideError(
                    f"override {dotted}: index {index} is out of range: {here} has {len(node)} "
                    f"items (0-{len(node) - 1} replace one, {len(node)} appends)"
                    if node
                    else f"override {dotted}: {here} is empty; 0 appends an item"
                )
            if last:
                node[index:index + 1] = [value]  # fmt: skip
                return
            if index == len(node):
                node.append({})
            node = node[index]
            continue
        if not isinstance(node, dict):
            raise OverrideError(f"override {dotted}: {here} is a value, not a section")
        if last:
            node[part] = value
            return
        if part not in node:
            default = _schema_default(model, parts[: i + 1])
            listed = parts[i + 1].isdigit() and isinstance(default, list | tuple)
            node[part] = list(to_jsonable_python(default)) if listed else {}
        node = node[part]


# --- errors ----------------------------------------------------------------------------------


@dataclass
class _Issue:
    key: str  # dotted, union tags dropped
    variant: str  # "engine.kind vllm" when the key is inside a tagged variant
    type: str
    message: str
    input: Any
    siblings: list[str]  # the keys of the section the error is in (for unknown keys)
    elsewhere: str | None  # a tag of another variant that has this key


def _issue(error: Any, model: type[BaseModel]) -> _Issue:
    annotation: Any = model  # the type at the path walked so far (None: unknown)
    path: list[str] = []
    variant, siblings, elsewhere = "", [], None
    for part in error["loc"]:
        models = _models(annotation) if annotation is not None else []
        name, tagged = _variants(models)
        if isinstance(part, str) and part in tagged:  # a discriminated union's tag
            variant = f"{'.'.join(path)}.{name} {part}"
            annotation = tagged[part]
            continue
        if isinstance(part, str) and part.startswith("function-"):  # a validator's wrapper
            continue
        if isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool")):
            # an arm of a plain union (`str | list[X]`): follow the list arm
            item = _item_type(annotation) if part.startswith(("list[", "tuple[")) else None
            annotation = list[item] if item is not None else None
            continue
        path.append(str(part))
        if isinstance(part, int):
            annotation = _item_type(annotation) if annotation is not None else None
            continue
        owner = models[0] if len(models) == 1 else None
        if owner is not None and part in owner.model_fields:
            annotation = owner.model_fields[part].annotation
            continue
        siblings = list(owner.model_fields) if owner is not None else []
        if variant:  # is it a key of another variant of the same union?
            union = _models(_schema_annotation(model, ".".join(path[:-1])))
            _, others = _variants(union)
            elsewhere = next((t for t, m in others.items() if part in m.model_fields), None)
        annotation = None
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return _Issue(
        ".".join(path), variant, error["type"], message, error.get("input"), siblings, elsewhere
    )


def _schema_annotation(model: type[BaseModel], dotted: str) -> Any:
    """The annotation of the key `dotted` (tags dropped), or None when unknown."""
    annotation: Any = model
    for part in dotted.split(".") if dotted else []:
        models = _models(annotation)
        if part.isdigit():
            annotation = _item_type(annotation)
        elif len(models) == 1 and part in models[0].model_fields:
            annotation = models[0].model_fields[part].annotation
        else:
            return None
    return annotation


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def error_lines(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """Every error of `exc` as one line `key.path: message` (module docstring)."""
    issues = [_issue(e, model) for e in exc.errors()]
    lines: list[str] = []
    unknown: dict[tuple[str, str], list[_Issue]] = {}
    for issue in issues:
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
            leaf = issue.key.rpartition(".")[2]
            near = difflib.get_close_matches(leaf, issue.siblings, n=1)
            if near:
                hints.append(f"did you mean {near[0]}?")
        if variant and any(i.elsewhere for i in group):  # keys of the variant switched from
            field_and_name, _, tag = variant.rpartition(" ")
            section, _, name = field_and_name.rpartition(".")
            hints.append(f"to switch kinds, replace the section: '{section}={{{name}: {tag}}}'")
        lines.append(line + (f" ({'; '.join(hints)})" if hints else ""))
    return lines


# --- the listing -----------------------------------------------------------------------------


@dataclass
class KeyDoc:
    """One line of `help_text`: a key (or a section, `type` empty) and what the schema says."""

    key: str
    type: str
    default: str
    description: str


def _type_name(annotation: Any) -> str:
    annotation = _strip(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(
            "..." if a is Ellipsis else _type_name(a) for a in typing.get_args(annotation)
        )
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def describe(model: type[BaseModel], prefix: str = "", skip: str = "") -> list[KeyDoc]:
    """Every key under `model`: its plain keys, then each section (a header, then its keys);
    a union of sections gives one section per variant, headed `key (kind: tag)`. `skip` is the
    variant's discriminator, which the header shows."""
    docs: list[KeyDoc] = []
    nested: list[KeyDoc] = []
    for name, field in model.model_fields.items():
        if name == skip:
            continue
        key = f"{prefix}{name}"
        description = " ".join((field.description or "").split())
        arms = _members(field.annotation)
        item = _item_type(field.annotation)
        models = _models(field.annotation)
        items = _models(item) if item is not None and not models else []
        if not models and not items:
            docs.append(_leaf(key, field, description))
            continue
        if items and len(arms) > 1:  # also a plain value: `str | list[Section]`
            docs.append(_leaf(key, field, description))
        head = f"{key}.N" if items else key
        optional = type(None) in typing.get_args(_strip(field.annotation))
        disc, tagged = _variants(models or items)
        if tagged:
            for tag, sub in tagged.items():
                summary = " ".join((sub.__doc__ or "").split())
                nested.append(KeyDoc(f"{head} ({disc}: {tag})", "", "", summary))
                nested.extend(describe(sub, f"{head}.", skip=disc))
            continue
        note = " (a section, unset by default)" if optional else ""
        for sub in models or items:
            nested.append(KeyDoc(head, "", "", description + note))
            nested.extend(describe(sub, f"{head}."))
    return docs + nested


def _leaf(key: str, field: FieldInfo, description: str) -> KeyDoc:
    if field.is_required():
        default = "required"
    else:
        value = _default(field)
        try:
            shown = json.dumps(to_jsonable_python(value))
        except (TypeError, ValueError):
            shown = repr(value)
        default = shown if value is not PydanticUndefined else "(computed)"
    return KeyDoc(key, _type_name(field.annotation), default, description)


def sections(model: type[BaseModel]) -> list[str]:
    return [k for k, f in model.model_fields.items() if _models(f.annotation)]


def help_text(model: type[BaseModel], section: str = "") -> str:
    """The listing of every key (module docstring), or of one section; OverrideError if no such
    section."""
    docs = describe(model)
    if section:
        docs = [
            d for d in docs if d.key.split(" ")[0] == section or d.key.startswith(section + ".")
        ]
        if not docs:
            names = ", ".join(sections(model))
            raise OverrideError(f"no config section {section!r}: choose one of {names}")
    lines = []
    for d in docs:
        if not d.type:
            lines.append(f"\n{d.key}  -- {d.description}" if d.description else f"\n{d.key}")
        else:
            indent = "  " if "." in d.key else ""  # a top-level key is in no section
            lines.append(f"{indent}{d.key}: {d.type} = {d.default}  -- {d.description}")
    return "\n".join(lines).lstrip("\n") + "\n"

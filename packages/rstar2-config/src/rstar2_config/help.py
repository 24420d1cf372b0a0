"""`--help-config`: every key of a config listed from its schema.

`help_text(Model, section)` lists every key with its type, default and description, one line
each (`  run.seed: int = 0  -- The run seed; ...`) under its section's header; each variant of a
union of sections is a section of its own (`engine (kind: vllm)`), and a list of sections is
`key.N`. `describe` gives the same as data (a test can walk it for fields without a
description). An unknown section is an OverrideError naming the sections there are.
`help_config_action(Model, prog)` is the `--help-config [SECTION]` option of a command.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from rstar2_config import _schema
from rstar2_config.errors import ConfigError, OverrideError


@dataclass
class KeyDoc:
    """One line of `help_text`: a key (or a section, `type` empty) and what the schema says."""

    key: str
    type: str
    default: str
    description: str


def _type_name(annotation: Any) -> str:
    annotation = _schema.strip(annotation)
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
    for name, field in _schema.fields(model).items():
        if name == skip:
            continue
        key = f"{prefix}{name}"
        description = " ".join((field.description or "").split())
        arms = _schema.members(field.annotation)
        item = _schema.item_type(field.annotation)
        models = _schema.models(field.annotation)
        items = _schema.models(item) if item is not None and not models else []
        if not models and not items:
            docs.append(_leaf(key, field, description))
            continue
        if items and len(arms) > 1:  # also a plain value: `str | list[Section]`
            docs.append(_leaf(key, field, description))
        head = f"{key}.N" if items else key
        optional = type(None) in typing.get_args(_schema.strip(field.annotation))
        disc, tagged = _schema.variants(models or items)
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
        value = _schema.default(field)
        try:
            shown = json.dumps(to_jsonable_python(value))
        except (TypeError, ValueError):
            shown = repr(value)
        default = shown if value is not PydanticUndefined else "(computed)"
    return KeyDoc(key, _type_name(field.annotation), default, description)


def sections(model: type[BaseModel]) -> list[str]:
    """The top-level keys of `model` that are sections or lists of sections."""
    return [
        k
        for k, f in _schema.fields(model).items()
        if _schema.models(f.annotation) or _schema.models(_schema.item_type(f.annotation))
    ]


def help_text(model: type[BaseModel], section: str = "") -> str:
    """The listing of every key (module docstring), or of one section."""
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


def help_config_action(model: type[BaseModel], prog: str) -> type[argparse.Action]:
    """The argparse action of `--help-config [SECTION]`: the listing of `model` on stdout and exit
    0; an unknown section is one line on stderr (`PROG: no config section ...`) and exit 2. Like
    --help, it acts as soon as it is parsed."""

    class HelpConfig(argparse.Action):
        def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
            kwargs.update(nargs="?", const="", metavar="SECTION")
            kwargs.setdefault(
                "help",
                "list every config key (or SECTION's) with its type, default and description, exit",
            )
            super().__init__(option_strings, dest, **kwargs)

        def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
            try:
                text = help_text(model, str(values or ""))
            except ConfigError as exc:
                parser.exit(2, f"{prog}: {exc}\n")
            sys.stdout.write(text)
            parser.exit(0)

    return HelpConfig

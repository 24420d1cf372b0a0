"""`a.b=value` overrides of a config tree (a recipe as read from YAML), before validation.

- `parse_override("a.b=value")` splits a command-line word; the value is YAML (`3`, `true`,
  `[1, 2]`, `{kind: hf}`), or the raw text where it is not valid YAML.
- `set_key(tree, "a.b.1", value, Model)` sets one key. A number indexes a list: `0 .. len-1`
  replace an item, `len` appends one (a section when more keys follow), anything else is an
  `OverrideError` naming the key and the list's length. A list the tree does not hold yet
  starts from the schema's default (`optim.betas.0=0.8`).
- `apply_overrides(tree, settings, Model)` sets them all and returns one line per override that
  could not be applied (the others still apply). Setting the tag of a union of sections
  (`model.kind=pretrained`) switches kinds as a person expects: the keys the recipe gave the old
  kind that the new kind lacks are dropped; keys given among the settings are kept, so a wrong
  one is still reported.

Not covered: negative list indices, keys that contain a dot.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from rstar2_config import _schema
from rstar2_config.errors import OverrideError


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=value` as (key, value); OverrideError for a word that is not of that form."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise OverrideError(f"override {item!r} is not of the form a.b=value")
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError:
        return key, raw


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
            default = _schema.default_at(model, parts[: i + 1])
            listed = parts[i + 1].isdigit() and isinstance(default, list | tuple)
            node[part] = list(to_jsonable_python(default)) if listed else {}
        node = node[part]


def apply_overrides(
    tree: dict[str, Any], settings: list[tuple[str, Any]], model: type[BaseModel]
) -> list[str]:
    """Set every (key, value) in `tree`; the lines of those that could not be set (module
    docstring)."""
    lines, applied = [], []
    for key, value in settings:
        try:
            set_key(tree, key, value, model)
        except OverrideError as exc:
            lines.append(str(exc))
            continue
        applied.append(key)
    for key, value in settings:
        if key in applied:
            _switch_kind(tree, key, value, model, applied)
    return lines


def _switch_kind(
    tree: dict[str, Any], key: str, value: Any, model: type[BaseModel], given: list[str]
) -> None:
    """When `key` is the tag of a union of sections, drop the section's keys that the chosen
    variant lacks, except those in `given` (or under them, or inside a section given whole)."""
    section, _, leaf = key.rpartition(".")
    node, annotation = _walk(tree, model, section) if section else (None, None)
    name, tagged = _schema.variants(_schema.models(annotation))
    if leaf != name or not isinstance(value, str) or value not in tagged:
        return
    if not isinstance(node, dict):
        return
    fields = _schema.fields(tagged[value])
    for child in [k for k in node if k not in fields]:
        path = f"{section}.{child}"
        if not any(
            g == path or path.startswith(g + ".") or g.startswith(path + ".") for g in given
        ):
            del node[child]


def _walk(tree: Any, model: type[BaseModel], dotted: str) -> tuple[Any, Any]:
    """The node of `tree` at `dotted` and its annotation in the schema (None where unknown); a
    union of sections on the way is followed by the tag the tree gives it."""
    node: Any = tree
    annotation: Any = model
    for part in dotted.split("."):
        arms = _schema.models(annotation)
        owner = arms[0] if len(arms) == 1 else None
        if len(arms) > 1 and isinstance(node, dict):
            disc, tagged = _schema.variants(arms)
            owner = tagged.get(str(node.get(disc)))
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node, annotation = node[int(part)], _schema.item_type(annotation)
        elif isinstance(node, dict) and part in node and owner and part in _schema.fields(owner):
            node, annotation = node[part], _schema.fields(owner)[part].annotation
        else:
            return None, None
    return node, annotation

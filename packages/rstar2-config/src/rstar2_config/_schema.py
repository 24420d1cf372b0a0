"""The schema of a pydantic config, walked by type: the arms of a union, the item type of a list,
the tag of a discriminated union of sections, a field's default. Shared by the overrides, the
error lines and the listing; it reads annotations only and never builds a config."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """`model`'s fields by the key a config writes: the alias where one is set (a key that is
    a Python keyword, such as `async`, is a field `async_` with that alias), else the name."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def attribute(model: type[BaseModel], key: str) -> str:
    """The attribute name of the field written as `key`."""
    return next((n for n, f in model.model_fields.items() if (f.alias or n) == key), key)


def strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def members(annotation: Any) -> list[Any]:
    """The arms of a union (None left out), or the one type."""
    annotation = strip(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arms = [members(a) for a in typing.get_args(annotation) if a is not type(None)]
        return [arm for nested in arms for arm in nested]  # `(A | B) | None`: A, B
    return [annotation]


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def models(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in members(annotation) if is_model(m)]


def item_type(annotation: Any) -> Any | None:
    """The item type of a list or tuple arm of `annotation` (tuple[X, ...] or tuple[X, Y]: X)."""
    for arm in members(annotation):
        if typing.get_origin(arm) in (list, tuple) and typing.get_args(arm):
            return typing.get_args(arm)[0]
    return None


def _literal(field: FieldInfo | None) -> str | None:
    annotation = strip(field.annotation) if field is not None else None
    if typing.get_origin(annotation) is not typing.Literal:
        return None
    args = typing.get_args(annotation)
    return str(args[0]) if len(args) == 1 else None


def variants(arms: list[type[BaseModel]]) -> tuple[str, dict[str, type[BaseModel]]]:
    """The discriminator of a union of sections (`kind`, `name`) and each variant by its tag;
    ("", {}) when the arms are not tagged."""
    if len(arms) < 2:
        return "", {}
    for name in arms[0].model_fields:
        tags = [_literal(m.model_fields.get(name)) for m in arms]
        if all(t is not None for t in tags) and len(set(tags)) == len(tags):
            return name, {str(t): m for t, m in zip(tags, arms, strict=True)}
    return "", {}


def default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        try:
            return field.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory of the validated data
            return PydanticUndefined
    return field.default


def annotation_at(model: type[BaseModel], dotted: str) -> Any:
    """The annotation of the key `dotted` (a number: a list item; tags dropped), or None when
    the schema has no such key or the path crosses a union of sections."""
    annotation: Any = model
    for part in dotted.split(".") if dotted else []:
        arms = models(annotation)
        if part.isdigit():
            annotation = item_type(annotation)
        elif len(arms) == 1 and part in fields(arms[0]):
            annotation = fields(arms[0])[part].annotation
        else:
            return None
    return annotation


def default_at(model: type[BaseModel], parts: list[str]) -> Any:
    """The schema's default at `parts` (PydanticUndefined where it has none or is unknown)."""
    annotation: Any = model
    value: Any = PydanticUndefined
    for part in parts:
        owner = type(value) if isinstance(value, BaseModel) else None
        if owner is None:
            arms = models(annotation)
            owner = arms[0] if len(arms) == 1 else None
        if owner is None or part not in fields(owner):
            return PydanticUndefined
        field = fields(owner)[part]
        parent = value
        annotation = field.annotation
        if isinstance(parent, BaseModel):
            value = getattr(parent, attribute(owner, part))
        else:
            value = default(field)
    return value

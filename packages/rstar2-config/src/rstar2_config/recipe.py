"""Recipes: YAML files of a config, found by name in a folder or given by path, loaded with
`a.b=value` overrides and validated, every mistake reported.

    recipes = Recipes(Path(__file__).parent / "configs")
    config = load(TrainerConfig, recipes, "tiny", ["run.seed=3", "model.kind=pretrained", ...])

`load` raises one `ConfigError` for everything a person must fix: an unknown recipe (one line
naming those there are), a file that is not YAML, or else every override that cannot be set and
every validation error, one line each, headed `N mistakes in tiny.yaml:` when there are several
(`errors.mistakes`). `validate` is the last step alone (a saved config, a tree built in code).
Nothing here reads the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rstar2_config.errors import ConfigError, OverrideError, error_lines, mistakes
from rstar2_config.overrides import apply_overrides, parse_override

M = TypeVar("M", bound=BaseModel)


class Recipes:
    """The YAML recipes in `folder`, by name (`tiny` is `folder/tiny.yaml`); `noun` is how a
    person calls them in messages (recipe, config)."""

    def __init__(self, folder: Path, noun: str = "recipe") -> None:
        self.folder = folder
        self.noun = noun

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.yaml"))

    def find(self, recipe: str | Path) -> Path:
        """The file of a name or a path; ConfigError naming the choices when there is none."""
        path = Path(recipe)
        if not path.suffix:
            path = self.folder / f"{recipe}.yaml"
        if not path.is_file():
            choices = ", ".join(self.names())
            raise ConfigError(f"no {self.noun} {str(recipe)!r}: choose one of {choices} or a path")
        return path

    def read(self, recipe: str | Path) -> tuple[dict[str, Any], str]:
        """The recipe's tree and the name errors call it by (its file name)."""
        path = self.find(recipe)
        return read_yaml(path), path.name


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from `path` (empty: {}); ConfigError, one line, when it is not one."""
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}".splitlines()[0]) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} is not a mapping of keys (it holds a {type(tree).__name__})")
    return tree


def validate(
    model: type[M],
    tree: Mapping[str, Any],
    source: str,
    renamed: Mapping[str, str] | None = None,
    before: list[str] | None = None,
) -> M:
    """`tree` as a `model`; ConfigError with `before` (lines already found) and every
    validation error, one line each. `renamed` maps an old key to its new name: an unknown
    old key says where it went (`engine.replicas is now engine_replicas`)."""
    lines = list(before or [])
    try:
        config = model.model_validate(tree)
    except ValidationError as exc:
        lines += [_renamed(line, renamed or {}) for line in error_lines(exc, model)]
    else:
        if not lines:
            return config
    raise mistakes(lines, source)


def _renamed(line: str, renamed: Mapping[str, str]) -> str:
    for old, new in renamed.items():
        if line.startswith(f"{old}: unknown key"):
            return f"{old} is now {new}"
    return line


def load(
    model: type[M],
    recipes: Recipes,
    recipe: str | Path,
    overrides: list[str] | None = None,
    base: Mapping[str, Any] | None = None,
    renamed: Mapping[str, str] | None = None,
) -> M:
    """Read `recipe` (a name in `recipes` or a path), set `base` (key -> value, from the
    command's own arguments) and then `overrides` (`a.b=value` words), validate (module
    docstring)."""
    tree, source = recipes.read(recipe)
    settings = list((base or {}).items())
    lines = []
    for item in overrides or []:
        try:
            settings.append(parse_override(item))
        except OverrideError as exc:
            lines.append(str(exc))
    lines += apply_overrides(tree, settings, model)
    return validate(model, tree, source, renamed, before=lines)

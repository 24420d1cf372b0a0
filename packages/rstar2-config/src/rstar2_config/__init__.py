"""rstar2-config: the config machinery every rstar2 command shares.

A command's config is a pydantic model of frozen sections (`Section`). A recipe is a YAML file of
it, found by name in a folder or given by path (`Recipes`); `load` reads one, applies `a.b=value`
overrides (a number indexes a list; setting a union's `kind` switches the section) and validates,
raising one `ConfigError` whose lines are every mistake; `help_text` is `--help-config`.
Depends on pydantic and pyyaml only.
"""

from rstar2_config.errors import ConfigError, OverrideError, error_lines, mistakes
from rstar2_config.help import KeyDoc, describe, help_config_action, help_text, sections
from rstar2_config.overrides import apply_overrides, parse_override, set_key
from rstar2_config.recipe import Recipes, load, read_yaml, validate
from rstar2_config.section import Section

__all__ = [
    "ConfigError",
    "KeyDoc",
    "OverrideError",
    "Recipes",
    "Section",
    "apply_overrides",
    "describe",
    "error_lines",
    "help_config_action",
    "help_text",
    "load",
    "mistakes",
    "parse_override",
    "read_yaml",
    "sections",
    "set_key",
    "validate",
]

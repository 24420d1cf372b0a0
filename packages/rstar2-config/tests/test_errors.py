"""Every mistake as one line, in the words every rstar2 command uses."""

from __future__ import annotations

import pytest

from rstar2_config import ConfigError, Recipes, load, validate


def test_every_mistake_is_a_line_under_a_count(app, recipes):
    with pytest.raises(ConfigError) as exc:
        load(
            app.Config,
            recipes,
            "small",
            ["lr=0", "run.sede=2", "run.seed=x", "stages.9.name=z", "garbage"],
        )
    lines = str(exc.value).splitlines()
    assert lines[0] == "5 mistakes in small.yaml:"
    assert sorted(lines[1:]) == [
        "lr: Input should be greater than 0 (got 0)",
        "override 'garbage' is not of the form a.b=value",
        "override stages.9.name: index 9 is out of range: stages has 2 items (0-1 replace one, "
        "2 appends)",
        "run.sede: unknown key (did you mean seed?)",
        "run.seed: Input should be a valid integer, unable to parse string as an integer (got 'x')",
    ]


def test_a_validators_message_is_its_line(app, recipes):
    with pytest.raises(ConfigError) as exc:
        load(app.Config, recipes, "small", ["stages.1.name=a"])
    assert str(exc.value) == "name each stage once"


def test_unknown_keys_of_one_section_share_a_line(app, recipes):
    with pytest.raises(ConfigError) as exc:
        load(app.Config, recipes, "small", ["run.a=1", "run.b=2"])
    assert str(exc.value) == "run.a, run.b: unknown keys"


def test_an_optional_section_set_by_keys(app, recipes):
    assert load(app.Config, recipes, "small", ["cluster.nodes=2"]).cluster.nodes == 2  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"^cluster\.nodes: Input should be greater than 0"):
        load(app.Config, recipes, "small", ["cluster.nodes=0"])


def test_a_renamed_key_says_where_it_went(app):
    with pytest.raises(ConfigError) as exc:
        validate(app.Config, {"run": {"seeds": 1}}, "config.yaml", {"run.seeds": "run.seed"})
    assert str(exc.value) == "run.seeds is now run.seed"


def test_sections_are_frozen_and_refuse_unknown_keys(app):
    config = validate(app.Config, {}, "x")
    with pytest.raises(ValueError, match="frozen"):
        config.run.seed = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"^nope: unknown key$"):
        validate(app.Config, {"nope": 1}, "x")


def test_recipes_by_name_or_path(app, recipes, tmp_path):
    assert recipes.names() == ["empty", "small"]
    assert load(app.Config, recipes, "small").run.seed == 1
    assert load(app.Config, recipes, tmp_path / "small.yaml").run.seed == 1
    assert load(app.Config, recipes, str(tmp_path / "small.yaml")).run.seed == 1
    assert load(app.Config, recipes, "empty") == app.Config()


def test_an_unknown_recipe_is_one_line_naming_the_choices(app, tmp_path):
    recipes = Recipes(tmp_path, noun="config")
    (tmp_path / "a.yaml").write_text("{}")
    (tmp_path / "b.yaml").write_text("{}")
    with pytest.raises(ConfigError) as exc:
        load(app.Config, recipes, "c")
    assert str(exc.value) == "no config 'c': choose one of a, b or a path"
    with pytest.raises(ConfigError, match=r"^no config '/no/such\.yaml'"):
        load(app.Config, recipes, "/no/such.yaml")


@pytest.mark.parametrize(
    ("text", "line"),
    [("run: [1\n", "is not valid YAML: "), ("- 1\n", "is not a mapping of keys (it holds a list)")],
)
def test_a_file_that_is_no_config_is_one_line(app, tmp_path, text, line):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(app.Config, Recipes(tmp_path), "bad")
    assert line in str(exc.value) and "\n" not in str(exc.value)


def test_base_settings_come_before_the_overrides(app, recipes):
    config = load(app.Config, recipes, "small", ["run.seed=4"], base={"run.seed": 2, "lr": 0.1})
    assert (config.run.seed, config.lr) == (4, 0.1)

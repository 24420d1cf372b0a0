"""`a.b=value` overrides: values, list indices, and switching a union's kind."""

from __future__ import annotations

import pytest

from rstar2_config import ConfigError, OverrideError, load, parse_override


def test_values_are_yaml_or_the_raw_text():
    assert parse_override("run.seed=3") == ("run.seed", 3)
    assert parse_override("model={kind: tiny}") == ("model", {"kind": "tiny"})
    assert parse_override("sources=[a, b]") == ("sources", ["a", "b"])
    assert parse_override("run.name=[oops") == ("run.name", "[oops")  # not YAML: the text
    assert parse_override(" run.name =x") == ("run.name", "x")
    with pytest.raises(OverrideError, match=r"override 'seed' is not of the form a\.b=value"):
        parse_override("seed")


def test_overrides_reach_nested_keys(app, recipes):
    config = load(app.Config, recipes, "small", ["run.seed=3", "lr=0.5", "model.width=32"])
    assert (config.run.seed, config.lr) == (3, 0.5)
    assert config.model == app.Tiny(layers=2, width=32)  # the recipe's layers stay


def test_a_number_indexes_a_list(app, recipes):
    config = load(
        app.Config,
        recipes,
        "small",
        [
            "stages.1.steps=5",  # replace a key of an item
            "stages.2.name=c",  # index == length appends a section
            "betas.0=0.8",  # a list only the schema's default holds
            "sources.0=x.jsonl",  # appends to an empty list
        ],
    )
    assert [(s.name, s.steps) for s in config.stages] == [("a", 3), ("b", 5), ("c", 1)]
    assert config.betas == (0.8, 0.999)
    assert config.sources == ["x.jsonl"]


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "stages.5.name=x",
            "override stages.5.name: index 5 is out of range: stages has 2 items (0-1 replace "
            "one, 2 appends)",
        ),
        ("sources.1=x", "override sources.1: sources is empty; 0 appends an item"),
        ("stages.first.name=x", "override stages.first.name: stages is a list; index it with"),
        ("run.seed.0=1", "override run.seed.0: run.seed is a value, not a section"),
    ],
)
def test_an_override_that_cannot_be_set_is_one_line(app, recipes, override, line):
    with pytest.raises(ConfigError) as exc:
        load(app.Config, recipes, "small", [override])
    assert str(exc.value).startswith(line) and "\n" not in str(exc.value)


def test_switching_the_kind_drops_the_recipes_keys_of_the_old_kind(app, recipes):
    # small.yaml's model is {kind: tiny, layers: 2, width: 64}: a person types the new kind's keys
    config = load(app.Config, recipes, "small", ["model.kind=pretrained", "model.path=/m"])
    assert config.model == app.Pretrained(path="/m")
    # in either order, and back again
    config = load(app.Config, recipes, "small", ["model.path=/m", "model.kind=pretrained"])
    assert config.model == app.Pretrained(path="/m")
    assert load(app.Config, recipes, "small", ["model.kind=tiny"]).model == app.Tiny(
        layers=2, width=64
    )


def test_keys_given_on_the_command_line_are_still_checked(app, recipes):
    with pytest.raises(ConfigError) as exc:
        load(app.Config, recipes, "small", ["model.kind=pretrained", "model.layers=3"])
    assert str(exc.value).splitlines() == [
        "2 mistakes in small.yaml:",
        "model.path: Field required for model.kind pretrained",
        "model.layers: unknown key for model.kind pretrained (layers is a key of model.kind tiny)",
    ]


def test_a_recipe_that_mixes_kinds_itself_is_reported(app, tmp_path):
    from rstar2_config import Recipes

    (tmp_path / "mixed.yaml").write_text("model: {kind: pretrained, path: /m, layers: 2}\n")
    with pytest.raises(ConfigError) as exc:
        load(app.Config, Recipes(tmp_path), "mixed")
    assert str(exc.value) == (
        "model.layers: unknown key for model.kind pretrained (layers is a key of model.kind tiny)"
    )


def test_an_unknown_kind_drops_nothing_and_is_one_line(app, recipes):
    with pytest.raises(ConfigError) as exc:
        load(app.Config, recipes, "small", ["model.kind=huge"])
    assert str(exc.value).startswith("model: Input tag 'huge' found using 'kind' does not match")


def test_a_kind_inside_a_kind_switches_too(app, tmp_path):
    from rstar2_config import Recipes

    (tmp_path / "served.yaml").write_text(
        "model: {kind: pretrained, path: /m, engine: {kind: vllm, max_num_seqs: 8}}\n"
    )
    config = load(app.Config, Recipes(tmp_path), "served", ["model.engine.kind=hf"])
    assert config.model == app.Pretrained(path="/m", engine=app.HF())


def test_a_key_that_is_a_python_keyword_is_an_aliased_field(tmp_path):
    from pydantic import ConfigDict, Field

    from rstar2_config import Recipes, Section, describe

    class Steps(Section):
        """Steps."""

        lag: int = Field(default=0, ge=0, description="Lag.")

    class Config(Section):
        model_config = ConfigDict(frozen=True, extra="forbid", serialize_by_alias=True)
        async_: Steps = Field(default_factory=Steps, alias="async", description="Async.")

    (tmp_path / "base.yaml").write_text("async: {lag: 1}\n")
    recipes = Recipes(tmp_path)
    config = load(Config, recipes, "base", ["async.lag=2"])
    assert config.async_.lag == 2 and config.model_dump() == {"async": {"lag": 2}}
    assert [d.key for d in describe(Config)] == ["async", "async.lag"]
    with pytest.raises(ConfigError, match=r"async\.lag: Input should be a valid integer"):
        load(Config, recipes, "base", ["async.lag=x"])
    with pytest.raises(ConfigError, match=r"asyn: unknown key \(did you mean async\?\)"):
        load(Config, recipes, "base", ["asyn.lag=1"])

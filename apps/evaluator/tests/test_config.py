"""`EvalConfig` and `load_config`: the paper's protocol by default, overrides, one-line errors."""

import pytest
from pydantic import ValidationError

from rstar2_evaluator import EvalConfig
from rstar2_evaluator.config import (
    ConfigError,
    EndpointModel,
    LocalModel,
    configs,
    load_config,
)
from rstar2_sandbox import LocalSandboxConfig, RemoteSandboxConfig

BASE = {"model.kind": "local", "model.path": "/models/m", "benchmark.name": "aime24"}


def test_defaults_are_the_papers_protocol():
    config = EvalConfig.model_validate(
        {"model": {"kind": "local", "path": "m"}, "benchmark": {"name": "aime24"}}
    )
    assert (config.temperature, config.samples, config.max_turns) == (0.6, 16, 30)
    assert config.max_response_tokens == 30720
    assert isinstance(config.model, LocalModel) and isinstance(config.tool, LocalSandboxConfig)
    with pytest.raises(ValidationError):
        EvalConfig.model_validate(
            {"model": {"kind": "local", "path": "m"}, "benchmark": {"name": "x"}, "samples": 0}
        )


def test_the_paper_config_file_matches_the_model_defaults():
    assert {"paper", "quick"} <= set(configs())
    from_file = load_config("paper", BASE)
    from_model = EvalConfig.model_validate(
        {"model": {"kind": "local", "path": "/models/m"}, "benchmark": {"name": "aime24"}}
    )
    assert from_file == from_model


def test_overrides_reach_nested_fields_and_parse_values():
    config = load_config(
        "paper",
        BASE,
        [
            "samples=4",
            "temperature=1.0",
            "tool.sandbox.workers=1",
            "benchmark.limit=5",
            "pass_k=[1, 4]",
        ],
    )
    assert (config.samples, config.temperature, config.benchmark.limit) == (4, 1.0, 5)
    assert config.tool.workers == 1  # type: ignore[union-attr]  (the old tool.sandbox spelling)
    assert config.pass_k == (1, 4)


def test_an_endpoint_model_keeps_its_key_out_of_dumps():
    config = load_config(
        "quick",
        {"model.kind": "openai", "model.url": "http://h:8000/v1", "benchmark.name": "x.jsonl"},
        ["model.tokenizer=/tok", "model.api_key=secret"],
    )
    assert isinstance(config.model, EndpointModel) and config.model.api_key == "secret"
    assert "secret" not in config.model_dump_json() and "secret" not in repr(config)
    assert config.identity()["model"] == {
        "kind": "openai",
        "url": "http://h:8000/v1",
        "model": "",
        "tokenizer": "/tok",
        "timeout_s": 600.0,
    }


def test_identity_ignores_concurrency_but_not_the_protocol():
    a = load_config("paper", BASE)
    assert a.identity() == load_config("paper", BASE, ["concurrency=2"]).identity()
    assert a.identity() != load_config("paper", BASE, ["temperature=0"]).identity()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["samples=0"], "invalid config: samples: Input should be greater than 0"),
        (["nosuch=1"], "invalid config: nosuch: Extra inputs are not permitted"),
        (["samples"], "override 'samples' is not key=value"),
        (["samples.x=1"], "override samples.x: samples is a value, not a section"),
    ],
)
def test_bad_overrides_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config("paper", BASE, overrides)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_an_unknown_config_name():
    with pytest.raises(ConfigError, match="no config 'fast': choose one of"):
        load_config("fast", BASE)


def test_the_default_run_directory():
    config = load_config("paper", BASE)
    assert str(config.run_dir()) == "runs/eval/aime24-m"
    assert str(load_config("paper", BASE, ["out=/tmp/r"]).run_dir()) == "/tmp/r"


def test_the_old_remote_tool_spelling_is_a_remote_backend():
    config = load_config("quick", BASE, ["tool.kind=grpc", "tool.address=h1:1, h2:2"])
    assert isinstance(config.tool, RemoteSandboxConfig)
    assert config.tool.addresses == ["h1:1", "h2:2"]
    with pytest.raises(ConfigError, match=r"tool\.token_file"):
        load_config("quick", BASE, ["tool.kind=grpc", "tool.address=h:1", "tool.token=s3cret"])

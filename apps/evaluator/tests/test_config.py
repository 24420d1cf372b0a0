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
        (["samples=0"], "samples: Input should be greater than 0 (got 0)"),
        (["nosuch=1"], "nosuch: unknown key"),
        (["top_pp=1"], "top_pp: unknown key (did you mean top_p?)"),
        (["pass_k.9=3"], "override pass_k.9: index 9 is out of range: pass_k has 5 items"),
        (["samples"], "override 'samples' is not of the form a.b=value"),
        (["samples.x=1"], "override samples.x: samples is a value, not a section"),
        (["model.engine=sglang"], "model.engine: Input tag 'sglang'"),
        (
            ["model.engine.max_num_seqs=8"],
            "model.engine: model.engine with settings needs its kind",
        ),
        (
            ["model.engine.kind=hf", "model.engine.model=/m"],
            "model: model.engine.model: the engine runs model.path",
        ),
        (
            ["model.engine.kind=vllm", "model.engine.max_model_len=4096", "model.max_model_len=8"],
            "model: set model.max_model_len or model.engine.",
        ),
        (
            ["model.engine={kind: openai, base_url: 'http://h/v1', model: m}"],
            "model: model.engine.kind openai is a served model",
        ),
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


def test_the_engine_is_rstar2_rollouts_engine_config_and_auto_stays_auto():
    from rstar2_rollout import HFEngineConfig, VLLMEngineConfig

    default = load_config("paper", BASE)
    assert default.model.engine is None  # type: ignore[union-attr]
    assert (
        default.model_dump(mode="json")["model"]["engine"] == "auto"
    )  # by name: older run folders resume
    assert load_config("paper", BASE, ["model.engine=auto"]) == default
    old_name = load_config("paper", BASE, ["model.engine=transformers"]).model
    new_name = load_config("paper", BASE, ["model.engine=hf"]).model
    assert isinstance(old_name, LocalModel) and isinstance(new_name, LocalModel)
    assert old_name.engine == HFEngineConfig() == new_name.engine  # transformers: hf's old name
    tuned = load_config("paper", BASE, ["model.engine.kind=vllm", "model.engine.max_num_seqs=8"])
    assert tuned.model.engine == VLLMEngineConfig(max_num_seqs=8)  # type: ignore[union-attr]
    dumped = tuned.model_dump(mode="json")
    assert EvalConfig.model_validate(dumped) == tuned


def test_check_model_fills_the_engine_with_the_evaluation(tmp_path):
    from rstar2_evaluator.model import check_model
    from rstar2_rollout import HFEngineConfig, VLLMEngineConfig

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 4096}')
    base = {**BASE, "model.path": str(tmp_path)}
    vllm = ["model.engine.kind=vllm", "model.engine.max_num_seqs=8", "seed=3"]
    engine, context = check_model(load_config("paper", base, vllm))
    assert context == 4096  # the model's own limit caps 30720 + 4096
    assert engine == VLLMEngineConfig(
        model=str(tmp_path),
        max_model_len=4096,
        max_num_seqs=8,
        seed=3,
        kv_cache_memory_bytes=4 << 30,
    )
    explicit = [*vllm, "model.engine.max_model_len=2048", "model.kv_cache_gib=0.25"]
    engine, context = check_model(load_config("paper", base, explicit))
    assert context == 2048 and isinstance(engine, VLLMEngineConfig)
    assert (engine.max_model_len, engine.kv_cache_memory_bytes) == (2048, 1 << 28)
    engine, _ = check_model(load_config("paper", base, ["model.engine=hf"]))
    assert engine == HFEngineConfig(model=str(tmp_path))


def test_a_number_in_an_override_indexes_a_list():
    assert load_config("paper", BASE, ["pass_k.0=3"]).pass_k == (3, 2, 4, 8, 16)
    assert load_config("paper", BASE, ["pass_k.5=32"]).pass_k == (1, 2, 4, 8, 16, 32)  # appends


def test_every_mistake_is_a_line():
    with pytest.raises(ConfigError) as error:
        load_config("paper", BASE, ["samples=0", "temperature=-1", "nosuch=1"])
    assert sorted(str(error.value).splitlines()) == [
        "3 mistakes in paper.yaml:",
        "nosuch: unknown key",
        "samples: Input should be greater than 0 (got 0)",
        "temperature: Input should be greater than or equal to 0 (got -1)",
    ]


def test_every_key_has_a_description():
    from rstar2_config import describe
    from rstar2_evaluator.config import EvalConfig

    docs = describe(EvalConfig)
    assert len(docs) > 50  # the walk reaches the packages' sections and every variant
    assert [d.key for d in docs if not d.description] == []

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from rstar2_rollout import (
    EngineConfig,
    HFEngineConfig,
    OpenAIEngineConfig,
    RolloutConfig,
    VLLMEngineConfig,
)

MODELS: list[type[BaseModel]] = [
    RolloutConfig,
    VLLMEngineConfig,
    HFEngineConfig,
    OpenAIEngineConfig,
]


def test_defaults_validate_and_are_frozen():
    config = RolloutConfig()
    assert config == RolloutConfig.model_validate(config.model_dump())
    with pytest.raises(ValidationError):
        config.__class__.model_validate({**config.model_dump(), "no_such_field": 1})
    with pytest.raises(ValidationError, match="greater than 0"):
        RolloutConfig(max_response_tokens=0)


@pytest.mark.parametrize("model", MODELS)
def test_every_field_is_documented(model):
    for name, field in model.model_fields.items():
        assert name == "kind" or field.description, f"{model.__name__}.{name} has no description"


def test_engines_are_chosen_by_kind():
    adapter = TypeAdapter(EngineConfig)
    assert isinstance(adapter.validate_python({"kind": "vllm", "model": "m"}), VLLMEngineConfig)
    assert isinstance(adapter.validate_python({"kind": "hf", "model": "m"}), HFEngineConfig)
    remote = adapter.validate_python({"kind": "openai", "base_url": "http://h/v1", "model": "m"})
    assert isinstance(remote, OpenAIEngineConfig)
    with pytest.raises(ValidationError, match="sglang"):
        adapter.validate_python({"kind": "sglang", "model": "m"})


def test_an_app_fills_what_the_recipe_left_unset_and_the_recipe_wins():
    recipe = TypeAdapter(EngineConfig).validate_python({"kind": "vllm", "max_num_seqs": 8})
    filled = recipe.fill(model="/m", max_num_seqs=64, max_model_len=2048, device="cuda")
    assert (filled.model, filled.max_num_seqs, filled.max_model_len) == ("/m", 8, 2048)
    assert filled.kv_cache_memory_bytes == VLLMEngineConfig().kv_cache_memory_bytes
    hf = HFEngineConfig().fill(model="/m", max_model_len=2048)  # a key hf lacks is ignored
    assert hf == HFEngineConfig(model="/m")


def test_only_engines_that_load_weights_say_so():
    assert VLLMEngineConfig.takes_weight_updates and HFEngineConfig.takes_weight_updates
    assert not OpenAIEngineConfig.takes_weight_updates


def test_an_engine_without_a_model_is_not_built():
    from rstar2_rollout import build_engine

    with pytest.raises(ValueError, match=r"engine hf-0 \(hf\) has no model: fill\(model="):
        build_engine(HFEngineConfig())

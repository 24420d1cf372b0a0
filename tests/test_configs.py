"""Every shipped config validates, and every engine it names is rstar2-rollout's `EngineConfig`.

Cross-package: the trainer's recipes and the evaluator's configs load, and the engine each one
builds (after the app fills what it owns) is a config of rstar2-rollout's union that its
`build_engine` takes, with the rollout package's defaults where the file says nothing.
"""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from rstar2_evaluator.config import configs as eval_configs
from rstar2_evaluator.config import load_config as load_eval_config
from rstar2_rollout import EngineConfig, HFEngineConfig, VLLMEngineConfig
from rstar2_trainer.config import TrainerConfig, context_tokens, recipes
from rstar2_trainer.config import load_config as load_trainer_config

ENGINES = TypeAdapter(EngineConfig)


@pytest.mark.parametrize("recipe", recipes())
def test_every_trainer_recipe_builds_a_rollout_engine_config(recipe):
    config = load_trainer_config(recipe)
    for replica in range(config.engine_replicas):
        engine = config.engine_for("/models/policy", replica)
        assert engine == ENGINES.validate_python(engine.model_dump())  # the union takes it
        assert engine.model == "/models/policy"  # type: ignore[union-attr]
        assert engine.seed == config.run.seed + replica  # type: ignore[union-attr]
        assert engine.max_model_len >= context_tokens(config)  # type: ignore[union-attr]
        assert engine.dtype == config.train.dtype  # type: ignore[union-attr]


def test_the_trainer_has_no_engine_defaults_of_its_own():
    engine = TrainerConfig().engine_for("/m", 0)
    default = VLLMEngineConfig()
    assert isinstance(engine, VLLMEngineConfig)
    unfilled = {"model", "max_model_len", "seed", "dtype"}  # the run's, filled by engine_for
    assert engine.model_dump(exclude=unfilled) == default.model_dump(exclude=unfilled)


@pytest.mark.parametrize("name", eval_configs())
@pytest.mark.parametrize("engine", ["auto", "vllm", "hf"])
def test_every_evaluator_config_validates_with_each_engine(name, engine, tmp_path):
    from rstar2_evaluator.model import check_model

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 40960}')
    base = {"model.kind": "local", "model.path": str(tmp_path), "benchmark.name": "aime24"}
    config = load_eval_config(name, base, [f"model.engine={engine}"])
    built, context = check_model(config)
    assert built == ENGINES.validate_python(built.model_dump())
    assert built.model == str(tmp_path)  # type: ignore[union-attr]
    if isinstance(built, VLLMEngineConfig):
        assert built.max_model_len == context == config.max_response_tokens + 4096
        assert built.max_num_seqs == VLLMEngineConfig().max_num_seqs  # rollout's default
    else:
        assert engine in ("auto", "hf") and isinstance(built, HFEngineConfig)


def _requires_isolation(tool) -> bool:
    """A backend that runs calls itself (local, child) must require every confinement;
    remote servers and fusion endpoints are configured where they run."""
    return getattr(tool, "kind", "") not in ("local", "child") or not tool.allow_weak_isolation


@pytest.mark.parametrize("recipe", recipes())
def test_every_trainer_recipe_requires_isolation(recipe):
    """Issue 16 item 2: weak isolation only where a recipe says so, and none of ours does; in
    cluster mode each node's `serve` gets no --allow-weak-isolation either."""
    from rstar2_trainer.placement.cluster import _service_args

    config = load_trainer_config(recipe)
    assert _requires_isolation(config.tool), config.tool
    assert config.sandbox.require_isolation
    if config.cluster is not None:
        assert "--allow-weak-isolation" not in _service_args(config, config.cluster)[0]


@pytest.mark.parametrize("name", eval_configs())
def test_every_evaluator_config_requires_isolation(name, tmp_path):
    base = {"model.kind": "local", "model.path": str(tmp_path), "benchmark.name": "aime24"}
    config = load_eval_config(name, base, [])
    assert _requires_isolation(config.tool), config.tool
    assert config.sandbox.require_isolation


def test_weak_isolation_is_a_recipe_choice():
    config = load_trainer_config("tiny", ["tool.kind=child", "tool.allow_weak_isolation=true"])
    assert not _requires_isolation(config.tool)

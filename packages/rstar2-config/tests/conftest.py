"""A small config shaped like the apps': plain keys, sections, a union of sections on `kind`, a
list of sections, a tuple with a default, an optional section."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, Literal

import pytest
from pydantic import Field, model_validator

from rstar2_config import Recipes, Section


class RunConfig(Section):
    """The run."""

    seed: int = Field(default=0, description="The run seed.")
    name: str = Field(default="tiny", description="A label.")


class TinyModel(Section):
    """A tiny model built on the spot."""

    kind: Literal["tiny"] = "tiny"
    layers: int = Field(default=4, gt=0, description="Blocks.")
    width: int = Field(default=128, gt=0, description="Width.")


class VllmEngine(Section):
    """vLLM."""

    kind: Literal["vllm"] = "vllm"
    max_num_seqs: int = Field(default=128, gt=0, description="Sequences at once.")


class HFEngine(Section):
    """transformers."""

    kind: Literal["hf"] = "hf"
    attention: str = Field(default="sdpa", description="Attention kernel.")


class PretrainedModel(Section):
    """A model folder."""

    kind: Literal["pretrained"] = "pretrained"
    path: str = Field(description="The folder.")
    revision: str = Field(default="main", description="Which revision.")
    engine: Annotated[VllmEngine | HFEngine, Field(discriminator="kind")] | None = Field(
        default=None, description="How it runs; None: the app's choice."
    )


class Stage(Section):
    """One stage."""

    name: str = Field(description="Its name.")
    steps: int = Field(default=1, gt=0, description="RL steps.")


class Cluster(Section):
    """A cluster."""

    nodes: int = Field(default=1, gt=0, description="Nodes.")


class AppConfig(Section):
    """The whole config."""

    run: RunConfig = Field(default_factory=RunConfig, description="The run itself.")
    model: Annotated[TinyModel | PretrainedModel, Field(discriminator="kind")] = Field(
        default_factory=TinyModel, description="The policy."
    )
    stages: list[Stage] = Field(default_factory=list, description="The stages.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    sources: list[str] = Field(default_factory=list, description="Files.")
    lr: float = Field(default=1e-3, gt=0, description="Learning rate.")
    cluster: Cluster | None = Field(default=None, description="A cluster; None: here.")

    @model_validator(mode="after")
    def _named_once(self) -> AppConfig:
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError("name each stage once")
        return self


RECIPE = """\
run:
  seed: 1
model:
  kind: tiny
  layers: 2
  width: 64
stages:
  - {name: a, steps: 3}
  - {name: b}
"""


@pytest.fixture
def recipes(tmp_path) -> Recipes:
    (tmp_path / "small.yaml").write_text(RECIPE)
    (tmp_path / "empty.yaml").write_text("")
    return Recipes(tmp_path)


@pytest.fixture
def app() -> SimpleNamespace:
    """The config classes above (test modules cannot import conftest)."""
    return SimpleNamespace(
        Config=AppConfig, Tiny=TinyModel, Pretrained=PretrainedModel, HF=HFEngine
    )

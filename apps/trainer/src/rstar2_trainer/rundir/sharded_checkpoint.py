"""Sharded checkpoints of an FSDP2 model and its optimizer, with torch.distributed.checkpoint.

A checkpoint is a folder `step_000012/` holding DCP's files (one `__<rank>_0.distcp` per saving
rank plus `.metadata`, which records every tensor's global shape) and `state.json` (the step and
whatever the caller adds). Because DCP stores global shapes and each loader asks only for its own
shards, a checkpoint saved by N ranks loads on M ranks, and into a plain unsharded model in a
process with no process group at all. Like `checkpoint.py`, it is written under a temporary name
and renamed into place by rank 0 after every rank has finished, then `latest` is replaced
atomically; a killed run leaves the previous complete checkpoint.

Contract: every rank calls `save_sharded` / `load_sharded` together with the same `root`, which
must be one shared filesystem path on a multi-node run. Not covered: RNG states of each rank
(the trainer's `checkpoint.rng_state` holds rank 0's), asynchronous saving.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

# Frozen parameters (a LoRA policy's base) are the model folder's: a checkpoint holds what trains.
_TRAINED = StateDictOptions(ignore_frozen_params=True)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _dcp(fn, content: dict[str, Any], path: Path) -> None:
    """dcp.save or dcp.load; with no process group it runs single-process, which is intended."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        fn(content, checkpoint_id=path)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_sharded(
    root: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Save this rank's shards of `model` (and `optimizer`) as checkpoint `step` under `root`."""
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    if optimizer is None:
        content: dict[str, Any] = {"model": get_model_state_dict(model, options=_TRAINED)}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_TRAINED)
        content = {"model": model_sd, "optimizer": optim_sd}
    _dcp(dcp_save, content, tmp)
    _barrier()
    if _rank() == 0:
        (tmp / "state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer = root / ".latest.tmp"
        pointer.write_text(final.name)
        pointer.replace(root / "latest")
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest_sharded(root: Path) -> Path | None:
    """The checkpoint folder `root/latest` points at, or None when there is none."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    return root / pointer.read_text().strip()


def load_sharded(
    path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Load checkpoint `path` into `model` (and `optimizer`), sharded or not; return its state."""
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a sharded checkpoint (no .metadata)")
    if optimizer is None:
        content: dict[str, Any] = {"model": get_model_state_dict(model, options=_TRAINED)}
        _dcp(dcp_load, content, path)
        set_model_state_dict(model, content["model"], options=_TRAINED)
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_TRAINED)
        content = {"model": model_sd, "optimizer": optim_sd}
        _dcp(dcp_load, content, path)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=content["model"],
            optim_state_dict=content["optimizer"],
            options=_TRAINED,
        )
    return json.loads((path / "state.json").read_text())

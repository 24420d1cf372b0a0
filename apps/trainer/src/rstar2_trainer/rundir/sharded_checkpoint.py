"""Sharded checkpoints of an FSDP2 model and its optimizer, with torch.distributed.checkpoint.

A checkpoint is a folder `step_000012/` holding DCP's files (one `__<rank>_0.distcp` per saving
rank plus `.metadata`, which records every tensor's global shape) and `state.json` (the step and
whatever the caller adds). Because DCP stores global shapes and each loader asks only for its own
shards, a checkpoint saved by N ranks loads on M ranks, and into a plain unsharded model in a
process with no process group at all. Like `checkpoint.py`, it is written under a temporary name
(DCP fsyncs each rank's file), and after every rank has finished, rank 0 writes `state.json` and
`manifest.json` (every file's size: a shard's checksum would mean reading the whole sharded state
again in one process), fsyncs the folder, renames it into place and replaces `latest`
atomically; a killed run leaves the previous complete checkpoint. A disk that refuses a rank's
shard (full, over quota) fails the save on every rank (DCP gathers the ranks' write results):
rank 0 removes the temporary folder and each rank raises `CheckpointError` with one line, the
earlier checkpoints untouched. Pruning to `keep` follows a complete save only and never removes
the folder just written.

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

from rstar2_trainer.rundir.checkpoint import commit, point_latest, prune
from rstar2_trainer.rundir.manifest import FORMAT, CheckpointError, os_error, write_manifest

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
    try:
        _dcp(dcp_save, content, tmp)
        _barrier()
        if _rank() == 0:
            body = {"step": step, "format": FORMAT, **(state or {})}
            (tmp / "state.json").write_text(json.dumps(body, indent=2))
            write_manifest(tmp, checksums=False)
            commit(tmp, final)
            point_latest(root, final.name)
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        error = os_error(exc) if isinstance(exc, Exception) else _shard_os_error(exc)
        if error is None:
            raise
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        where = f" ({error.filename})" if error.filename else ""
        raise CheckpointError(
            f"could not write the training workers' checkpoint step {step}: "
            f"{error.strerror or error}{where}; the earlier ones are intact"
        ) from exc
    if _rank() == 0:
        prune(root, keep, final)
    _barrier()
    return final


def _shard_os_error(exc: BaseException) -> OSError | None:
    """The first rank's OS error inside DCP's CheckpointException (it gathers every rank's)."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return None
    for failure in failures.values():  # rank: (exception, traceback)
        first = failure[0] if isinstance(failure, tuple) else failure
        error = os_error(first) if isinstance(first, BaseException) else None
        if error is not None:
            return error
    return None


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
    state = json.loads((path / "state.json").read_text())
    state.pop("format", None)  # the manifest's promise, not the caller's state
    return state

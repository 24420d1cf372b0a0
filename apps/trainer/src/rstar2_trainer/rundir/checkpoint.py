"""Checkpoints that cannot lie: model, optimizer, RNG states, data position, curriculum, step.

A checkpoint is a folder `checkpoints/step_000012/` holding `model.pt`, `optimizer.pt`,
`rng.pt`, `state.json` and `manifest.json` (manifest.py: every file's size and CRC32). It is
written under a temporary name, every file and the folder fsynced, the manifest last, then
renamed into place; the `checkpoints/latest` pointer is replaced atomically after it and the
folder fsynced again. A run killed at any instant leaves the previous complete checkpoint or
the new one. A run whose policy lives on FSDP2 training workers saves no `model.pt` /
`optimizer.pt` here (`model=None`): the workers' sharded checkpoint of the same step under
`checkpoints/workers/` holds them (sharded_checkpoint.py), and a driver checkpoint without
`model.pt` is good only when that one is too.

Reading: `newest_good` takes the checkpoint `latest` points at, or, when it does not check out
(a file missing, a size or checksum that differs: a disk that lost or flipped bytes), the newest
older one that does, with one line for each one skipped. A checkpoint written before manifests
existed (its state.json has no `format`) is taken when its files are there.

Saving: an OS error (a full disk, a quota, a file over the size limit) removes the temporary
folder, leaves every earlier checkpoint and `latest` as they were, and raises `CheckpointError`
with one line. Pruning (`keep`) runs only after the new checkpoint is complete, removes only
older folders, and never the one just written.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rstar2_trainer.rundir.manifest import (
    FORMAT,
    CheckpointError,
    check_manifest,
    fsync_dir,
    fsync_file,
    os_error,
    write_manifest,
)

TRAIN_WORKERS_DIR = "workers"  # the training ranks' sharded checkpoints, beside the driver's


@dataclass
class Checkpoint:
    """What `load_checkpoint` returns."""

    path: Path
    step: int
    state: dict[str, Any]
    model: dict[str, torch.Tensor] | None  # None: the training workers' checkpoint holds it
    optimizer: dict[str, Any] | None


@dataclass
class GoodCheckpoint:
    """The checkpoint a resume takes (`path` None: there is none) and the newer ones skipped."""

    path: Path | None
    step: int | None
    skipped: list[str] = field(default_factory=list)  # one line per bad checkpoint passed over


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


def _torch_save(obj: Any, path: Path) -> None:
    """torch.save through a Python file, so that a full disk is an OSError with its errno
    (torch's own writer turns it into a RuntimeError without one)."""
    with path.open("wb") as f:
        torch.save(obj, f)


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` (see the module docstring), point `latest` at it, prune to the
    newest `keep`; `CheckpointError` when the disk refuses it (the earlier ones untouched)."""
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if model is not None:
            _torch_save(model.state_dict(), tmp / "model.pt")
        if optimizer is not None:
            _torch_save(optimizer.state_dict(), tmp / "optimizer.pt")
        _torch_save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, "format": FORMAT, **state}))
        write_manifest(tmp, checksums=True)
        commit(tmp, final)
        point_latest(root, final.name)
    except Exception as exc:
        error = os_error(exc)
        if error is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(save_failed(root, step, error)) from exc
    prune(root, keep, final)
    return final


def save_failed(root: Path, step: int, error: OSError) -> str:
    """The one line for a checkpoint the disk refused: why, and what is still there."""
    good = newest_good(root, checksums=False)
    intact = f"checkpoint step {good.step} is intact" if good.path else "no earlier checkpoint"
    where = f" ({error.filename})" if error.filename else ""
    return f"could not write checkpoint step {step}: {error.strerror or error}{where}; {intact}"


def commit(tmp: Path, final: Path) -> None:
    """Rename the complete folder `tmp` to `final`, fsynced. A folder already at `final` (a step
    redone after a resume from an older checkpoint) is set aside first and removed after."""
    old = final.with_name(".old_" + final.name)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def point_latest(root: Path, name: str) -> None:
    """`root/latest` holds `name`, replaced atomically and fsynced."""
    pointer = root / ".latest.tmp"
    pointer.write_text(name)
    fsync_file(pointer)
    pointer.replace(root / "latest")
    fsync_dir(root)


def prune(root: Path, keep: int, newest: Path) -> None:
    """Remove step folders older than the newest `keep`; never `newest` (just written) or a later
    one, and nothing at all when `newest` does not check out."""
    if check_manifest(newest, checksums=False) is not None:
        return
    folders = sorted(root.glob("step_*"))
    for old in folders[:-keep]:
        if old.name < newest.name:
            shutil.rmtree(old, ignore_errors=True)


def check_checkpoint(path: Path, *, checksums: bool = True) -> str | None:
    """None when checkpoint folder `path` is complete (and, for a run on training workers, their
    shards of the same step too); otherwise what is wrong, in a few words."""
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as exc:
        return f"state.json cannot be read ({type(exc).__name__})"
    if state.get("format", 1) >= FORMAT:
        why = check_manifest(path, checksums=checksums)
        if why is not None:
            return why
    elif not (path / "rng.pt").is_file():
        return "rng.pt is missing"
    if (path / "model.pt").is_file():
        return None
    shards = path.parent / TRAIN_WORKERS_DIR / path.name
    if not (shards / ".metadata").is_file():
        return (
            f"neither model.pt nor the training workers' shards ({TRAIN_WORKERS_DIR}/{path.name})"
        )
    try:
        sharded = json.loads((shards / "state.json").read_text())
    except (OSError, ValueError):
        return f"{TRAIN_WORKERS_DIR}/{path.name}/state.json cannot be read"
    if sharded.get("format", 1) >= FORMAT:
        why = check_manifest(shards, checksums=False)
        if why is not None:
            return f"{TRAIN_WORKERS_DIR}/{path.name}: {why}"
    return None


def newest_good(root: Path, *, checksums: bool = True) -> GoodCheckpoint:
    """The checkpoint `latest` points at if it checks out, else the newest older one that does;
    folders newer than `latest` (a save cut before its pointer moved) are not considered."""
    folders = sorted(root.glob("step_*"), reverse=True)
    pointer = root / "latest"
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        if target in folders:
            folders = folders[folders.index(target) :]
    skipped = []
    for path in folders:
        why = check_checkpoint(path, checksums=checksums)
        if why is None:
            state = json.loads((path / "state.json").read_text())
            return GoodCheckpoint(path, int(state["step"]), skipped)
        skipped.append(f"checkpoint {path.name} is incomplete or corrupt ({why}); skipped")
    return GoodCheckpoint(None, None, skipped)


def latest_step(root: Path) -> int | None:
    """The step of the checkpoint a resume takes (`newest_good`), without loading it."""
    return newest_good(root).step


def load_checkpoint(path: Path) -> Checkpoint:
    """Checkpoint folder `path`, its RNG state restored."""
    state = json.loads((path / "state.json").read_text())
    state.pop("format", None)  # the manifest's promise, not the run's state
    model_path = path / "model.pt"
    model = torch.load(model_path, weights_only=True) if model_path.exists() else None
    opt_path = path / "optimizer.pt"
    optimizer = torch.load(opt_path, weights_only=True) if opt_path.exists() else None
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return Checkpoint(
        path=path, step=int(state["step"]), state=state, model=model, optimizer=optimizer
    )


def load_latest(root: Path) -> Checkpoint | None:
    """The checkpoint a resume takes (`newest_good`; RNG state restored), or None."""
    good = newest_good(root)
    return load_checkpoint(good.path) if good.path is not None else None


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
    for path in tmp.rglob("*"):
        if path.is_file():
            fsync_file(path)
    fsync_dir(tmp)
    commit(tmp, out)
    return out

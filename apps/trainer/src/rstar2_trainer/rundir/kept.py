"""What a run directory keeps, read back: the config it was written with, its kept checkpoints,
its model folder and a checkpoint's weights (the driver's `model.pt` or the training workers'
shards, gathered in this process). `rstar2-train --export` and `--init-from` build on these;
every mistake a user can make here is a ConfigError of one line.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from rstar2_trainer.config import (
    ConfigError,
    PretrainedModelConfig,
    TrainerConfig,
    validate_config,
)
from rstar2_trainer.rundir.checkpoint import TRAIN_WORKERS_DIR
from rstar2_trainer.rundir.sharded_checkpoint import load_sharded


def read_run(run_dir: Path) -> TrainerConfig:
    """The config a run directory was written with; ConfigError when it is not a run's."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml in it)")
    return validate_config(yaml.safe_load(saved.read_text()), str(saved))


def kept_steps(run_dir: Path) -> list[int]:
    return sorted(
        int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*")
    )


def find_checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    """The folder and step of checkpoint `step` (None: the latest) of `run_dir`; ConfigError,
    listing the kept steps, when there is none."""
    checkpoints = run_dir / "checkpoints"
    if step is None:
        pointer = checkpoints / "latest"
        if not pointer.is_file():
            raise ConfigError(f"{run_dir} has no checkpoint yet")
        path = checkpoints / pointer.read_text().strip()
        step = int(path.name.removeprefix("step_"))
    else:
        path = checkpoints / f"step_{step:06d}"
    if not path.is_dir():
        raise ConfigError(
            f"{run_dir} keeps no checkpoint of step {step} (kept: {kept_steps(run_dir) or 'none'}; "
            "run.keep_checkpoints sets how many are kept)"
        )
    return path, step


def model_dir_of(run_dir: Path, config: TrainerConfig) -> Path:
    """The run's model folder (architecture and tokenizer): the tiny model as built, or the
    pretrained path."""
    if isinstance(config.model, PretrainedModelConfig):
        model_dir = Path(config.model.path)
    else:
        model_dir = run_dir / "model"
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"the run's model folder {model_dir} is missing")
    return model_dir


def check_weights(path: Path) -> None:
    """ConfigError unless checkpoint `path` holds weights (the driver's or the workers')."""
    shards = path.parent / TRAIN_WORKERS_DIR / path.name
    if not (path / "model.pt").is_file() and not (shards / ".metadata").is_file():
        raise ConfigError(
            f"checkpoint {path.name} holds no weights: neither {path.name}/model.pt nor the "
            f"training workers' shards in checkpoints/{TRAIN_WORKERS_DIR}/{path.name}"
        )


def load_weights(path: Path, model: torch.nn.Module) -> None:
    """Checkpoint `path`'s weights into `model` (unsharded, in this process)."""
    weights = path / "model.pt"
    if weights.is_file():
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    else:
        load_sharded(path.parent / TRAIN_WORKERS_DIR / path.name, model=model, optimizer=None)

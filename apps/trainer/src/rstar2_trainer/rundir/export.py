"""`rstar2-train --export RUN_DIR [--step N] [--to OUT]`: any checkpoint as a policy folder.

A run writes its final weights to `RUN_DIR/policy`; this writes the weights of any kept
checkpoint (`run.keep_checkpoints`) the same way, so `rstar2-eval run` can compare, say, the
policy after SFT (step 0) with the one after RL on the run's own held-out problems
(`RUN_DIR/heldout.jsonl`). Nothing is trained or started: the checkpoint's `model.pt` is loaded
into the run's model folder (the tiny model as built, or the pretrained path) and saved with its
tokenizer and `rstar2.json`.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from rstar2_trainer.config import ConfigError, PretrainedModelConfig, TrainerConfig


def export_checkpoint(run_dir: Path, step: int | None = None, out: Path | None = None) -> Path:
    """Write checkpoint `step` (default: the latest) of `run_dir` as a Hugging Face folder.

    Raises ConfigError, with a message that says what to do, for anything the user can fix.
    """
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml in it)")
    config = TrainerConfig.model_validate(yaml.safe_load(saved.read_text()))
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
        kept = sorted(int(p.name.removeprefix("step_")) for p in checkpoints.glob("step_*"))
        raise ConfigError(
            f"{run_dir} keeps no checkpoint of step {step} (kept: {kept or 'none'}; "
            "run.keep_checkpoints sets how many are kept)"
        )
    weights = path / "model.pt"
    if not weights.is_file():
        raise ConfigError(
            f"checkpoint {path.name} holds no driver weights: the run trained on FSDP2 workers "
            f"(their shards are in checkpoints/workers/{path.name})"
        )
    if isinstance(config.model, PretrainedModelConfig):
        model_dir = Path(config.model.path)
    else:
        model_dir = run_dir / "model"
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"the run's model folder {model_dir} is missing")

    out = out if out is not None else run_dir / f"policy_step_{step:06d}"
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise ConfigError(f"cannot write {out}: {out.parent} is not a writable folder")

    import torch

    from rstar2_trainer.placement.local import load_policy
    from rstar2_trainer.rundir.checkpoint import save_policy

    model, tokenizer = load_policy(model_dir)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    style = config.rollout.system_prompt
    try:
        return save_policy(model, tokenizer, out, system_prompt=style, step=step)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from exc

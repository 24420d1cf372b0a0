"""`rstar2-train --export RUN_DIR [--step N] [--to OUT]`: any checkpoint as a policy folder.

A run writes its final weights to `RUN_DIR/policy`; this writes the weights of any kept
checkpoint (`run.keep_checkpoints`) the same way, so `rstar2-eval run` can compare, say, the
policy after SFT (step 0) with the one after RL on the run's own held-out problems
(`RUN_DIR/heldout.jsonl`). Nothing is trained or started: the checkpoint's weights are loaded
into the run's model folder (the tiny model as built, or the pretrained path) and saved as
safetensors with its tokenizer and `rstar2.json`. The weights are the driver's `model.pt`, or,
for a run that trained on FSDP2 workers (`cluster.train_workers`), the workers' DCP shards in
`checkpoints/workers/step_N/`, gathered in this process with no process group
(`sharded_checkpoint.load_sharded`; the whole model must fit in this machine's memory).

A LoRA run's checkpoint holds its adapters: the export is a PEFT adapter folder whose
`adapter_config.json` names the run's base folder (`base_model_name_or_path`), or with `merged`
the base with the adapter merged in (PEFT's `merge_and_unload`), a model folder like a full
run's. `merged_policy_dir(run_dir, step, out)` is the latter, for `--init-from` a LoRA run.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rstar2_trainer.config import ConfigError, TrainerConfig
from rstar2_trainer.rundir.checkpoint import TRAIN_WORKERS_DIR
from rstar2_trainer.rundir.kept import (
    check_weights,
    find_checkpoint,
    load_weights,
    model_dir_of,
    read_run,
)
from rstar2_trainer.rundir.sharded_checkpoint import load_sharded


def _lora_model(config: TrainerConfig, model_dir: Path, path: Path) -> torch.nn.Module:
    """The run's base (fp32) with checkpoint `path`'s adapters, in this process."""
    from rstar2_trainer.placement.local import load_model
    from rstar2_trainer.training import lora

    settings = config.model.lora
    model, _ = load_model(model_dir)
    model = lora.apply_lora(model, settings, base_path=model_dir)
    weights = path / "model.pt"
    if weights.is_file():
        state = torch.load(weights, map_location="cpu", weights_only=True)
        lora.load_trainable_state(model, state)
    else:
        load_sharded(path.parent / TRAIN_WORKERS_DIR / path.name, model=model, optimizer=None)
    return model


def export_checkpoint(
    run_dir: Path, step: int | None = None, out: Path | None = None, *, merged: bool = False
) -> Path:
    """Write checkpoint `step` (default: the latest) of `run_dir` as a Hugging Face folder.

    Raises ConfigError, with a message that says what to do, for anything the user can fix.
    """
    config = read_run(run_dir)
    path, step = find_checkpoint(run_dir, step)
    check_weights(path)
    model_dir = model_dir_of(run_dir, config)
    out = out if out is not None else run_dir / f"policy_step_{step:06d}"
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise ConfigError(f"cannot write {out}: {out.parent} is not a writable folder")

    from rstar2_trainer.placement.local import load_model
    from rstar2_trainer.rundir.checkpoint import save_adapter_policy, save_policy
    from rstar2_trainer.training import lora

    style = config.rollout.system_prompt
    if getattr(config.model, "lora", None) is None:
        if merged:
            raise ConfigError(f"--merged: {run_dir} trained full weights, not a LoRA adapter")
        model, tokenizer = load_model(model_dir)
        load_weights(path, model)
    else:
        _, tokenizer = load_model(model_dir, weights=False)
        model = _lora_model(config, model_dir, path)
        if not merged:
            adapter = lora.as_adapter(model, torch.float32, model_dir)
            try:
                return save_adapter_policy(adapter, tokenizer, out, system_prompt=style, step=step)
            except OSError as exc:
                raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from exc
        model = model.merge_and_unload()  # type: ignore[operator]
    try:
        return save_policy(model, tokenizer, out, system_prompt=style, step=step)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from exc

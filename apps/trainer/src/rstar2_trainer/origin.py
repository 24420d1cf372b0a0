"""A new run from another run's checkpoint: `rstar2-train RECIPE ... --init-from RUN_DIR[:STEP]`.

The new run has its own config and run directory; its `init` section (`InitConfig`) names the
origin, and is written into its config.yaml with the step resolved (provenance). It differs from
a fresh run only at the start: SFT is skipped, the policy takes the checkpoint's weights (the
driver's `model.pt` or the FSDP2 workers' shards), optionally its optimizer state and its
curriculum state, is evaluated (`when: init`) and saved as step 0; RL then runs as configured.
Step numbers, the RNG and the learning-rate warm-up start afresh. A tiny model's folder (its
architecture and the tokenizer trained for it) is copied from the origin, so the token ids mean
the same. A LoRA run takes the origin's weights as its base (`RUN_DIR/base`; a LoRA origin's
merged) and starts fresh adapters on it (no optimizer state can be included).

`resolve_origin` checks everything before the run directory exists and raises ConfigError with
one line for: not a run directory, no such step (the kept ones listed), a model whose
architecture differs, an optimizer state of the other kind of policy (driver vs FSDP2 workers),
a curriculum state of another setup. Not covered: an origin whose pretrained model folder has
moved since (its config.yaml names the path).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rstar2_trainer.config import ConfigError, InitConfig, PretrainedModelConfig, TrainerConfig
from rstar2_trainer.data import RunData
from rstar2_trainer.rundir.checkpoint import TRAIN_WORKERS_DIR
from rstar2_trainer.rundir.kept import check_weights, find_checkpoint, model_dir_of, read_run

# config.json keys that fix the shapes of the weights
_ARCHITECTURE = (
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


def parse_init_from(value: str, include: str | None) -> list[str]:
    """`RUN_DIR[:STEP]` and `optimizer,curriculum` as `init.*` overrides."""
    run, sep, step = value.rpartition(":")
    if not sep or not step.isdigit():
        run, step = value, ""
    overrides = [f"init.run={run}"]
    if step:
        overrides.append(f"init.step={int(step)}")
    if include:
        overrides.append(f"init.include=[{include}]")
    return overrides


def _architecture(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    return {k: config.get(k) for k in _ARCHITECTURE}


def _check_model(config: TrainerConfig, origin: TrainerConfig, origin_dir: Path) -> None:
    """ConfigError when the new run's model is not the origin's architecture."""
    ours, theirs = config.model, origin.model
    if isinstance(ours, PretrainedModelConfig):
        here = Path(ours.path)
        if not (here / "config.json").is_file():
            raise ConfigError(f"model.path {here} is not a model folder (no config.json)")
        mine, other = _architecture(here), _architecture(model_dir_of(origin_dir, origin))
        differ = [
            f"{k} {mine[k]} here, {other[k]} there" for k in _ARCHITECTURE if mine[k] != other[k]
        ]
        if differ:
            raise ConfigError(
                f"--init-from {origin_dir}: the model's architecture differs ({'; '.join(differ)})"
            )
        return
    if isinstance(theirs, PretrainedModelConfig):
        raise ConfigError(
            f"--init-from {origin_dir}: that run trained the pretrained model {theirs.path}; "
            f"set model={{kind: pretrained, path: {theirs.path}}}"
        )
    mine, other = ours.model_dump(exclude={"lora"}), theirs.model_dump(exclude={"lora"})
    differ = [f"model.{k} {mine[k]} here, {other[k]} there" for k in mine if mine[k] != other[k]]
    if differ:
        raise ConfigError(
            f"--init-from {origin_dir}: the model's architecture differs ({'; '.join(differ)}); "
            "drop those overrides"
        )


def resolve_origin(config: TrainerConfig, data: RunData) -> TrainerConfig:
    """Check `config.init` (module docstring) and return the config with the step it takes.

    With `curriculum` included, the origin's curriculum state is loaded into `data`'s curriculum
    here, so a state of another setup is refused before anything starts."""
    init = config.init
    assert init is not None
    origin = read_run(init.run)
    path, step = find_checkpoint(init.run, init.step)
    check_weights(path)
    model_dir_of(init.run, origin)  # its model folder (architecture, tokenizer) is still there
    _check_model(config, origin, init.run)
    state = json.loads((path / "state.json").read_text())
    workers = config.cluster is not None and config.cluster.train_workers > 0
    if "optimizer" in init.include:
        has = (
            (path.parent / TRAIN_WORKERS_DIR / path.name / ".metadata").is_file()
            if workers
            else (path / "optimizer.pt").is_file()
        )
        if not has:
            where = "FSDP2 workers" if workers else "the driver"
            raise ConfigError(
                f"--init-from {init.run}:{step}: this run trains in {where}, and that checkpoint "
                "holds no optimizer state of that kind; drop optimizer from --init-include"
            )
    if "curriculum" in init.include:
        try:
            data.prepared.curriculum.load_state_dict(state["curriculum"])
        except ValueError as exc:
            raise ConfigError(
                f"--init-from {init.run}:{step}: its curriculum state does not fit this run "
                f"({exc}); drop curriculum from --init-include"
            ) from None
    resolved = InitConfig(run=init.run, step=step, include=init.include)
    return config.model_copy(update={"init": resolved})


def copy_model_dir(config: TrainerConfig, run_dir: Path) -> None:
    """A tiny model's folder (architecture, tokenizer) from the origin into the new run; for a
    LoRA run, the origin checkpoint's weights (a LoRA origin's merged) as its base folder,
    `RUN_DIR/base`, which its engines and policy load (placement/local.py)."""
    init = config.init
    if init is None:
        return
    lora_run = getattr(config.model, "lora", None) is not None
    if lora_run and not (run_dir / "base" / "config.json").exists():
        from rstar2_trainer.export import export_checkpoint

        lora_origin = getattr(read_run(init.run).model, "lora", None) is not None
        export_checkpoint(init.run, init.step, run_dir / "base", merged=lora_origin)
    if isinstance(config.model, PretrainedModelConfig):
        return
    if not (run_dir / "model" / "config.json").exists():
        shutil.copytree(init.run / "model", run_dir / "model", dirs_exist_ok=True)


def origin_checkpoint(config: TrainerConfig) -> Any:
    """The origin's checkpoint as `checkpoint.Checkpoint` (weights, and the optimizer state when
    included), for `Policy.restore`; the RNG state is left alone."""
    import torch

    from rstar2_trainer.rundir.checkpoint import Checkpoint

    init = config.init
    assert init is not None and init.step is not None
    path = init.run / "checkpoints" / f"step_{init.step:06d}"
    state = json.loads((path / "state.json").read_text())
    model = optimizer = None
    if (path / "model.pt").is_file():
        model = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
    if "optimizer" in init.include and (path / "optimizer.pt").is_file():
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    return Checkpoint(path=path, step=init.step, state=state, model=model, optimizer=optimizer)

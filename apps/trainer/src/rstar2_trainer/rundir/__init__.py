"""The run directory: resolved config, metrics.jsonl, plots, logs, checkpoints.

Layout of a run directory:

    config.yaml          the resolved TrainerConfig (what actually ran)
    config.schema.json   its JSON schema
    metrics.jsonl        one JSON object per logged event ({"phase": ..., "step": ..., ...})
    tb/ wandb/ mlruns/   the other trackers' files, and tracking.json (see tracking.py)
    logs/run.log         what the libraries and child processes say (see logs.py)
    plots/*.png          the main curves, redrawn at the end of the run
    checkpoints/         see checkpoint.py

The metrics file is append-only and flushed per line, so a killed run loses at most the line
being written; on resume, lines past the restored step are dropped so no step appears twice.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh, unique folder under `root` named after the run and the time."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        path = root / (f"{name}-{stamp}" if i == 0 else f"{name}-{stamp}-{i}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a run directory under {root}")


def write_config(path: Path, config: BaseModel) -> None:
    """Write the resolved config as YAML and its JSON schema beside it."""
    data = json.loads(config.model_dump_json())
    (path / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    schema = type(config).model_json_schema()
    (path / "config.schema.json").write_text(json.dumps(schema, indent=2))


def clean(value: Any) -> Any:
    """A record as JSON can hold it: non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete line of metrics.jsonl (a torn last line from a kill is skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(run_dir: Path, *, rl_step: int) -> None:
    """Keep what a checkpoint at `rl_step` had already logged; drop later lines and torn ones.
    Every phase but SFT (which counts its own steps, all before the first checkpoint) counts RL
    steps."""
    kept = [
        r for r in read_metrics(run_dir) if r.get("phase") == "sft" or r.get("step", 0) <= rl_step
    ]
    tmp = run_dir / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    tmp.replace(run_dir / "metrics.jsonl")

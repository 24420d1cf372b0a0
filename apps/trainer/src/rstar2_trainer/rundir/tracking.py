"""Experiment trackers (`run.trackers`): where a run's metrics, resolved config and plots go.

Every tracker is handed the same things: each record the trainer logs, `(phase, step, metrics)`
(`sft` records count SFT steps, every other phase counts RL steps), the resolved config once per
tracked run, and the PNG plots at the end (`log_artifact`). Numbers become scalars named
`phase/key` (`benchmark/NAME/key` for a benchmark); JSONL keeps the whole record.

    jsonl        RUN_DIR/metrics.jsonl (config.yaml and plots/ are beside it already)
    tensorboard  RUN_DIR/tb (SFT in tb/sft), the config as text, the plots as images
    wandb        a Weights & Biases run, files in RUN_DIR/wandb (extra `wandb`)
    mlflow       an MLflow run, by default a file store in RUN_DIR/mlruns (extra `mlflow`)

Resume: `--resume` continues the same tracked runs, and no step is there twice.
- jsonl and tensorboard take back what followed the checkpoint: metrics.jsonl drops those lines,
  TensorBoard's writer opens with `purge_step` = checkpoint + 1, so it hides the old events.
- wandb and mlflow cannot take anything back, so once the run has a checkpoint they are sent a
  step's records when that step's checkpoint is on disk (`checkpointed`): what a resume redoes
  was never sent. With `run.checkpoint_every` N they trail by up to N steps; a run killed between
  checkpoints has its last steps in JSONL and TensorBoard only, until it is resumed. Their run ids
  are kept in RUN_DIR/tracking.json; wandb's own step counter continues from there (an offline
  resume writes a second offline-run folder with the same id, which `wandb sync` appends).
- A resume before the first checkpoint starts the run over, and every tracker with it (new
  wandb and MLflow runs; the old ones stay, unfinished).

Not covered: logging the trajectories themselves, system metrics beyond what wandb collects.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rstar2_trainer.config import ConfigError, MlflowSettings, RunConfig, WandbSettings
from rstar2_trainer.rundir import clean, read_metrics, truncate_metrics

STATE = "tracking.json"
_EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}  # tracker: the module its extra installs


class Tracker(Protocol):
    """One destination of a run's records. Built for a new run (`resume` None) or to continue
    the tracked run of a checkpoint at step `resume`."""

    rewinds: ClassVar[bool]  # True: on resume it drops what followed the checkpoint itself

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def close(self, ok: bool) -> None: ...


def check_trackers(run: RunConfig) -> None:
    """A tracker whose extra is not installed, as one line naming the extra."""
    for name in run.trackers:
        module = _EXTRAS.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"run.trackers has {name}, which needs the {name} extra: "
                f'pip install "rstar2-trainer[{name}]"'
            )


def scalars(phase: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a record, named `phase/key` (`benchmark/NAME/key`)."""
    prefix = f"{phase}/{metrics['benchmark']}" if phase == "benchmark" else phase
    return {
        f"{prefix}/{key}": float(value)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE
    return json.loads(path.read_text()) if path.exists() else {}


def _save_state(run_dir: Path, key: str, value: Any) -> None:
    state = read_state(run_dir) | {key: value}
    tmp = run_dir / f"{STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(run_dir / STATE)


class JsonlTracker:
    """RUN_DIR/metrics.jsonl, appended and flushed per record."""

    rewinds: ClassVar[bool] = True

    def __init__(self, run_dir: Path, resume: int | None) -> None:
        self.path = run_dir / "metrics.jsonl"
        if resume is None:
            self.path.unlink(missing_ok=True)
        else:
            truncate_metrics(run_dir, rl_step=resume)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"phase": phase, "step": step, "time": time.time(), **clean(dict(metrics))}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass  # RUN_DIR/config.yaml

    def log_artifact(self, path: Path) -> None:
        pass  # already in the run directory

    def close(self, ok: bool) -> None:
        self._file.close()


class TensorBoardTracker:
    """RUN_DIR/tb (RL, evaluations) and RUN_DIR/tb/sft: SFT counts its own steps, which a purge
    at an RL step would cut."""

    rewinds: ClassVar[bool] = True

    def __init__(self, run_dir: Path, resume: int | None) -> None:
        self.root = run_dir / "tb"
        if resume is None:
            shutil.rmtree(self.root, ignore_errors=True)
        self._purge = None if resume is None else resume + 1
        self._step = resume or 0  # the RL step the plots are shown at
        self._writers: dict[str, Any] = {}

    def _writer(self, sub: str) -> Any:
        if sub not in self._writers:
            from torch.utils.tensorboard import SummaryWriter

            purge = self._purge if sub == "" else None
            self._writers[sub] = SummaryWriter(str(self.root / sub), purge_step=purge)
        return self._writers[sub]

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        writer = self._writer("sft" if phase == "sft" else "")
        if phase != "sft":
            self._step = max(self._step, step)
        for key, value in scalars(phase, metrics).items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        text = yaml.safe_dump(dict(config), sort_keys=False)
        self._writer("").add_text("config", "```yaml\n" + text + "```", 0)

    def log_artifact(self, path: Path) -> None:
        if path.suffix != ".png":
            return
        import matplotlib.image

        image = matplotlib.image.imread(str(path))[..., :3]  # [H, W, RGB]
        writer = self._writer("")
        writer.add_image(f"plots/{path.stem}", image, self._step, dataformats="HWC")
        writer.flush()

    def close(self, ok: bool) -> None:
        for writer in self._writers.values():
            writer.close()


class WandbTracker:
    """A Weights & Biases run in RUN_DIR/wandb; the run id and the next step in tracking.json.

    wandb's step counts records (steps must grow; SFT and RL steps both start at 1), and each
    phase's charts use `phase/step` as their x axis."""

    rewinds: ClassVar[bool] = False

    def __init__(self, run_dir: Path, settings: WandbSettings, resume: int | None) -> None:
        import wandb

        self._wandb = wandb
        self._run_dir = run_dir
        state = read_state(run_dir).get("wandb") if resume is not None else None
        self._id = state["id"] if state else secrets.token_hex(4)
        self._step = state["step"] if state else 0
        self._save()
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            name=run_dir.name,
            id=self._id,
            resume="allow" if state else None,
            dir=str(run_dir),
            mode=settings.mode,
            settings=wandb.Settings(silent=True, console="off"),
        )
        self._phases: set[str] = set()

    def _save(self) -> None:
        _save_state(self._run_dir, "wandb", {"id": self._id, "step": self._step})

    def _log(self, values: dict[str, Any]) -> None:
        step = self._step
        self._step += 1
        self._save()  # before sending: a kill in between skips a step number, never reuses one
        self.run.log(values, step=step)

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        if phase not in self._phases:
            self._phases.add(phase)
            self.run.define_metric(f"{phase}/step", hidden=True)
            self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
        self._log({**scalars(phase, metrics), f"{phase}/step": step})

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_artifact(self, path: Path) -> None:
        if path.suffix == ".png":
            self._log({f"plots/{path.stem}": self._wandb.Image(str(path))})
        else:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self, ok: bool) -> None:
        offline = self.run.settings.mode == "offline"
        where = Path(self.run.dir).parent
        self.run.finish(exit_code=0 if ok else 1)
        if offline:
            from rstar2_trainer.rundir.report import console

            console.print(f"wandb (offline): upload the run with `wandb sync {where}`")


class MlflowTracker:
    """An MLflow run; its id in tracking.json. The default store is files in RUN_DIR/mlruns,
    which MLflow 3.17 keeps in maintenance mode and refuses unless MLFLOW_ALLOW_FILE_STORE is
    true: for that default the tracker sets it (a `tracking_uri` of the user's is left as is)."""

    rewinds: ClassVar[bool] = False

    def __init__(self, run_dir: Path, settings: MlflowSettings, resume: int | None) -> None:
        from mlflow.tracking import MlflowClient

        uri = settings.tracking_uri
        if uri is None:
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        state = read_state(run_dir).get("mlflow") if resume is not None else None
        if state:
            self.run_id = state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(settings.experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(settings.experiment)
            )
            run = self.client.create_run(experiment_id, run_name=run_dir.name)
            self.run_id = run.info.run_id
            _save_state(run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": uri})

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), v, now, step) for k, v in scalars(phase, metrics).items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(_mlflow_key(k), str(v)[:6000]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_dict(self.run_id, dict(config), "config.yaml")

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), "plots" if path.suffix == ".png" else None)

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")


def _mlflow_key(key: str) -> str:
    return re.sub(r"[^\w\-./ ]", "_", key)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class MetricsLog:
    """Every record to every tracker of the run. Trackers that cannot rewind get a record once
    the run's next checkpoint holds it (before the first checkpoint at once: a resume then starts
    over, in new tracked runs)."""

    def __init__(self, trackers: list[Tracker], *, checkpointed: bool) -> None:
        self.trackers = trackers
        self._hold = checkpointed
        self._pending: list[tuple[str, int, dict[str, Any]]] = []
        self.records: list[dict[str, Any]] = []  # this process's, for plots without jsonl

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        self.records.append({"phase": phase, "step": step, **metrics})
        for tracker in self.trackers:
            if tracker.rewinds:
                tracker.log(phase, step, metrics)
        if self._hold:
            self._pending.append((phase, step, dict(metrics)))
        else:
            self._send(phase, step, metrics)

    def checkpointed(self, step: int) -> None:
        """A checkpoint at `step` is on disk: what was held back is sent."""
        self._hold = True
        for record in self._pending:
            self._send(*record)
        self._pending.clear()

    def _send(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            if not tracker.rewinds:
                tracker.log(phase, step, metrics)

    def log_artifact(self, path: Path) -> None:
        for tracker in self.trackers:
            tracker.log_artifact(path)

    def close(self, ok: bool) -> None:
        """Close every tracker; records after the last checkpoint stay unsent unless `ok`."""
        if ok:
            self.checkpointed(-1)
        for tracker in self.trackers:
            tracker.close(ok)


def open_trackers(
    run_dir: Path, run: RunConfig, config: Mapping[str, Any], *, resume: int | None
) -> MetricsLog:
    """The trackers of `run.trackers`: new tracked runs (`resume` None, the config logged), or
    those of the run's checkpoint at step `resume` continued."""
    trackers: list[Tracker] = []
    try:
        for name in run.trackers:
            if name == "jsonl":
                trackers.append(JsonlTracker(run_dir, resume))
            elif name == "tensorboard":
                trackers.append(TensorBoardTracker(run_dir, resume))
            elif name == "wandb":
                trackers.append(WandbTracker(run_dir, run.wandb, resume))
            else:
                trackers.append(MlflowTracker(run_dir, run.mlflow, resume))
        for tracker in trackers:
            # A resumed wandb run gets the config again: the killed part's config record may
            # have died in wandb's service buffers (updating it with the same values is a no-op).
            if resume is None or isinstance(tracker, WandbTracker):
                tracker.log_config(config)
    except BaseException:
        for tracker in trackers:
            tracker.close(False)
        raise
    return MetricsLog(trackers, checkpointed=resume is not None)


def plot_records(run_dir: Path, log: MetricsLog) -> list[dict[str, Any]]:
    """What the plots draw: metrics.jsonl where the run keeps it, else this process's records."""
    kept = any(isinstance(t, JsonlTracker) for t in log.trackers)
    return read_metrics(run_dir) if kept else log.records

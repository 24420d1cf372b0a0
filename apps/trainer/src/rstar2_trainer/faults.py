"""Which failures a run restarts itself from (`run.max_restarts`), decided in one place.

`restart_reason(exc)` names the failure when the run may tear its parts down and resume from its
newest good checkpoint, as `--resume` would, and returns None when a restart would only repeat
it. Restartable, because the parts a restart builds anew are what failed:

    dead rank      a Ray actor (training rank, colocated rank + engine, engine) died or became
                   unreachable: RayActorError (ActorDiedError, ActorUnavailableError),
                   WorkerCrashedError; the rank group's `RankError` (a rank found gone)
    lost node      NodeDiedError, LocalRayletDiedError, OwnerDiedError, ObjectLostError
    collective     a collective or the weight channel gave up: torch's DistBackendError,
                   DistNetworkError, DistStoreError; a Ray channel timeout
    out of memory  torch.OutOfMemoryError in a rank, Ray's OutOfMemoryError (its memory monitor
                   killed a worker)
    engines        every engine gone, or a weight sync that failed (`engines.EngineError`)
    service        a sandbox or verify server dead for good (`ServerError` marked restartable),
                   or one that answered UNAVAILABLE for `run.service_retry_s`

A task's exception raised inside a Ray actor arrives wrapped (`RayTaskError`); its cause is what
is judged. Not restartable: a checkpoint the disk refused (`CheckpointError`: a restart would
fill the same disk), a service that could not start (a port in use), a config or data mistake,
a preemption, Ctrl-C, and anything else (most likely a bug, which a restart would repeat).
`plan_restart` decides for the restart loop (restarts.py): a restartable failure, restarts left
(`run.max_restarts`), no SIGTERM pending, and a checkpoint to resume from (before checkpoint 0
a restart would redo SFT, as `--resume` does: the run ends instead); it records the restart
(`restart` in metrics.jsonl: reason, failed and resumed step, `steps_lost`, the RL steps that
will run again) and prints one line. Not covered here: noticing a rank that hangs without failing (a collective's own timeout raises
one of the errors above), and restarting one part while the others go on (services restart
themselves: placement/servers.py, rstar2-sandbox's `ChildSandbox`; split placement's engine
actors too: placement/ray_engine.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.engines import EngineError
from rstar2_trainer.placement.servers import ServerError
from rstar2_trainer.preempt import Preemption
from rstar2_trainer.rundir import report
from rstar2_trainer.rundir.checkpoint import newest_good
from rstar2_trainer.training.train_workers import RankError

_RAY = {
    "RayActorError": "dead rank",
    "ActorDiedError": "dead rank",
    "ActorUnavailableError": "dead rank",
    "WorkerCrashedError": "dead rank",
    "NodeDiedError": "lost node",
    "LocalRayletDiedError": "lost node",
    "OwnerDiedError": "lost node",
    "ObjectLostError": "lost node",
    "RayChannelTimeoutError": "collective timeout",
    "OutOfMemoryError": "out of memory",
}
_TORCH = {
    "DistBackendError": "collective timeout",
    "DistNetworkError": "collective timeout",
    "DistStoreError": "collective timeout",
}


def restart_reason(exc: BaseException) -> str | None:
    """A few words naming `exc` when the run may restart from it (see the module docstring)."""
    cause = _unwrap(exc)
    if isinstance(cause, torch.OutOfMemoryError):
        return "out of memory"
    if isinstance(cause, ServerError):
        return "service down" if cause.restartable else None
    if isinstance(cause, EngineError):
        return "engines lost"
    if isinstance(cause, RankError):  # a rank's actor found gone by the rank group
        return "dead rank"
    if _grpc_unavailable(cause):
        return "service down"
    for kind in type(cause).__mro__:
        module = kind.__module__ or ""
        if module.startswith("ray.") and kind.__name__ in _RAY:
            return _RAY[kind.__name__]
        if module.startswith("torch.") and kind.__name__ in _TORCH:
            return _TORCH[kind.__name__]
    return None


@dataclass
class Control:
    """What outlives an attempt of the run (restarts.py): SIGTERM, the RL step reached, the
    restarts so far."""

    preemption: Preemption = field(default_factory=lambda: Preemption(300.0))  # not installed
    step: int | None = None  # the RL step in progress (or the checkpoint restored)
    restarts: int = 0
    restart: dict[str, Any] | None = None  # the record the next attempt logs first


def plan_restart(control: Control, exc: Exception, config: TrainerConfig, run_dir: Path) -> bool:
    """Whether the run restarts after `exc` (`restart_reason`, `run.max_restarts`, a
    checkpoint to resume from); if so the record the next attempt logs, and one console line."""
    reason = restart_reason(exc)
    if reason is None or control.preemption.requested:
        return False
    if control.restarts >= config.run.max_restarts:
        return False
    good = newest_good(run_dir / "checkpoints", checksums=False)
    if good.step is None:  # before checkpoint 0: `--resume` would start over too
        return False
    control.restarts += 1
    failed = control.step if control.step is not None else good.step
    lost = max(0, failed - good.step)
    error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    error = error.split("; the run can be resumed")[0][:300]  # it is being resumed
    control.restart = {
        "restart": control.restarts,
        "reason": reason,
        "error": error,
        "failed_step": failed,
        "resumed_step": good.step,
        "steps_lost": lost,
    }
    report.console.print(
        f"restart {control.restarts} of {config.run.max_restarts}: {reason} in RL step "
        f"{failed} ({error}); resuming from checkpoint step {good.step}, {lost} step(s) lost"
    )
    return True


def _unwrap(exc: BaseException) -> BaseException:
    """The exception inside Ray's task wrapper (`RayTaskError.cause`), or `exc`."""
    if "ray" in sys.modules:
        from ray.exceptions import RayTaskError

        while isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
            exc = exc.cause
    return exc


def _grpc_unavailable(exc: BaseException) -> bool:
    import grpc

    return isinstance(exc, grpc.RpcError) and getattr(exc, "code", lambda: None)() == (
        grpc.StatusCode.UNAVAILABLE
    )

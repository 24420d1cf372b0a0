"""The run as a whole: attempts of train.py's loop, restarted after what can be recovered.

`train(config, run_dir, resume=...)` runs one attempt (`attempt`: the newest good checkpoint when
resuming, the trackers continued from it, then `train.train_attempt`). When an attempt fails
with something faults.py calls restartable (a dead rank or engine actor, a lost node, a
collective that timed out, an out-of-memory, a service down for good), `faults.plan_restart`
records a `restart` (reason, failed and resumed step, steps lost) and the loop starts another
attempt from the newest good checkpoint, exactly as `--resume` would: every part (Ray actors,
ranks, engines, servers) was torn down by the failed attempt's context managers and is built
anew. At most `run.max_restarts` times; then, or for anything else, the exception propagates.

SIGTERM (preempt.py) is installed once for all attempts: a run cancelled by the grace period's
deadline exits as `Preempted` from its newest checkpoint.

Not covered: a failure before checkpoint 0 (a restart would redo SFT; the run ends), and a rank
that hangs without failing (its collective's timeout turns it into a failure first).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.data import RunData, load_run_data
from rstar2_trainer.faults import Control, plan_restart
from rstar2_trainer.preempt import Preempted, Preemption
from rstar2_trainer.rundir import report
from rstar2_trainer.rundir.checkpoint import GoodCheckpoint, newest_good
from rstar2_trainer.rundir.tracking import open_trackers, plot_records
from rstar2_trainer.train import train_attempt


async def train(
    config: TrainerConfig, run_dir: Path, *, resume: bool, data: RunData | None = None
) -> Path:
    """The run; after a failure it can recover from, again from the newest good checkpoint
    (`run.max_restarts`); `Preempted` after a SIGTERM."""
    torch.set_num_threads(config.run.torch_threads)
    control = Control(Preemption.install(config.run.preempt_grace_s))
    try:
        while True:
            try:
                await attempt(config, run_dir, resume, data, control)
                return run_dir
            except asyncio.CancelledError:
                if not control.preemption.expired:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                step = newest_good(run_dir / "checkpoints", checksums=False).step
                raise Preempted(step, saved=False) from None
            except Exception as exc:
                if not plan_restart(control, exc, config, run_dir):
                    raise
                resume, data = True, None  # the data again: the curriculum object was used
    finally:
        control.preemption.uninstall()


async def attempt(
    config: TrainerConfig, run_dir: Path, resume: bool, data: RunData | None, control: Control
) -> None:
    """One attempt of the run: a new start, or the newest good checkpoint restored."""
    if data is None:
        data = load_run_data(config, resume=resume)
    good = newest_good(run_dir / "checkpoints") if resume else GoodCheckpoint(None, None)
    for line in good.skipped:
        report.console.print(line)
    # The trackers continue the tracked run of the checkpoint: what was logged past it belongs
    # to the step being redone and goes; with no checkpoint yet the run starts over, and so do
    # its tracked runs (tracking.py).
    log = open_trackers(run_dir, config.run, config.model_dump(mode="json"), resume=good.step)
    if control.restart is not None:
        log.log("restart", good.step or 0, control.restart)
        control.restart = None
    ok = False
    try:
        await train_attempt(config, run_dir, log, good, data, control)
        if config.run.plots:
            for path in report.draw_plots(run_dir, plot_records(run_dir, log)):
                log.log_artifact(path)
        ok = True
    finally:
        log.close(ok)


def run(config: TrainerConfig, run_dir: Path, *, resume: bool, data: RunData | None = None) -> Path:
    """`train` in a new event loop: the run directory when the run reached its end."""
    return asyncio.run(train(config, run_dir, resume=resume, data=data))

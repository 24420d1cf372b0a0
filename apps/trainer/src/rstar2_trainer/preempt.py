"""Preemption: a SIGTERM (a cluster scheduler taking the nodes back) ends the run cleanly.

`Preemption.install(grace_s)` (in the running event loop) makes the first SIGTERM set
`requested` and print one line; from then on SIGTERM has its default action again, so a second
one ends the process at once (killed by the signal: status 143 in a shell). The loop checks
`requested` at its safe point, the end of an RL step (and after checkpoint 0): it writes a
checkpoint there unless that step already did, and raises `Preempted`. Should no safe point come
in time, `grace_s` minus a reserve (twice the last checkpoint's duration, plus 10 s for the
teardown) after the signal the main task is cancelled: the step in progress is dropped and the
run exits from its newest checkpoint (`Preempted` with `saved` False). Either way the command
exits 0 and prints how to resume.

Not covered: a step whose synchronous part (an update in the event loop) outlasts the grace
period is not interrupted, since cancellation waits for the next await; the scheduler's SIGKILL
then ends it, and `--resume` still finds the last complete checkpoint. A SIGTERM sent to the
whole process group also reaches the child servers, which then stop (their supervision restarts
them for the rest of the step).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time


class Preempted(Exception):
    """The run stopped on SIGTERM. `saved`: the run reached a safe point and checkpoint `step`
    is on disk; otherwise the step in progress was dropped and `step` is the newest checkpoint's
    (None: there is none yet)."""

    def __init__(self, step: int | None, *, saved: bool) -> None:
        super().__init__(step, saved)
        self.step = step
        self.saved = saved


class Preemption:
    """SIGTERM handling for one run (see the module docstring)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self.expired = False  # the grace ran out before a safe point: the main task was cancelled
        self.last_save_s = 0.0  # how long the last checkpoint took (the deadline's reserve)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def install(cls, grace_s: float) -> Preemption:
        """Handle SIGTERM in the running loop, for the current task (only a loop in the main
        thread can: elsewhere SIGTERM keeps its default action)."""
        self = cls(grace_s)
        if threading.current_thread() is not threading.main_thread():
            return self
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        return self

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def _on_sigterm(self) -> None:
        assert self._loop is not None
        self._loop.remove_signal_handler(signal.SIGTERM)  # the next one: the default action
        self.requested_at = time.monotonic()
        print(
            f"rstar2-train: SIGTERM: stopping at the end of this step (within "
            f"{self.grace_s:g} s) with a checkpoint; a second SIGTERM stops at once",
            flush=True,
        )
        reserve = 2 * self.last_save_s + 10.0
        self._timer = self._loop.call_later(max(0.0, self.grace_s - reserve), self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._task.cancel()

    def saved(self) -> None:
        """The safe point's checkpoint is on disk: the deadline no longer applies."""
        if self._timer is not None:
            self._timer.cancel()

    def uninstall(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._loop is not None and self.requested_at is None:
            self._loop.remove_signal_handler(signal.SIGTERM)

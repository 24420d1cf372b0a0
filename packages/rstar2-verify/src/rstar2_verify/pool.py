"""Killable worker processes for the symbolic checks: a hard wall-clock limit and a memory cap.

`WorkerPool.run(gold, answer, timeout_s)` sends one comparison to an idle worker and waits on its
pipe with a deadline; `timeout_s` covers the wait for an idle worker too (none free in time is
`Outcome("timeout")`), except the pool's start-up: a call that finds no worker ready yet,
ever, first waits (up to 60 s) for the first one, so start-up is never charged to a task. Past the deadline the worker is killed (SIGKILL, which also stops C-level
big-integer work that no signal handler can interrupt) and a replacement is started in the
background; the caller gets `Outcome("timeout")` at once. Each worker caps its own address space
with `RLIMIT_AS`, so a memory bomb ends in a `MemoryError` (answered as "memory") or the
worker's death (answered as "crash") and a replacement.

No `signal.alarm` anywhere: `run` is a blocking call on a pipe, safe from any thread, from
`asyncio.to_thread`, and inside Ray actors. Workers are plain subprocesses (`_worker.py`), not
forks and not `multiprocessing` children: a parent with threads or an event loop is safe, and the
caller's `__main__` is never re-imported. A worker joins the idle queue only once it has imported
sympy, so start-up is never charged to a task's time limit.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from rstar2_verify.expr import Node

__all__ = ["Outcome", "WorkerPool"]

_START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """`status` is "ok" (then `correct` holds), "timeout", "memory", "too_complex" or "crash"."""

    status: str
    correct: bool = False
    detail: str = ""


class _Worker:
    def __init__(self, memory_mb: int, max_digits: int) -> None:
        parent, child = socket.socketpair()
        command = [sys.executable, "-m", "rstar2_verify._worker", str(child.fileno())]
        self.process = subprocess.Popen(
            [*command, str(memory_mb), str(max_digits)],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.ready = False
        self._closing = threading.Lock()

    def wait_ready(self) -> bool:
        """Wait for the worker's "ready"; False when it does not come within the start timeout
        or the pool closed the connection meanwhile. Short polls, so that a connection another
        thread closed is seen within 0.2 s: a poll in progress is not woken by that close."""
        if not self.ready:
            deadline = time.monotonic() + _START_TIMEOUT_S
            try:
                while not self.conn.poll(0.2):
                    if self.conn.closed or time.monotonic() > deadline:
                        return False
                self.ready = self.conn.recv() == "ready"
            except (EOFError, OSError):
                return False
        return self.ready

    def close_conn(self) -> None:
        """Close the connection once: the pool's `close()` and a starting worker's admitter
        (whose poll fails when `close()` got there first) may both try, from two threads."""
        with self._closing, contextlib.suppress(OSError):
            self.conn.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=5)
        self.close_conn()


class WorkerPool:
    """`size` spawned workers, started on first use; thread-safe; `close()` ends them."""

    def __init__(self, size: int, memory_mb: int = 1024, max_digits: int = 20_000) -> None:
        self.size = size
        self._memory_mb = memory_mb
        self._max_digits = max_digits
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._all: set[_Worker] = set()
        self.replaced = 0
        self.start_failures = 0
        self._first_ready = threading.Event()

    def start(self) -> None:
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            for _ in range(self.size):
                self._add()

    def _add(self) -> None:
        """Start a worker; it joins the idle queue only once it is ready (sympy imported)."""
        worker = _Worker(self._memory_mb, self._max_digits)
        self._all.add(worker)
        threading.Thread(target=self._admit, args=(worker,), daemon=True).start()

    def _admit(self, worker: _Worker) -> None:
        if worker.wait_ready():
            self._idle.put(worker)
            self._first_ready.set()
            return
        with self._lock:
            self._all.discard(worker)
            self.start_failures += 1
        worker.kill()

    def _replace(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
            self.replaced += 1
            if not self._closed:
                self._add()
        threading.Thread(target=worker.kill, daemon=True).start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until every started worker is ready; True when they are."""
        until = time.monotonic() + timeout_s
        while time.monotonic() < until:
            with self._lock:
                if self._all and all(w.ready for w in self._all):
                    return True
            time.sleep(0.01)
        return False

    def pids(self) -> list[int]:
        """Process ids of the workers that are started and ready."""
        with self._lock:
            return [w.process.pid for w in self._all if w.ready]

    def run(
        self, gold: Node, answer: Node, timeout_s: float, queue_s: float | None = None
    ) -> Outcome:
        """Compare two trees in a worker within `timeout_s` seconds, waiting for one included;
        with `queue_s`, wait up to that long for an idle worker first, uncharged (batches)."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        self.start()
        if not self._first_ready.is_set():  # start-up (sympy's import) is not the task's time
            self._first_ready.wait(_START_TIMEOUT_S)
        until = time.monotonic() + (timeout_s if queue_s is None else queue_s)
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return Outcome("timeout", detail=f"no idle worker within {timeout_s:g} s")
            try:
                worker = self._idle.get(timeout=min(left, 0.5))
                break
            except queue.Empty:
                if self._closed:
                    raise RuntimeError("the worker pool is closed") from None
                if not self._all:
                    return Outcome("crash", detail="no worker could start")
        if queue_s is not None:
            until = time.monotonic() + timeout_s
        try:
            worker.conn.send((gold, answer))
            if not worker.conn.poll(max(until - time.monotonic(), 0.0)):
                self._replace(worker)
                return Outcome("timeout", detail=f"over {timeout_s:g} s")
            outcome = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            self._replace(worker)
            return Outcome("crash", detail=f"worker died: {type(exc).__name__}")
        if outcome.status == "memory":
            self._replace(worker)  # its heap may be fragmented near the cap
        else:
            self._idle.put(worker)
        return outcome

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            with contextlib.suppress(OSError, BrokenPipeError):
                worker.conn.send(None)
        for worker in workers:
            try:
                worker.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(timeout=5)
            worker.close_conn()

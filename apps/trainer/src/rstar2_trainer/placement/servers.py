"""Child servers the trainer starts (sandbox, verify), reached over gRPC on loopback.

A `ChildServer` starts a package's `serve` command as a subprocess, waits until its port answers
(and its health check passes, when given one), and stops it when the trainer exits: on a normal
exit, on an exception, on Ctrl-C, and on SIGKILL of the trainer too, because each child asks the
kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG). The signal is asked for by a small
trampoline that then execs the server, not by a `preexec_fn`: a `preexec_fn` makes Python fork
and run gRPC's fork handlers in the child, which may start a poller thread that aborts the child
with "epoll_wait error: Bad file descriptor" once the fds are closed before exec. What goes wrong becomes a
`ServerError` whose message says what to do: a port already in use, a server that exits during
start-up (with the tail of its stderr), a server that never becomes healthy, one that dies later
and cannot be brought back.

Supervision: a started server with `restarts` > 0 is watched by a thread that polls it every
0.2 s; when it has exited it is started again on the same host and port (so a client reaches it
at the address it already has: clients retry what failed meanwhile, rstar2-verify's and
rstar2-sandbox's `retry_for_s`), after 0.5 s, doubling with each restart, at most `restarts`
times over the server's life, each restart a warning line from the `rstar2_trainer` logger. A
restart that fails (the port taken meanwhile, a server that does not become healthy) uses one
of them too. Once none is left `check()` raises a `ServerError` marked `restartable`: the run
itself may then restart (faults.py). `restarts_done` counts the restarts.

Access: `RunToken.create(run_dir)` makes the run's secret and writes it to `run_dir/service.token`
(mode 0600); a `ChildServer` given `token_file=` starts its server with `--token-file PATH`, so
the secret is never on a command line or in the environment, and the trainer's clients send the
token's `value`. The readiness probe uses the health check, which needs no token.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc

from rstar2_proto.auth import TokenFileError, new_token, read_token_file, write_token_file

_PR_SET_PDEATHSIG = 1
log = logging.getLogger("rstar2_trainer.servers")


class ServerError(RuntimeError):
    """A child server could not start, or stopped; the message says what to do. `restartable`:
    it served and then died for good (a run restart starts it afresh); False for a start-up
    failure, which a restart would repeat."""

    def __init__(self, message: str, *, restartable: bool = False) -> None:
        super().__init__(message)
        self.restartable = restartable


@dataclass(frozen=True)
class RunToken:
    """The run's service token: the 0600 file the servers read, and its value for the clients."""

    path: Path
    value: str = field(repr=False)

    @classmethod
    def create(cls, run_dir: Path) -> RunToken:
        """A fresh token in `run_dir/service.token` (mode 0600; replaces an older one)."""
        path = Path(run_dir) / "service.token"
        return cls(path, write_token_file(path, new_token()))


def service_token(service: Any, token: RunToken | None) -> str | None:
    """The token a client of `service` (a `ServiceConfig`) sends: the run's for a child server,
    the one in `service.token_file` for a server at an address, none otherwise."""
    if service.mode == "child":
        return token.value if token is not None else None
    if service.mode == "address" and service.token_file:
        return read_service_token(service.token_file)
    return None


def read_service_token(path: str) -> str:
    """The token in `path`; ServerError with the one-line reason when it cannot be used."""
    try:
        return read_token_file(path)
    except TokenFileError as exc:
        raise ServerError(str(exc)) from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


# argv: parent pid, then the server's command. PR_SET_PDEATHSIG survives exec; the pid check
# closes the race where the parent died before the request was made.
_TRAMPOLINE = f"""
import ctypes, os, sys
ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGTERM)})
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def with_parent_death_signal(argv: Sequence[str]) -> list[str]:
    """`argv` wrapped so that the process gets SIGTERM when this one dies."""
    return [sys.executable, "-c", _TRAMPOLINE, str(os.getpid()), *argv]


def console_script(name: str) -> list[str]:
    """The command of an installed console script, preferring the one beside this interpreter."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        raise ServerError(f"{name} is not installed; run `uv sync` (or pip install {name})")
    return [found]


class ChildServer:
    """One server subprocess on `host:port` (port 0: a free port is chosen)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ready_timeout_s: float = 60.0,
        health: Callable[[str], bool] | None = None,
        token_file: Path | None = None,
        restarts: int = 5,
    ) -> None:
        """`token_file`: passed as `--token-file`; the server then needs the token (a restarted
        server reads the same file). `restarts`: see the module docstring (0: not watched)."""
        self.name = name
        self.host = host
        self.port = port
        self._argv = list(argv) + (["--token-file", str(token_file)] if token_file else [])
        self._ready_timeout_s = ready_timeout_s
        self._health = health
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._restarts = restarts
        self.restarts_done = 0
        self._lost: str | None = None  # why it is dead for good, once no restart is left
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> str:
        """Start the server and wait until it serves; return its address."""
        if self.port == 0:
            self.port = free_port(self.host)
        elif port_in_use(self.host, self.port):
            raise ServerError(
                f"{self.name} server: port {self.port} on {self.host} is already in use; "
                f"stop what holds it or set the port to 0 to pick a free one"
            )
        self._launch()
        try:
            self._wait_ready()
        except ServerError:
            self.stop()
            raise
        if self._restarts > 0:
            self._watcher = threading.Thread(
                target=self._watch, name=f"{self.name}-server-watch", daemon=True
            )
            self._watcher.start()
        return self.address

    def _launch(self) -> None:
        argv = [*self._argv, "--host", self.host, "--port", str(self.port)]
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server)
        self._proc = subprocess.Popen(
            with_parent_death_signal(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )

    def _watch(self) -> None:
        """Restart the server whenever it has exited, while restarts are left (a thread)."""
        left = self._restarts
        while not self._stopping.wait(0.2):
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue
            tail = self._stderr_tail() or "(empty)"
            why = f"exited with code {proc.returncode}; its stderr: {tail}"
            while left > 0 and not self._stopping.is_set():
                left -= 1
                if self._stopping.wait(0.5 * 2**self.restarts_done):
                    return
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self.restarts_done += 1
                    try:
                        self._launch()
                        self._wait_ready()
                    except ServerError as exc:
                        why = str(exc)
                        continue
                log.warning(
                    "%s server at %s %s; restarted (%d of %d)",
                    self.name,
                    self.address,
                    why.split(";")[0],
                    self.restarts_done,
                    self._restarts,
                )
                break
            else:
                self._lost = (
                    f"{self.name} server at {self.address} died and {self._restarts} restarts "
                    f"did not bring it back ({why}); the run can be resumed with "
                    f"`rstar2-train --resume RUN_DIR`"
                )
                return

    def _stderr_tail(self, lines: int = 5) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline and not self._stopping.is_set():
            self._check_running()
            with grpc.insecure_channel(self.address) as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=0.5)
                except grpc.FutureTimeoutError:
                    continue
            if self._health is None or self._health(self.address):
                return
            time.sleep(0.2)
        tail = self._stderr_tail()
        self._terminate()
        raise ServerError(
            f"{self.name} server at {self.address} did not become healthy within "
            f"{self._ready_timeout_s:.0f} s; its stderr: {tail or '(empty)'}"
        )

    def _check_running(self) -> None:
        """ServerError (not restartable) if the process being started has exited."""
        if self._proc is None:
            raise ServerError(f"{self.name} server was never started")
        code = self._proc.poll()
        if code is not None:
            tail = self._stderr_tail()
            raise ServerError(
                f"{self.name} server at {self.address} exited with code {code}; "
                f"its stderr: {tail or '(empty)'}"
            )

    def check(self) -> None:
        """Raise ServerError (restartable) if the server is dead for good: exited with no
        watcher to restart it, or with every restart used up. A restart under way is fine."""
        if self._lost is not None:
            raise ServerError(self._lost, restartable=True)
        if self._watcher is not None and self._watcher.is_alive():
            return
        if self._proc is None:
            raise ServerError(f"{self.name} server was never started")
        code = self._proc.poll()
        if code is not None:
            tail = self._stderr_tail()
            self.stop()
            raise ServerError(
                f"{self.name} server at {self.address} exited with code {code}; "
                f"its stderr: {tail or '(empty)'}; the run can be resumed "
                f"with `rstar2-train --resume RUN_DIR`",
                restartable=True,
            )

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server process's id (it changes with a restart)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching, then SIGTERM (the server drains), then SIGKILL after `timeout_s`."""
        self._stopping.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()
        with self._lock:
            self._terminate(timeout_s)
            if self._stderr is not None:
                self._stderr.close()

    def _terminate(self, timeout_s: float = 10.0) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> ChildServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""`open_sandbox`: any `SandboxBackendConfig` opened as a `Sandbox`, for the trainer and evaluator.

Contract. `async with open_sandbox(backend, limits) as sandbox:` yields something that satisfies
`Sandbox` and releases it on exit. `limits` (a `SandboxConfig`) are the per-call limits; the
backend adds the pool's shape and where it runs:

- `local`: a `LocalSandbox` in this process (workers and max_in_flight from the backend).
- `child`: `python -m rstar2_sandbox.cli serve` on 127.0.0.1, port 0, started through a small
  trampoline that sets PR_SET_PDEATHSIG (SIGTERM) before exec, so the server dies with this
  process even when it is killed; its limits travel in a 0600 JSON file and a fresh random
  token in a 0600 token file (never on a command line), both in a 0700 directory removed at the
  end. Reached through `SandboxClient`. Isolation is required unless `allow_weak_isolation`: a
  child that cannot confine calls exits and `open_sandbox` raises `SandboxStartError` with its
  one-line reason. Supervised: a child that dies (killed, crashed) is started again, with the same
  limits and token, when a call finds it dead, at most `restarts` times over the sandbox's life
  (0.5 s before the first restart, doubling), and the client is pointed at its new port; the
  calls it had in flight are sent again (`SandboxClient`'s retry, for `retry_for_s`). `restarts`
  and `retried` count what happened; `alive` is False once it is dead for good.
- `remote`: a `SandboxClient` over the addresses, with the token read from `token_file` and TLS
  when `tls_ca_file` is set.
- `fusion`: a `FusionSandbox` over the URL (no sessions; the limits' default timeout).

Not covered: starting remote servers (see the trainer's cluster mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.config import (
    ChildSandboxConfig,
    FusionSandboxConfig,
    LocalSandboxConfig,
    RemoteSandboxConfig,
    SandboxBackendConfig,
    SandboxConfig,
)
from rstar2_sandbox.execution import Sandbox
from rstar2_sandbox.fusion import FusionSandbox
from rstar2_sandbox.local import LocalSandbox

_PR_SET_PDEATHSIG = 1
# argv: parent pid, then the command. PR_SET_PDEATHSIG survives exec; the pid check closes the
# race where the parent died before the request was made.
_TRAMPOLINE = f"""
import ctypes, os, sys
ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGTERM)})
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


class SandboxStartError(RuntimeError):
    """A sandbox backend could not be opened; the message says why."""


class ChildSandbox(SandboxClient):
    """A `rstar2-sandbox serve` child on loopback, reached as a `SandboxClient`, restarted when
    it dies (see the module docstring)."""

    def __init__(
        self,
        address: str,
        token: str,
        process: asyncio.subprocess.Process,
        home: Path,
        wall_ceiling_factor: float,
        *,
        ready_timeout_s: float = 60.0,
        restarts: int = 0,
        retry_for_s: float = 0.0,
    ) -> None:
        super().__init__(
            address, token=token, wall_ceiling_factor=wall_ceiling_factor, retry_for_s=retry_for_s
        )
        self.address = address
        self.process = process
        self._home = home
        self._ready_timeout_s = ready_timeout_s
        self._restarts_left = restarts
        self._lock = asyncio.Lock()
        self._closing = False
        self.restarts = 0  # children started again after one died

    @classmethod
    async def start(
        cls,
        backend: ChildSandboxConfig,
        limits: SandboxConfig,
        *,
        restarts: int = 0,
        retry_for_s: float = 0.0,
    ) -> ChildSandbox:
        home = Path(tempfile.mkdtemp(prefix="rstar2-sandbox-child-"))  # 0700
        token = secrets.token_urlsafe(32)
        token_file, config_file = home / "token", home / "sandbox.json"
        for path, text in ((token_file, token), (config_file, _child_limits(backend, limits))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        try:
            process, address = await _spawn(home, backend.ready_timeout_s)
        except SandboxStartError:
            shutil.rmtree(home, ignore_errors=True)
            raise
        return cls(
            address,
            token,
            process,
            home,
            limits.wall_ceiling_factor,
            ready_timeout_s=backend.ready_timeout_s,
            restarts=restarts,
            retry_for_s=retry_for_s,
        )

    @property
    def alive(self) -> bool:
        """False once the child is dead and may not be restarted any more."""
        return self.process.returncode is None or (self._restarts_left > 0 and not self._closing)

    async def _revive(self) -> bool:
        """Start the child again if it died (once for all the calls that found it dead)."""
        async with self._lock:
            if self._closing:
                return False
            if self.process.returncode is None:
                return True  # alive (or its death not yet reaped): the retry finds out
            code = self.process.returncode
            while self._restarts_left > 0:
                self._restarts_left -= 1
                await asyncio.sleep(0.5 * 2**self.restarts)
                try:
                    process, address = await _spawn(self._home, self._ready_timeout_s)
                except SandboxStartError as exc:
                    sys.stderr.write(f"rstar2-sandbox: the child did not restart: {exc}\n")
                    self.restarts += 1
                    continue
                old, self.process, self.address = self.address, process, address
                self.restarts += 1
                await self._repoint(old, address)
                sys.stderr.write(
                    f"rstar2-sandbox: the child at {old} exited with code {code}; restarted at "
                    f"{address} ({self.restarts} of {self.restarts + self._restarts_left})\n"
                )
                return True
            return False

    async def close(self) -> None:
        self._closing = True
        async with self._lock:  # not while a restart is under way
            await super().close()
            if self.process.returncode is None:
                self.process.terminate()
                try:
                    await asyncio.wait_for(self.process.wait(), 30)
                except TimeoutError:
                    self.process.kill()
                    await self.process.wait()
        shutil.rmtree(self._home, ignore_errors=True)


async def _spawn(home: Path, ready_timeout_s: float) -> tuple[asyncio.subprocess.Process, str]:
    """`rstar2-sandbox serve` on 127.0.0.1, a free port, with `home`'s token and limits files,
    dying with this process; the process and its address once it listens."""
    command = [sys.executable, "-m", "rstar2_sandbox.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", "0", "--token-file", str(home / "token")]
    command += ["--sandbox-config", str(home / "sandbox.json")]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _TRAMPOLINE,
        str(os.getpid()),
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), ready_timeout_s)
    except TimeoutError:
        line = b""
    match = re.search(rb"listening on (\S+)", line)
    if match is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        error = (await process.stderr.read()).decode(errors="replace").strip()
        await process.wait()
        last = error.splitlines()[-1] if error else "no output"
        raise SandboxStartError(f"the sandbox child did not start: {last}")
    _DRAINS.add(asyncio.get_running_loop().create_task(_drain(process.stderr)))
    return process, match.group(1).decode()


_DRAINS: set[asyncio.Task[None]] = set()  # a reference to each drain task while it runs


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading the child's log so that a full pipe never stalls it (the log goes to ours)."""
    try:
        while line := await stream.readline():
            sys.stderr.write(line.decode(errors="replace"))
    finally:
        task = asyncio.current_task()
        if task is not None:
            _DRAINS.discard(task)


def _child_limits(backend: ChildSandboxConfig, limits: SandboxConfig) -> str:
    return limits.model_copy(
        update={
            "workers": backend.workers,
            "max_in_flight": backend.max_in_flight,
            "require_isolation": not backend.allow_weak_isolation,
        }
    ).model_dump_json()


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SandboxStartError(f"cannot read the {what} {path}: {exc.strerror}") from exc


@contextlib.asynccontextmanager
async def open_sandbox(
    backend: SandboxBackendConfig,
    limits: SandboxConfig | None = None,
    *,
    restarts: int = 3,
    retry_for_s: float = 60.0,
) -> AsyncIterator[Sandbox]:
    """Open `backend` with the per-call `limits`; closes it on exit. A `child` is restarted up to
    `restarts` times when it dies; calls to a `child` or `remote` server that is down are sent
    again for up to `retry_for_s` seconds (0: never)."""
    limits = limits or SandboxConfig()
    sandbox: LocalSandbox | ChildSandbox | SandboxClient | FusionSandbox
    if isinstance(backend, LocalSandboxConfig):
        sandbox = LocalSandbox(
            limits.model_copy(
                update={
                    "workers": backend.workers,
                    "max_in_flight": backend.max_in_flight,
                    "require_isolation": not backend.allow_weak_isolation,
                }
            )
        )
        try:
            await sandbox.start()
        except RuntimeError as exc:
            raise SandboxStartError(str(exc)) from exc
    elif isinstance(backend, ChildSandboxConfig):
        sandbox = await ChildSandbox.start(
            backend, limits, restarts=restarts, retry_for_s=retry_for_s
        )
    elif isinstance(backend, RemoteSandboxConfig):
        token = _read(backend.token_file, "token file")
        sandbox = SandboxClient(
            backend.addresses,
            token=token.decode().strip() if token else None,
            root_certificates=_read(backend.tls_ca_file, "TLS CA file"),
            retry_after_s=backend.retry_after_s,
            retry_for_s=retry_for_s,
        )
    elif isinstance(backend, FusionSandboxConfig):
        sandbox = FusionSandbox(
            backend.url,
            default_timeout_s=limits.default_timeout_s,
            max_concurrency=backend.max_concurrency,
        )
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"unknown sandbox backend {backend!r}")
    try:
        yield sandbox
    finally:
        await sandbox.close()

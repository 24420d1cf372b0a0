"""`LocalSandbox`: the warm fork pool, driven in-process from asyncio.

Contract. `LocalSandbox(config)` starts `config.workers` warm workers (`_worker`, each its own
process with a clean environment) on first use or on `start()`, and satisfies the `Sandbox`
Protocol. It validates each request, admits at most `max_in_flight` calls at once (the rest wait
in a queue of `max_queue`; beyond it a call is refused), sends each call to the least busy worker
(a session always to the worker that holds it) and resolves the caller when the worker answers.
The timeout clock starts when the child is forked, never in the queue; `queue_s` reports the wait.
The limits are the server's: a call may ask for less memory, output or time than the configured
maxima, never more (`RequestError`). Sessions belong to an owner (the server passes the caller's
token or connection): the same id from another owner is another session. A worker that dies is
restarted and its calls are answered with `sandbox_error` (the sandbox's failure, not the
code's). A cancelled caller kills its child. `run` raises `RequestError` / `SandboxBusyError` for
the server to map to gRPC codes; `execute` turns a bad request into REJECTED and a full sandbox
into SANDBOX_ERROR, as the Protocol asks. With `require_isolation` (the default) the pool refuses
to start unless every confinement is active. Where the host delegates cgroup v2, each worker (its
zygote, sessions and calls) runs in a cgroup of its own with `memory.max` and `pids.max`
(`_cgroup`, limits from `SandboxConfig.cgroup_limits`); elsewhere `Info` says why not.

Not covered: the network (see `server` and `client`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar2_sandbox import _cgroup, _confine
from rstar2_sandbox.config import SandboxConfig
from rstar2_sandbox.execution import ExecutionRequest, ExecutionResult, ExecutionStatus

logger = logging.getLogger(__name__)

_WORKER_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class RequestError(ValueError):
    """The request itself is wrong (no code, too large, bad timeout...)."""


class SandboxBusyError(RuntimeError):
    """The queue is full, or the sandbox is shutting down."""


@dataclass
class _WorkerHandle:
    index: int
    process: asyncio.subprocess.Process
    pending: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    ready: dict[str, Any] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None
    dead: bool = False  # set the moment its pipe closes, before the replacement starts

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(struct.pack("!I", len(data)) + data)


class LocalSandbox:
    """The in-process executor: a pool of warm workers that fork one confined child per call."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._workers: list[_WorkerHandle] = []
        self._ids = itertools.count(1)
        self._slots = asyncio.Semaphore(self.config.max_in_flight)
        self._in_flight = 0
        self._queued = 0
        self._sessions: dict[str, _WorkerHandle] = {}
        self._start_lock = asyncio.Lock()
        self._closing = False
        self._started = False
        self._cgroups: _cgroup.WorkerCgroups | None = None
        self._cgroup_reason = ""
        self.profiles: list[dict[str, Any]] = []  # config.profile: each call's phase stamps

    # --- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the workers and wait until each has confined itself and pre-imported."""
        async with self._start_lock:
            if self._started:
                return
            if self._closing:
                raise SandboxBusyError("the sandbox is closed")
            try:
                self._cgroups = _cgroup.WorkerCgroups.create(self.config.cgroup_limits())
            except _cgroup.CgroupUnavailable as exc:
                self._cgroup_reason = f"{exc}; {_cgroup.WITHOUT}"
            self._workers = list(
                await asyncio.gather(*(self._spawn(i) for i in range(self.config.workers)))
            )
            self._started = True
            warning = self.isolation_warning()
            if warning and self.config.require_isolation:
                await self.close()
                reasons = warning.split("missing ", 1)[1]
                raise RuntimeError(
                    f"isolation required but incomplete ({reasons}); "
                    "--allow-weak-isolation starts anyway"
                )
            if warning:
                logger.warning("%s", warning)

    async def _spawn(self, index: int) -> _WorkerHandle:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",  # no PYTHON* variables, no user site, no working directory on sys.path
            "-m",
            "rstar2_sandbox._worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_WORKER_ENV,
            cwd="/",
            limit=1 << 26,
        )
        handle = _WorkerHandle(index, process)
        if self._cgroups is not None:  # before the setup frame: the worker has forked nothing yet
            try:
                self._cgroups.join(index, process.pid)
            except OSError as exc:
                self._cgroup_reason = f"cannot move worker {index} into its cgroup: {exc}"
                self._cgroups.joined.discard(index)
        handle.send({"config": self.config.model_dump(mode="json"), "index": index})
        ready = await self._read(handle)
        if ready is None or ready.get("op") != "ready":
            raise RuntimeError(f"sandbox worker {index} failed to start")
        handle.ready = ready
        for module, why in ready["preload_failed"].items():
            logger.warning("worker %d could not pre-import %s: %s", index, module, why)
        handle.reader = asyncio.create_task(self._read_loop(handle))
        return handle

    async def _read(self, handle: _WorkerHandle) -> dict[str, Any] | None:
        assert handle.process.stdout is not None
        try:
            header = await handle.process.stdout.readexactly(4)
            body = await handle.process.stdout.readexactly(struct.unpack("!I", header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return json.loads(body)

    async def _read_loop(self, handle: _WorkerHandle) -> None:
        while (message := await self._read(handle)) is not None:
            if message["op"] == "done":
                future = handle.pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif message["op"] == "session_closed":
                self._sessions.pop(message["session"], None)
            elif message["op"] == "session_opened":
                self._sessions[message["session"]] = handle
        handle.dead = True
        await self._worker_died(handle)

    async def _worker_died(self, handle: _WorkerHandle) -> None:
        code = await handle.process.wait()
        for future in handle.pending.values():
            if not future.done():
                future.set_result(_lost(f"sandbox: worker {handle.index} exited ({code})"))
        handle.pending.clear()
        for name in [n for n, h in self._sessions.items() if h is handle]:
            del self._sessions[name]
        if self._closing:
            return
        logger.error("sandbox worker %d exited with %s; restarting it", handle.index, code)
        if self._cgroups is not None:
            self._cgroups.kill(handle.index)  # whatever of it is left
        try:
            replacement = await self._spawn(handle.index)
        except (OSError, RuntimeError):
            logger.exception("sandbox worker %d could not be restarted", handle.index)
            return
        self._workers[self._workers.index(handle)] = replacement

    async def close(self) -> None:
        """Stop the workers: running calls are killed and answered, sessions closed."""
        self._closing = True
        for handle in self._workers:
            if handle.process.stdin is not None and not handle.process.stdin.is_closing():
                handle.process.stdin.close()
        for handle in self._workers:
            try:
                await asyncio.wait_for(handle.process.wait(), 10)
            except TimeoutError:
                handle.process.kill()
                await handle.process.wait()
            if handle.reader is not None:
                await handle.reader
        self._workers = []
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.close)
            self._cgroups = None

    async def __aenter__(self) -> LocalSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- introspection ----------------------------------------------------------------------
    def confinements(self) -> tuple[list[str], dict[str, str]]:
        """Active confinements (common to every worker) and the missing ones with the reason."""
        if not self._workers:
            return [], {}
        ready = self._workers[0].ready
        active, unavailable = list(ready["active"]), dict(ready["unavailable"])
        for name in _confine.REQUIRED:
            if name not in active and name not in unavailable:
                unavailable[name] = "not enabled"
        if self._cgroup_reason or self._cgroups is None:
            unavailable["cgroup"] = self._cgroup_reason or "not set up"
        else:
            active.append("cgroup")
        return active, unavailable

    def isolation_warning(self) -> str:
        """Empty when every required confinement is active, else a warning naming the gaps."""
        active, unavailable = self.confinements()
        missing = [name for name in _confine.REQUIRED if name not in active]
        if not self._workers or not missing:
            return ""
        reasons = "; ".join(f"{name}: {unavailable.get(name, 'not enabled')}" for name in missing)
        return f"WEAK ISOLATION (started with allow_weak_isolation): missing {reasons}"

    def worker_processes(self) -> list[tuple[int, int]]:
        """(pid, pid of its zygote) of each live worker, for monitoring and tests."""
        return [(h.ready["pid"], h.ready["zygote"]) for h in self._workers]

    def preloaded(self) -> list[str]:
        """Modules every worker pre-imported."""
        return list(self._workers[0].ready["preloaded"]) if self._workers else []

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return self._queued

    # --- calls ------------------------------------------------------------------------------
    def _validate(self, request: ExecutionRequest, memory: int, output: int) -> float:
        c = self.config
        if memory < 0 or memory > c.memory_bytes:
            raise RequestError(
                f"memory_bytes {memory} exceeds the server's maximum {c.memory_bytes}"
            )
        if output < 0 or output > c.max_output_bytes:
            raise RequestError(
                f"max_output_bytes {output} exceeds the server's maximum {c.max_output_bytes}"
            )
        if not request.code.strip():
            raise RequestError("code is empty")
        size = len(request.code.encode("utf-8", "surrogatepass"))
        if size > c.max_code_bytes:
            raise RequestError(f"code exceeds {c.max_code_bytes} bytes ({size})")
        if len(request.stdin.encode("utf-8", "surrogatepass")) > c.max_stdin_bytes:
            raise RequestError(f"stdin exceeds {c.max_stdin_bytes} bytes")
        timeout = c.default_timeout_s if request.timeout_s is None else request.timeout_s
        if not timeout > 0:
            raise RequestError(f"timeout_s must be positive, got {request.timeout_s}")
        if timeout > c.max_timeout_s:
            raise RequestError(f"timeout_s {timeout} exceeds the maximum {c.max_timeout_s}")
        if request.session_id is not None and not request.session_id:
            raise RequestError("session_id must not be empty")
        if (request.files or request.fetch_files) and request.session_id is not None:
            raise RequestError("files and fetch_files are for one-shot calls, not sessions")
        size = sum(len(name) + len(data) for name, data in request.files.items())
        if size > c.max_files_bytes:
            raise RequestError(f"files exceed {c.max_files_bytes} bytes ({size})")
        if any(not name or "\0" in name for name in (*request.files, *request.fetch_files)):
            raise RequestError("a file name is empty or holds a NUL byte")
        return timeout

    def _pick(self, session: str | None) -> _WorkerHandle:
        live = [h for h in self._workers if not h.dead]
        if not live:
            raise SandboxBusyError("no live sandbox worker (one is restarting); retry shortly")
        if session is not None:
            handle = self._sessions.get(session)
            if handle is not None and not handle.dead:
                return handle
            if len(self._sessions) >= self.config.max_sessions:
                raise SandboxBusyError(f"{len(self._sessions)} sessions are open (the maximum)")
            handle = min(live, key=lambda h: len(h.pending))
            self._sessions[session] = handle
            return handle
        return min(live, key=lambda h: len(h.pending))

    async def run(
        self,
        request: ExecutionRequest,
        *,
        memory_bytes: int = 0,
        max_output_bytes: int = 0,
        owner: str = "",
    ) -> ExecutionResult:
        """Run one call; raises RequestError or SandboxBusyError instead of running it.

        `memory_bytes` / `max_output_bytes`: 0 is the server's value, less is allowed, more is a
        RequestError. `owner`: whose session `request.session_id` names.
        """
        timeout = self._validate(request, memory_bytes, max_output_bytes)
        session = _session_key(owner, request.session_id)
        await self.start()
        if self._closing:
            raise SandboxBusyError("the sandbox is shutting down")
        if self._slots.locked() and self._queued >= self.config.max_queue:
            raise SandboxBusyError(f"queue full ({self.config.max_queue} calls waiting)")
        entered = time.monotonic()
        self._queued += 1
        try:
            await self._slots.acquire()
        finally:
            self._queued -= 1
        self._in_flight += 1
        try:
            handle = self._pick(session)
            call_id = next(self._ids)
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            handle.pending[call_id] = future
            sent = time.perf_counter_ns()
            handle.send(
                {
                    "op": "run",
                    "id": call_id,
                    "code": request.code,
                    "stdin": request.stdin,
                    "timeout_s": timeout,
                    "session": session,
                    "memory_bytes": memory_bytes or self.config.memory_bytes,
                    "max_output": max_output_bytes or self.config.max_output_bytes,
                }
                | _files_message(request)
            )
            waited = time.monotonic() - entered
            try:
                done = await future
            except asyncio.CancelledError:
                handle.pending.pop(call_id, None)
                with contextlib.suppress(Exception):
                    handle.send({"op": "cancel", "id": call_id})
                raise
            if "profile" in done:
                pool = [("pool_sent", sent, 0, 0), ("pool_answered", time.perf_counter_ns(), 0, 0)]
                self.profiles.append(done.pop("profile") | {"pool": pool})
        finally:
            self._in_flight -= 1
            self._slots.release()
        return _result(done, request.request_id, waited)

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run one call; a bad request comes back REJECTED, a full sandbox SANDBOX_ERROR."""
        try:
            return await self.run(request)
        except RequestError as exc:
            return ExecutionResult(
                status=ExecutionStatus.REJECTED, message=str(exc), request_id=request.request_id
            )
        except SandboxBusyError as exc:
            return ExecutionResult(
                status=ExecutionStatus.SANDBOX_ERROR,
                message=f"sandbox: {exc}",
                request_id=request.request_id,
            )

    async def execute_many(self, requests: Sequence[ExecutionRequest]) -> list[ExecutionResult]:
        """Run many calls concurrently; results in request order."""
        return list(await asyncio.gather(*(self.execute(r) for r in requests)))

    async def close_session(self, session_id: str, owner: str = "") -> bool:
        """Close a session of `owner` now; False if it was not open. Never waits for it."""
        key = f"{owner}\x00{session_id}"
        handle = self._sessions.pop(key, None)
        if handle is None:
            return False
        handle.send({"op": "close_session", "session": key})
        return True


def _session_key(owner: str, session_id: str | None) -> str | None:
    """The worker's name of a session: the owner and the id (another owner: another session)."""
    return None if session_id is None else f"{owner}\x00{session_id}"


def _files_message(request: ExecutionRequest) -> dict[str, Any]:
    if not request.files and not request.fetch_files:
        return {}
    files = {name: base64.b64encode(data).decode() for name, data in request.files.items()}
    return {"files": files, "fetch": list(request.fetch_files)}


def _lost(message: str) -> dict[str, Any]:
    return {"status": "sandbox_error", "message": message, "exit_code": -1}


def _result(done: dict[str, Any], request_id: str, waited: float) -> ExecutionResult:
    return ExecutionResult(
        status=ExecutionStatus(done["status"]),
        stdout=done.get("stdout", ""),
        stderr=done.get("stderr", ""),
        traceback=done.get("traceback", ""),
        result_repr=done.get("result_repr", ""),
        exit_code=done.get("exit_code", 0),
        wall_s=done.get("wall_s", 0.0),
        cpu_s=done.get("cpu_s", 0.0),
        queue_s=waited + done.get("queue_s", 0.0),
        request_id=request_id,
        message=done.get("message", ""),
        files={name: base64.b64decode(text) for name, text in done.get("files", {}).items()},
    )

"""The HTTP listener of `rstar2-sandbox serve`: SandboxFusion's and code-judge's APIs, on the
same `LocalSandbox` (workers, confinement, limits) as the gRPC server.

Contract.
- SandboxFusion (`POST /run_code`, the shapes of bytedance/SandboxFusion's `RunCodeRequest` /
  `RunCodeResponse`): `language` must be `python` (anything else is 400); `code`, `stdin`,
  `run_timeout` (default 10; above the server's maximum it is lowered to it), `compile_timeout`
  (accepted, unused: python compiles nothing), `memory_limit_MB` (-1 or 0: the server's limit;
  above it, lowered to it), `files` (name -> base64, None skipped; written under the call's
  working directory before it runs) and `fetch_files` (read back, base64, into `files`; missing
  ones are absent). The answer is `{"status", "message", "compile_result": null, "run_result":
  {"status", "execution_time", "return_code", "stdout", "stderr"}, "executor_pod_name",
  "files"}`: status `Success` when the program exited 0, `Failed` for a non-zero exit, a signal or
  a timeout (`run_result.status` `TimeLimitExceeded`, `return_code` null), `SandboxError` (no
  `run_result`) when the sandbox failed or is full; stderr is what `python file.py` prints (the
  traceback included). Code that is only whitespace runs as an empty program.
- code-judge (`POST /run`, `/run/batch`, `/run/long-batch`, the shapes of 0xWJ/code-judge's
  `Submission` / `SubmissionResult` that rStar2-Agent's tool client sends): `type` must be
  `python` (else 400 for `/run`, an `invalid_input` result in a batch); `solution`, `input`,
  `expected_output` (success needs stdout to match it, stripped); the result is `{"sub_id",
  "success", "run_success", "cost", "stdout", "stderr", "reason"}` with reason `""`,
  `worker_timeout`, `internal_error` (the sandbox failed) or `queue_timeout` (full: rStar's
  client retries those). A batch answers `{"sub_id", "results"}` in order. Timeout: the server's
  default. `GET /ping` answers `"pong"`.
- Auth: with a token, every route needs `Authorization: Bearer TOKEN` or the prefix
  `/t/TOKEN/...` (for clients that take only a base URL); none is 401, a wrong one 403,
  compared in constant time. Bodies over `max_body_bytes` are 413; bad JSON or fields are 400
  with one line; a full sandbox on `/run_code` is a `SandboxError` answer (SandboxFusion's SDK
  retries those). Nothing a request sends can stop the listener.

Not covered: other languages, `/run_jupyter`, SandboxFusion's dataset routes, code-judge's
`/judge*` routes and `options`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rstar2_sandbox.execution import ExecutionRequest, ExecutionResult, ExecutionStatus
from rstar2_sandbox.local import LocalSandbox, RequestError, SandboxBusyError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(ValueError):
    """A request we will not run; the message is one line for the caller."""


def _field(body: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadRequest(f"field {name} must be {names}, got {type(value).__name__}")
    return value


def _run_code_request(body: dict[str, Any], sandbox: LocalSandbox) -> tuple[ExecutionRequest, int]:
    """SandboxFusion's RunCodeRequest as our request and its memory limit (0: the server's)."""
    c = sandbox.config
    language = _field(body, "language", (str,), None)
    if language is None:
        raise BadRequest("field language is required")
    if language != "python":
        raise BadRequest(f"language {language!r} is not supported: only 'python'")
    code = _field(body, "code", (str,), None)
    if code is None:
        raise BadRequest("field code is required")
    stdin = _field(body, "stdin", (str,), "")
    timeout = float(_field(body, "run_timeout", (int, float), 10))
    _field(body, "compile_timeout", (int, float), 10)
    if not timeout > 0:
        raise BadRequest(f"run_timeout must be positive, got {timeout}")
    memory_mb = _field(body, "memory_limit_MB", (int,), -1)
    memory = min(memory_mb << 20, c.memory_bytes) if memory_mb > 0 else 0
    files: dict[str, bytes] = {}
    for name, content in _field(body, "files", (dict,), {}).items():
        if content is None:
            continue
        if not isinstance(content, str):
            raise BadRequest(f"files[{name!r}] must be base64 text")
        try:
            files[name] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"files[{name!r}] is not valid base64") from None
    fetch = _field(body, "fetch_files", (list,), [])
    if not all(isinstance(name, str) for name in fetch):
        raise BadRequest("fetch_files must be a list of file names")
    request = ExecutionRequest(
        code=code if code.strip() else "pass",
        stdin=stdin,
        timeout_s=min(timeout, c.max_timeout_s),
        files=files,
        fetch_files=tuple(fetch),
    )
    return request, memory


def _python_stderr(result: ExecutionResult) -> str:
    """stderr as `python file.py` prints it: the program's own, then its traceback."""
    if result.traceback and result.traceback not in result.stderr:
        return result.stderr + result.traceback
    return result.stderr


def _run_code_response(result: ExecutionResult) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "status": "Success",
        "message": "",
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": os.environ.get("MY_POD_NAME"),
        "files": {},
    }
    if result.status in (ExecutionStatus.SANDBOX_ERROR, ExecutionStatus.REJECTED):
        return answer | {"status": "SandboxError", "message": result.message}
    timed_out = result.status == ExecutionStatus.TIMEOUT
    code = result.exit_code
    if result.status in (ExecutionStatus.ERROR, ExecutionStatus.MEMORY_EXCEEDED) and not code:
        code = 1
    answer["run_result"] = {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": result.wall_s,
        "return_code": None if timed_out else code,
        "stdout": result.stdout,
        "stderr": _python_stderr(result),
    }
    answer["files"] = {name: base64.b64encode(data).decode() for name, data in result.files.items()}
    answer["status"] = "Failed" if timed_out or code != 0 else "Success"
    return answer


def _submission(item: Any) -> tuple[ExecutionRequest, str, str | None]:
    """code-judge's Submission as our request, its sub_id and expected output."""
    if not isinstance(item, dict):
        raise BadRequest("a submission must be a JSON object")
    kind = _field(item, "type", (str,), None)
    if kind != "python":
        raise BadRequest(f"submission type {kind!r} is not supported: only 'python'")
    solution = _field(item, "solution", (str,), None)
    if solution is None:
        raise BadRequest("field solution is required")
    stdin = _field(item, "input", (str,), "")
    expected = _field(item, "expected_output", (str,), None)
    sub_id = _field(item, "sub_id", (str,), None) or str(uuid.uuid4())
    code = solution if solution.strip() else "pass"
    return ExecutionRequest(code=code, stdin=stdin), sub_id, expected


def _judge_result(
    sub_id: str, result: ExecutionResult | None, expected: str | None, reason: str = ""
) -> dict[str, Any]:
    if result is None:
        return {
            "sub_id": sub_id,
            "success": False,
            "run_success": False,
            "cost": 0.0,
            "stdout": None,
            "stderr": None,
            "reason": reason,
        }
    run_success = result.status in (ExecutionStatus.OK, ExecutionStatus.OUTPUT_TRUNCATED)
    success = run_success and (expected is None or result.stdout.strip() == expected.strip())
    if result.status == ExecutionStatus.TIMEOUT:
        reason = "worker_timeout"
    elif result.status in (ExecutionStatus.SANDBOX_ERROR, ExecutionStatus.REJECTED):
        reason = "internal_error"
    return {
        "sub_id": sub_id,
        "success": success,
        "run_success": run_success,
        "cost": result.wall_s,
        "stdout": result.stdout,
        "stderr": _python_stderr(result),
        "reason": reason,
    }


class HttpApi:
    """The aiohttp application; `start(host, port)` binds and returns the port."""

    def __init__(self, sandbox: LocalSandbox, token: str | None, max_body_bytes: int) -> None:
        self.sandbox = sandbox
        self._expected = f"Bearer {token}".encode() if token else None
        self._token = token.encode() if token else None
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._guard])
        for prefix in ("", "/t/{token}"):
            self.app.router.add_post(prefix + "/run_code", self.run_code)
            self.app.router.add_post(prefix + "/run", self.run)
            self.app.router.add_post(prefix + "/run/batch", self.run_batch)
            self.app.router.add_post(prefix + "/run/long-batch", self.run_batch)
            self.app.router.add_get(prefix + "/ping", self.ping)
        self._runner: web.AppRunner | None = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The token check, then one-line errors for whatever a request gets wrong."""
        if self._token is not None:
            in_path = request.match_info.get("token")
            header = request.headers.get("Authorization")
            if in_path is not None:
                ok = hmac.compare_digest(in_path.encode(), self._token)
            elif header is not None:
                ok = hmac.compare_digest(header.encode(), self._expected or b"")
            else:
                return _error(401, "missing token: send Authorization: Bearer TOKEN or /t/TOKEN/")
            if not ok:
                return _error(403, "wrong token")
        elif "token" in request.match_info:
            return _error(404, "this server has no token: drop the /t/TOKEN prefix")
        try:
            return await handler(request)
        except BadRequest as exc:
            return _error(400, str(exc))
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            raise
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    async def _run(self, request: ExecutionRequest, memory: int = 0) -> ExecutionResult:
        try:
            return await self.sandbox.run(request, memory_bytes=memory)
        except RequestError as exc:
            raise BadRequest(str(exc)) from None

    async def run_code(self, request: web.Request) -> web.Response:
        call, memory = _run_code_request(await self._body(request), self.sandbox)
        try:
            result = await self._run(call, memory)
        except SandboxBusyError as exc:
            result = ExecutionResult(status=ExecutionStatus.SANDBOX_ERROR, message=str(exc))
        return web.json_response(_run_code_response(result))

    async def _judge(self, item: Any) -> dict[str, Any]:
        try:
            call, sub_id, expected = _submission(item)
        except BadRequest:
            sub_id = item.get("sub_id") if isinstance(item, dict) else None
            return _judge_result(str(sub_id or uuid.uuid4()), None, None, "invalid_input")
        try:
            result = await self.sandbox.run(call)
        except RequestError:
            return _judge_result(sub_id, None, None, "invalid_input")
        except SandboxBusyError:
            return _judge_result(sub_id, None, None, "queue_timeout")
        return _judge_result(sub_id, result, expected)

    async def run(self, request: web.Request) -> web.Response:
        call, sub_id, expected = _submission(await self._body(request))
        try:
            result = await self._run(call)
        except SandboxBusyError:
            return web.json_response(_judge_result(sub_id, None, None, "queue_timeout"))
        return web.json_response(_judge_result(sub_id, result, expected))

    async def run_batch(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        items = body.get("submissions")
        if not isinstance(items, list) or not items:
            raise BadRequest("field submissions must be a non-empty list")
        results = await asyncio.gather(*(self._judge(item) for item in items))
        sub_id = body.get("sub_id") if isinstance(body.get("sub_id"), str) else str(uuid.uuid4())
        return web.json_response({"sub_id": sub_id, "results": results})

    async def ping(self, request: web.Request) -> web.Response:
        return web.json_response("pong")

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; OSError if the address cannot be bound."""
        runner = self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = site._server  # pyright: ignore[reportPrivateUsage]
        sockets = getattr(server, "sockets", None) or []
        return sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)

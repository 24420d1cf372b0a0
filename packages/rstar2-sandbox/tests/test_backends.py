"""`open_sandbox` over every backend kind, each against the real thing it names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from rstar2_sandbox import (
    ChildSandbox,
    ChildSandboxConfig,
    ExecutionRequest,
    ExecutionStatus,
    FusionSandboxConfig,
    LocalSandboxConfig,
    RemoteSandboxConfig,
    Sandbox,
    SandboxBackendConfig,
    SandboxClient,
    SandboxConfig,
    SandboxServer,
    SandboxStartError,
    ServerConfig,
    open_sandbox,
)

S = ExecutionStatus
LIGHT = SandboxConfig(preload=("math",), warmup_code="", default_timeout_s=3.0)


async def _answer(backend, limits=LIGHT) -> tuple[bool, str]:
    async with open_sandbox(backend, limits) as sandbox:
        result = await sandbox.execute(ExecutionRequest(code="print(6 * 7)"))
        return isinstance(sandbox, Sandbox), result.stdout if result.status is S.OK else str(result)


def test_the_union_parses_by_kind():
    adapter = TypeAdapter(SandboxBackendConfig)
    assert isinstance(adapter.validate_python({"kind": "local"}), LocalSandboxConfig)
    child = adapter.validate_python({"kind": "child", "workers": 4})
    assert isinstance(child, ChildSandboxConfig) and not child.allow_weak_isolation
    remote = adapter.validate_python({"kind": "remote", "addresses": ["10.0.0.1:50051"]})
    assert isinstance(remote, RemoteSandboxConfig) and remote.token_file is None
    fusion = adapter.validate_python({"kind": "fusion", "url": "http://h:8080"})
    assert isinstance(fusion, FusionSandboxConfig)
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "cloud"})
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "remote", "addresses": []})


def test_local(runner):
    assert runner.run(_answer(LocalSandboxConfig(workers=1))) == (True, "42\n")


def test_local_refuses_weak_isolation_unless_allowed(runner):
    weak = LIGHT.model_copy(update={"seccomp": False})
    with pytest.raises(SandboxStartError, match="seccomp"):
        runner.run(_answer(LocalSandboxConfig(workers=1), weak))
    allowed = LocalSandboxConfig(workers=1, allow_weak_isolation=True)
    assert runner.run(_answer(allowed, weak)) == (True, "42\n")


def test_child_is_isolated_authenticated_and_closed(runner):
    async def scenario():
        async with open_sandbox(ChildSandboxConfig(workers=1), LIGHT) as sandbox:
            assert isinstance(sandbox, ChildSandbox)
            result = await sandbox.execute(ExecutionRequest(code="print(6 * 7)"))
            (info,) = await sandbox.info()
            async with SandboxClient(sandbox.address) as anonymous:
                refused = await anonymous.execute(ExecutionRequest(code="1"))
            with open(f"/proc/{sandbox.process.pid}/cmdline", "rb") as f:
                cmdline = f.read()
            return result, info, refused, cmdline, sandbox.process

    result, info, refused, cmdline, process = runner.run(scenario())
    assert (result.status, result.stdout) == (S.OK, "42\n")
    assert info.warning == "" and {"seccomp", "pidns", "rootfs"} <= set(info.confinements)
    assert info.limits["default_timeout_s"] == 3.0  # the limits reached the child
    assert refused.status is S.SANDBOX_ERROR and "UNAUTHENTICATED" in refused.message
    assert b"--token-file" in cmdline and b"--token\x00" not in cmdline
    assert process.returncode is not None  # stopped on exit


def test_child_refusal_is_one_clear_error(runner):
    weak = LIGHT.model_copy(update={"seccomp": False})
    with pytest.raises(SandboxStartError, match="isolation required but incomplete"):
        runner.run(_answer(ChildSandboxConfig(workers=1), weak))


_PARENT = """
import asyncio, sys
from rstar2_sandbox import ChildSandboxConfig, SandboxConfig, open_sandbox

async def main():
    limits = SandboxConfig(preload=(), warmup_code="")
    async with open_sandbox(ChildSandboxConfig(workers=1), limits) as sandbox:
        print(sandbox.process.pid, flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def test_the_child_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}")


def test_remote_with_a_token_file(runner, tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")

    async def scenario():
        server = SandboxServer(ServerConfig(port=0, token="s3cret", sandbox=LIGHT))
        port = await server.start()
        try:
            good = RemoteSandboxConfig(addresses=[f"127.0.0.1:{port}"], token_file=token_file)
            bad = RemoteSandboxConfig(addresses=[f"127.0.0.1:{port}"])
            return await _answer(good), await _answer(bad)
        finally:
            await server.stop(1)

    good, bad = runner.run(scenario())
    assert good == (True, "42\n")
    assert "UNAUTHENTICATED" in bad[1]
    missing = RemoteSandboxConfig(addresses=["127.0.0.1:1"], token_file=tmp_path / "nope")
    with pytest.raises(SandboxStartError, match="cannot read the token file"):
        runner.run(_answer(missing))


class _RunCode(BaseHTTPRequestHandler):
    """SandboxFusion's /run_code, reduced to what the adapter reads."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        done = subprocess.run(
            [sys.executable, "-c", body["code"]], capture_output=True, text=True, timeout=10
        )
        run = {"status": "Finished", "return_code": done.returncode, "stdout": done.stdout}
        data = json.dumps({"status": "Success", "run_result": run | {"stderr": ""}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_fusion(runner):
    http = ThreadingHTTPServer(("127.0.0.1", 0), _RunCode)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{http.server_address[1]}"
        assert runner.run(_answer(FusionSandboxConfig(url=url))) == (True, "42\n")
    finally:
        http.shutdown()
        http.server_close()
        thread.join()


def test_open_sandbox_closes_on_error(runner):
    async def scenario():
        with pytest.raises(ZeroDivisionError):
            async with open_sandbox(LocalSandboxConfig(workers=1), LIGHT) as sandbox:
                held = sandbox
                raise ZeroDivisionError
        return held

    held = runner.run(scenario())
    assert runner.run(held.execute(ExecutionRequest(code="1"))).status is not S.OK

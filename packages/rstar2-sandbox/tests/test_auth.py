"""`rstar2-sandbox serve --token-file` as a real subprocess on 127.0.0.1:0: calls without the token
or with a wrong one are UNAUTHENTICATED, with it they run; health checks stay open; the token is
nowhere in the server's /proc cmdline or environ; a non-loopback bind without a token, and a bad
token file, are refused with one line and exit 2."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rstar2_proto.auth import DENIED, write_token_file
from rstar2_sandbox import ExecutionRequest, ExecutionStatus
from rstar2_sandbox.client import SandboxClient

BIN = Path(sys.executable).parent / "rstar2-sandbox"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("auth") / "run.token"
    return path, write_token_file(path)


@pytest.fixture(scope="module")
def server(token_file: tuple[Path, str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    argv = [str(BIN), "serve", "--port", "0", "--workers", "1", "--token-file", str(token_file[0])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline, address = time.monotonic() + 120, ""
    while time.monotonic() < deadline and not address:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            address = line.split()[-1]
    if not address:
        proc.kill()
        pytest.fail(f"rstar2-sandbox serve did not start (exit {proc.wait()})")
    yield proc, address
    proc.terminate()
    proc.wait(30)
    proc.stdout.close()


def test_only_callers_with_the_token_are_served(server, token_file) -> None:
    _, address = server

    async def main() -> list:
        out = []
        for token in (None, "wrong", token_file[1]):
            async with SandboxClient(address, token=token) as client:
                out.append(await client.execute(ExecutionRequest(code="6 * 7")))
        return out

    missing, wrong, right = asyncio.run(main())
    for refused in (missing, wrong):
        # a refusal by the servers is the sandbox's failure, never the model's tool error
        assert refused.status is ExecutionStatus.SANDBOX_ERROR
        assert refused.message == f"{address}: UNAUTHENTICATED: {DENIED}"
    assert (right.status, right.result_repr) == (ExecutionStatus.OK, "42")


def test_health_checks_stay_open(server) -> None:
    with grpc.insecure_channel(server[1]) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check  # pyright: ignore[reportAttributeAccessIssue]
        reply = check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_token_is_not_in_the_servers_cmdline_or_environment(server, token_file) -> None:
    proc, _ = server
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    assert str(token_file[0]).encode() in cmdline  # the file's path, and only that
    assert token_file[1].encode() not in cmdline
    assert token_file[1].encode() not in environ


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), "serve", "--port", "0", "--workers", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_non_loopback_bind_without_a_token_is_refused() -> None:
    out = _serve("--host", "0.0.0.0")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "rstar2-sandbox: refusing to listen on 0.0.0.0 without a token: pass --token-file PATH "
        "(or --insecure to accept calls from anyone who can reach this port)"
    ]


def test_a_bad_token_file_is_one_line(tmp_path: Path) -> None:
    exposed = tmp_path / "token"
    exposed.write_text("s3cret\n")
    exposed.chmod(0o644)
    for path, message in (
        (
            tmp_path / "nope",
            f"cannot read token file {tmp_path / 'nope'}: No such file or directory",
        ),
        (exposed, f"token file {exposed} is readable by others (mode 0644): chmod 600 {exposed}"),
    ):
        out = _serve("--token-file", str(path))
        assert out.returncode == 2
        assert out.stderr.strip().splitlines() == [f"rstar2-sandbox: {message}"]

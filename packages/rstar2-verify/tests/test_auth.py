"""The verify service with a token, for real: `rstar2-verify serve --token-file` as a subprocess
on 127.0.0.1:0 refuses calls without the token or with a wrong one (UNAUTHENTICATED), grades with
it, keeps the health check open, and never shows the token in its /proc cmdline or environ; a
non-loopback bind without a token and a bad token file are one line and exit 2; TLS with a token
works in-process when openssl can make a certificate."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rstar2_proto.auth import DENIED, write_token_file
from rstar2_verify import VerifyConfig
from rstar2_verify.client import VerifyClient
from rstar2_verify.server import VerifyServer

SERVE = [sys.executable, "-m", "rstar2_verify.cli", "serve", "--port", "0", "--workers", "1"]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("auth") / "run.token"
    return path, write_token_file(path)


@pytest.fixture(scope="module")
def served(token_file) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [*SERVE, "--token-file", str(token_file[0])],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("rstar2-verify listening on 127.0.0.1:"):
        process.kill()
        pytest.fail(f"rstar2-verify serve did not start: {line!r} (exit {process.wait()})")
    yield process, line.split()[-1]
    process.send_signal(signal.SIGTERM)
    process.wait(30)
    process.stdout.close()


async def _grade(address: str, token: str | None, **kw) -> object:
    async with VerifyClient(address, timeout_s=30, token=token, **kw) as client:
        try:
            return (await client.grade("\\boxed{42}", "42")).correct
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details()


def test_only_callers_with_the_token_are_graded(served, token_file) -> None:
    _, address = served

    async def main() -> list[object]:
        return [await _grade(address, t) for t in (None, "wrong", token_file[1])]

    assert asyncio.run(main()) == [
        (grpc.StatusCode.UNAUTHENTICATED, DENIED),
        (grpc.StatusCode.UNAUTHENTICATED, DENIED),
        True,
    ]


def test_batches_need_the_token_too_and_health_stays_open(served) -> None:
    async def main() -> tuple[bool, object]:
        async with VerifyClient(served[1], timeout_s=30) as client:
            healthy = await client.health()
            try:
                await client.grade_many([("\\boxed{1}", "1")])
            except grpc.aio.AioRpcError as exc:
                return healthy, exc.code()
        return healthy, None

    assert asyncio.run(main()) == (True, grpc.StatusCode.UNAUTHENTICATED)


def test_the_token_is_not_in_the_servers_cmdline_or_environment(served, token_file) -> None:
    process, _ = served
    cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{process.pid}/environ").read_bytes()
    assert str(token_file[0]).encode() in cmdline  # the file's path, and only that
    assert token_file[1].encode() not in cmdline
    assert token_file[1].encode() not in environ


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=60)


def test_a_non_loopback_bind_without_a_token_is_refused() -> None:
    out = _serve("--host", "0.0.0.0")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "rstar2-verify: refusing to listen on 0.0.0.0 without a token: pass --token-file PATH "
        "(or --insecure to accept calls from anyone who can reach this port)"
    ]


def test_a_bad_token_file_is_one_line(tmp_path: Path) -> None:
    exposed = tmp_path / "token"
    exposed.write_text("s3cret\n")
    exposed.chmod(0o640)
    out = _serve("--token-file", str(exposed))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"rstar2-verify: token file {exposed} is readable by others (mode 0640): chmod 600 {exposed}"
    ]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_tls_with_a_token(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    config = VerifyConfig(workers=1)

    async def main() -> list[object]:
        server = VerifyServer(config, token="t0ken", tls_cert_file=str(cert), tls_key_file=str(key))
        await server.start()
        try:
            roots = cert.read_bytes()
            return [
                await _grade(server.address, "t0ken", root_certificates=roots),
                await _grade(server.address, None, root_certificates=roots),
            ]
        finally:
            await server.stop()

    assert asyncio.run(main()) == [True, (grpc.StatusCode.UNAUTHENTICATED, DENIED)]

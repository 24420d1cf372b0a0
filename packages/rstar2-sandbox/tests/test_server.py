"""The gRPC server and client: streaming, batching, back-pressure, deadlines, shutdown, auth,
failover, TLS and the CLI's refusals. Real servers on 127.0.0.1 port 0, real workers."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rstar2_proto.sandbox.v1 import sandbox_pb2 as pb
from rstar2_proto.sandbox.v1 import sandbox_pb2_grpc as pb_grpc
from rstar2_sandbox import ExecutionRequest, ExecutionStatus, SandboxConfig, ServerConfig
from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.server import SandboxServer

S = ExecutionStatus
LIGHT = SandboxConfig(workers=1, preload=("math",), warmup_code="", max_in_flight=4)


def _config(**kw) -> ServerConfig:
    sandbox = kw.pop("sandbox", LIGHT)
    return ServerConfig(port=0, sandbox=sandbox, **kw)


@pytest.fixture(scope="module")
def served(runner: asyncio.Runner):
    server = SandboxServer(_config())
    port = runner.run(server.start())
    yield server, f"127.0.0.1:{port}"
    runner.run(server.stop(1))


def test_info_and_health(runner, served):
    address = served[1]

    async def ask():
        async with SandboxClient(address) as client:
            return await client.info()

    (info,) = runner.run(ask())
    assert info.workers == 1 and info.preloaded == ["math"]
    assert {"rlimits", "new_session"} <= set(info.confinements)
    assert info.limits["max_output_bytes"] == 16384

    async def check():
        async with grpc.aio.insecure_channel(address) as channel:
            request = health_pb2.HealthCheckRequest(
                service="rstar2_proto.sandbox.v1.SandboxService"
            )
            stub = health_pb2_grpc.HealthStub(channel)
            return await stub.Check(request, timeout=5)  # type: ignore[attr-defined]

    reply = runner.run(check())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_stream_answers_every_request_by_id(runner, served):
    async def stream():
        async with grpc.aio.insecure_channel(served[1]) as channel:
            stub = pb_grpc.SandboxServiceStub(channel)
            requests = [
                pb.ExecuteRequest(code=f"print({i} ** 2)", request_id=str(i)) for i in range(30)
            ]
            requests.append(pb.ExecuteRequest(code="", request_id="bad"))
            return [r async for r in stub.ExecuteStream(iter(requests), timeout=60)]

    replies = {r.request_id: r for r in runner.run(stream())}
    assert len(replies) == 31
    assert all(replies[str(i)].stdout == f"{i**2}\n" for i in range(30))
    assert replies["bad"].status == pb.STATUS_REJECTED and "code is empty" in replies["bad"].message


def test_batch_keeps_order(runner, served):
    async def batch():
        async with grpc.aio.insecure_channel(served[1]) as channel:
            stub = pb_grpc.SandboxServiceStub(channel)
            codes = ["import time; time.sleep(0.2); print('slow')", "print('fast')", "1/0"]
            return await stub.ExecuteBatch(
                pb.ExecuteBatchRequest(requests=[pb.ExecuteRequest(code=c) for c in codes]),
                timeout=30,
            )

    reply = runner.run(batch())
    assert [r.stdout for r in reply.responses] == ["slow\n", "fast\n", ""]
    assert reply.responses[2].status == pb.STATUS_ERROR


def test_full_queue_is_resource_exhausted(runner):
    tight = SandboxConfig(workers=1, preload=(), warmup_code="", max_in_flight=1, max_queue=1)

    async def scenario():
        server = SandboxServer(_config(sandbox=tight))
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.SandboxServiceStub(channel)
                slow = pb.ExecuteRequest(code="import time; time.sleep(0.5)")
                calls = [stub.Execute(slow, timeout=30) for _ in range(3)]
                return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await server.stop(1)

    outcomes = runner.run(scenario())
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(refused) == 1 and refused[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue full" in (refused[0].details() or "")
    assert (
        sum(isinstance(o, pb.ExecuteResponse) and o.status == pb.STATUS_OK for o in outcomes) == 2
    )


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_deadline_cancels_the_call(runner, served):
    server, address = served

    async def call():
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.SandboxServiceStub(channel)
            request = pb.ExecuteRequest(code="import time; time.sleep(30)", timeout_s=30)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Execute(request, timeout=0.5)
            return info.value.code()

    assert runner.run(call()) == grpc.StatusCode.DEADLINE_EXCEEDED
    ((_, worker_pid),) = server.sandbox.worker_processes()  # the zygote, parent of every call
    deadline = time.monotonic() + 3
    while _children(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children(worker_pid) == []  # the sleeping child was killed, not left to run 30 s


def test_graceful_shutdown_finishes_then_fails_in_flight(runner):
    async def scenario():
        server = SandboxServer(_config())
        port = await server.start()
        async with SandboxClient(f"127.0.0.1:{port}") as client:
            short = asyncio.create_task(
                client.execute(ExecutionRequest(code="import time; time.sleep(0.3); print('done')"))
            )
            long = asyncio.create_task(
                client.execute(ExecutionRequest(code="import time; time.sleep(30)", timeout_s=30))
            )
            await asyncio.sleep(0.15)
            started = time.monotonic()
            await server.stop(grace=1.0)
            return await short, await long, time.monotonic() - started

    short, long, took = runner.run(scenario())
    assert (short.status, short.stdout) == (S.OK, "done\n")
    assert long.status is S.SANDBOX_ERROR  # failed explicitly, not left hanging
    assert "UNAVAILABLE" in long.message or "CANCELLED" in long.message
    assert took < 5


def test_token_is_required(runner):
    async def scenario():
        server = SandboxServer(_config(token="s3cret"))
        port = await server.start()
        try:
            address = f"127.0.0.1:{port}"
            async with (
                SandboxClient(address) as anonymous,
                SandboxClient(address, token="s3cret") as ok,
            ):
                return await anonymous.execute(ExecutionRequest(code="1")), await ok.execute(
                    ExecutionRequest(code="1")
                )
        finally:
            await server.stop(1)

    refused, accepted = runner.run(scenario())
    assert refused.status is S.SANDBOX_ERROR and "UNAUTHENTICATED" in refused.message
    assert (accepted.status, accepted.result_repr) == (S.OK, "1")


def test_client_fails_over_when_a_server_dies(runner):
    async def scenario():
        first, second = SandboxServer(_config()), SandboxServer(_config())
        ports = [await first.start(), await second.start()]
        addresses = [f"127.0.0.1:{p}" for p in ports]
        async with SandboxClient(addresses, retry_after_s=5) as client:
            before = await client.execute_many([ExecutionRequest(code=f"{i}") for i in range(8)])
            await first.stop(0)
            after = await client.execute_many([ExecutionRequest(code=f"{i}") for i in range(8)])
        await second.stop(0)
        return before, after

    before, after = runner.run(scenario())
    assert [r.result_repr for r in before] == [str(i) for i in range(8)]
    assert [r.result_repr for r in after] == [str(i) for i in range(8)]


def test_sessions_over_grpc(runner, served):
    async def scenario():
        async with SandboxClient(served[1]) as client:
            await client.execute(ExecutionRequest(code="total = 1", session_id="grpc-s"))
            grown = await client.execute(
                ExecutionRequest(code="total *= 7\ntotal", session_id="grpc-s")
            )
            return grown, await client.close_session("grpc-s"), await client.close_session("grpc-s")

    grown, closed, again = runner.run(scenario())
    assert (grown.status, grown.result_repr, closed, again) == (S.OK, "7", True, False)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(runner, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )

    async def scenario():
        server = SandboxServer(_config(tls_cert_file=str(cert), tls_key_file=str(key)))
        port = await server.start()
        try:
            async with SandboxClient(f"localhost:{port}", root_certificates=cert.read_bytes()) as c:
                return await c.execute(ExecutionRequest(code="print('over tls')"))
        finally:
            await server.stop(1)

    assert runner.run(scenario()).stdout == "over tls\n"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rstar2_sandbox.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_refuses_without_isolation_by_default():
    done = _cli("serve", "--port", "0", "--workers", "1", "--no-seccomp")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1
    assert "isolation required but incomplete (seccomp: disabled by configuration)" in done.stderr


def test_weak_isolation_is_allowed_only_explicitly_and_says_so(runner):
    async def scenario():
        config = _config(
            sandbox=LIGHT.model_copy(update={"seccomp": False, "require_isolation": False})
        )
        server = SandboxServer(config)
        port = await server.start()
        try:
            async with SandboxClient(f"127.0.0.1:{port}") as client:
                return (await client.info())[0]
        finally:
            await server.stop(1)

    info = runner.run(scenario())
    assert "seccomp" not in info.confinements
    assert info.warning.startswith("WEAK ISOLATION") and "seccomp" in info.warning


def test_cli_user_mistakes_are_one_line():
    bad = _cli("serve", "--workers", "0")
    assert (
        bad.returncode == 2 and "must be positive" in bad.stderr and "Traceback" not in bad.stderr
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = _cli("serve", "--port", str(taken.getsockname()[1]), "--workers", "1")
    assert busy.returncode == 2 and "Traceback" not in busy.stderr
    assert busy.stderr.strip().splitlines()[-1].startswith("rstar2-sandbox: cannot start")
    gone = _cli("info", "--address", "127.0.0.1:1")
    assert gone.returncode == 2 and "no sandbox server answered" in gone.stderr


def test_full_servers_are_the_sandboxs_failure_and_are_retried_elsewhere(runner):
    tight = LIGHT.model_copy(update={"max_in_flight": 1, "max_queue": 0})

    async def scenario():
        first, second = SandboxServer(_config(sandbox=tight)), SandboxServer(_config(sandbox=tight))
        addresses = [f"127.0.0.1:{await first.start()}", f"127.0.0.1:{await second.start()}"]
        slow = ExecutionRequest(code="import time; time.sleep(1.5); print('ran')", timeout_s=5)
        try:
            async with SandboxClient(addresses) as client:
                return await client.execute_many([slow, slow, slow])
        finally:
            await first.stop(1)
            await second.stop(1)

    results = runner.run(scenario())
    statuses = sorted(r.status for r in results)
    assert statuses == sorted([S.OK, S.OK, S.SANDBOX_ERROR])  # two servers took one each
    refused = next(r for r in results if r.status is S.SANDBOX_ERROR)
    assert "RESOURCE_EXHAUSTED" in refused.message and refused.failed is False

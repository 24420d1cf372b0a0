"""The run's service token: `RunToken.create` writes an owner-only file in the run directory, and a
`ChildServer` given it starts a real `rstar2-verify serve` that refuses callers without the token,
grades for the trainer's client, and shows only the file's path on its command line."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import grpc
import pytest

from rstar2_proto.auth import DENIED
from rstar2_trainer.placement.local import grpc_healthy
from rstar2_trainer.placement.servers import ChildServer, RunToken, ServerError, console_script
from rstar2_verify import Verifier


def test_the_run_token_file_is_owner_only_and_fresh_per_start(tmp_path: Path) -> None:
    first = RunToken.create(tmp_path)
    second = RunToken.create(tmp_path)
    assert first.path == second.path == tmp_path / "service.token"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert first.path.read_text().strip() == second.value != first.value
    assert second.value not in repr(second)


def test_a_child_server_with_the_run_token_serves_only_the_trainer(tmp_path: Path) -> None:
    token = RunToken.create(tmp_path)
    argv = [*console_script("rstar2-verify"), "serve", "--workers", "1"]
    server = ChildServer("verify", argv, health=grpc_healthy, token_file=token.path)
    server.start()
    try:
        assert server._proc is not None
        cmdline = Path(f"/proc/{server._proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{server._proc.pid}/environ").read_bytes()

        async def grade(with_token: str | None) -> object:
            verifier = Verifier.remote(server.address, token=with_token)
            try:
                return [g.correct for g in await verifier.grade_many([("\\boxed{4}", "4")])]
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details()
            finally:
                await verifier.close()

        anonymous = asyncio.run(grade(None))
        trainer = asyncio.run(grade(token.value))
    finally:
        server.stop()
    assert str(token.path).encode() in cmdline
    assert token.value.encode() not in cmdline and token.value.encode() not in environ
    assert anonymous == (grpc.StatusCode.UNAUTHENTICATED, DENIED)
    assert trainer == [True]


def test_an_exposed_token_file_for_a_remote_service_is_one_line(tmp_path: Path) -> None:
    from rstar2_trainer.config import ServiceConfig
    from rstar2_trainer.placement.servers import service_token

    path = tmp_path / "token"
    path.write_text("abc\n")
    path.chmod(0o644)
    service = ServiceConfig(mode="address", address="10.0.0.1:1", token_file=str(path))
    with pytest.raises(ServerError) as info:
        service_token(service, None)
    assert (
        str(info.value) == f"token file {path} is readable by others (mode 0644): chmod 600 {path}"
    )
    path.chmod(0o600)
    assert service_token(service, None) == "abc"


@pytest.mark.slow  # starts a sandbox (numpy, sympy preloaded) and a verify server: ~20 s here
def test_node_servers_write_their_own_token_file_and_require_it() -> None:
    """What a cluster node's actor does (run here as a plain object: no Ray needed)."""
    from rstar2_sandbox import ExecutionRequest
    from rstar2_sandbox.client import SandboxClient
    from rstar2_trainer.placement.engine_actor import NodeServers

    secret = "node-secret-token"
    node = NodeServers(["--workers", "1"], ["--workers", "1"], host="127.0.0.1", token=secret)
    try:
        assert node._token_dir is not None
        folder = Path(node._token_dir)
        file = folder / "service.token"
        modes = stat.S_IMODE(folder.stat().st_mode), stat.S_IMODE(file.stat().st_mode)
        addresses = node.addresses()

        async def calls() -> tuple[object, object, object]:
            results = []
            for token in (None, secret):
                async with SandboxClient(addresses["sandbox"], token=token) as sandbox:
                    results.append(await sandbox.execute(ExecutionRequest(code="6 * 7")))
            verifier = Verifier.remote(addresses["verify"], token=secret)
            try:
                graded = [g.correct for g in await verifier.grade_many([("\\boxed{4}", "4")])]
            finally:
                await verifier.close()
            return results[0], results[1], graded

        refused, answered, graded = asyncio.run(calls())
    finally:
        node.stop()
    assert modes == (0o700, 0o600)
    assert "UNAUTHENTICATED" in refused.message  # pyright: ignore[reportAttributeAccessIssue]
    assert answered.result_repr == "42"  # pyright: ignore[reportAttributeAccessIssue]
    assert graded == [True]
    assert not folder.exists()  # removed on stop

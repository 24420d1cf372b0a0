import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rstar2_trainer.placement.servers import ChildServer, ServerError


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        server = ChildServer("sandbox", [sys.executable, "-c", "pass"], port=port)
        with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()


def test_a_server_that_exits_at_start_up_reports_its_stderr():
    argv = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('bad flag --workers\\n'); sys.exit(2)",
    ]
    server = ChildServer("verify", argv, ready_timeout_s=10)
    with pytest.raises(ServerError, match=r"exited with code 2.*bad flag --workers"):
        server.start()


def test_a_server_that_never_listens_times_out_and_is_stopped():
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    server = ChildServer("verify", argv, ready_timeout_s=1.5)
    with pytest.raises(ServerError, match="did not become healthy"):
        server.start()
    assert not server.alive


_PARENT = """
import subprocess, sys, time
from rstar2_trainer.placement.servers import with_parent_death_signal
child = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)", sys.argv[1]]
subprocess.Popen(with_parent_death_signal(child))
time.sleep(120)
"""


def _exited(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(") ", 1)[1].startswith(("Z", "X"))
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_child_gets_sigterm_when_its_parent_is_killed(tmp_path):
    """The trampoline asks for PR_SET_PDEATHSIG, then execs the real command (no preexec_fn)."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(pid_file)])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while not _exited(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _exited(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its SIGKILLed parent")


def _verify_server(tmp_path: Path, restarts: int) -> ChildServer:
    from rstar2_trainer.placement.local import grpc_healthy
    from rstar2_trainer.placement.servers import RunToken, console_script

    token = RunToken.create(tmp_path)
    argv = [*console_script("rstar2-verify"), "serve", "--workers", "1"]
    server = ChildServer(
        "verify", argv, health=grpc_healthy, token_file=token.path, restarts=restarts
    )
    server.token = token.value  # type: ignore[attr-defined]
    return server


def test_a_killed_verify_server_comes_back_on_its_address_and_calls_are_resent(tmp_path, caplog):
    """SIGKILL while a client grades in a loop: the watcher starts it again on the same port
    with the same token, the client's calls that failed meanwhile are sent again, and every
    grade is the right verdict (none turned into a wrong answer)."""
    import asyncio

    from rstar2_verify.client import VerifyClient

    server = _verify_server(tmp_path, restarts=2)
    address = server.start()

    async def grade_through_a_kill() -> tuple[list[bool], int]:
        client = VerifyClient(address, token=server.token, retry_for_s=60)  # type: ignore[attr-defined]
        verdicts = []
        try:
            for i in range(40):
                if i == 10:
                    assert server.pid is not None
                    os.kill(server.pid, signal.SIGKILL)
                grades = await client.grade_many([("\\boxed{4}", "4"), ("\\boxed{5}", "4")])
                verdicts += [g.correct for g in grades]
                await asyncio.sleep(0.05)
        finally:
            await client.close()
        return verdicts, client.retried

    try:
        verdicts, retried = asyncio.run(grade_through_a_kill())
        assert verdicts == [True, False] * 40
        assert server.restarts_done == 1 and server.address == address and server.alive
        assert retried >= 1
        assert f"verify server at {address} exited with code -9; restarted (1 of 2)" in [
            r.getMessage() for r in caplog.records if r.name == "rstar2_trainer.servers"
        ]
        server.check()  # alive again: no error
    finally:
        server.stop()
    assert not server.alive


def test_a_server_that_cannot_come_back_is_a_restartable_error(tmp_path):
    server = _verify_server(tmp_path, restarts=0)
    server.start()
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ServerError, match="exited with code -9") as caught:
        server.check()
    assert caught.value.restartable

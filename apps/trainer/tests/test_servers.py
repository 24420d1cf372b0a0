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

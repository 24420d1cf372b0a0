"""Hostile code and bad input against the real server (`rstar2-sandbox serve` in a subprocess).

Every test runs twice: against a server started as root, and against one started as `nobody`
(through `as_nobody.py`). Both are started with the defaults, so isolation is required: a server
that could not confine calls completely would refuse to start. Each case must get a clear status,
leave no process behind, and leave the server serving the next request at full speed.

One module on purpose (over 600 lines): every threat runs against the same two module-scoped
servers, and a second module would start both again.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from rstar2_proto.sandbox.v1 import sandbox_pb2 as pb
from rstar2_proto.sandbox.v1 import sandbox_pb2_grpc as pb_grpc
from rstar2_sandbox import ExecutionRequest, ExecutionStatus
from rstar2_sandbox._confine import REQUIRED
from rstar2_sandbox.client import SandboxClient

S = ExecutionStatus
SECRET = "hunter2-do-not-leak"
SESSION_CPU_S = 3
AS_NOBODY = Path(__file__).with_name("as_nobody.py")


def _can_run_as_nobody() -> str | None:
    if os.geteuid() != 0:
        return "needs root to start a server as nobody"
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return "no user nobody"
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000) != 0)"
    done = subprocess.run([sys.executable, str(AS_NOBODY), sys.executable, "-c", probe], cwd="/")
    if done.returncode != 0:  # a host setting, not a sandbox defect: the server would refuse
        return "unprivileged user namespaces are disabled on this host"
    return None


@pytest.fixture(scope="module")
def host_data():
    """A world-readable file on the host, like a run's heldout.jsonl with gold answers."""
    base = Path(
        tempfile.mkdtemp(
            prefix="rstar2-hostile-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None
        )
    )
    base.chmod(0o755)
    gold = base / "heldout.jsonl"
    gold.write_text('{"answer": "gold-answer-42"}\n')
    gold.chmod(0o644)
    yield gold
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module", params=["root", "nobody"])
def server(request):
    if request.param == "nobody" and (why := _can_run_as_nobody()):
        pytest.skip(why)
    env = {**os.environ, "RSTAR2_TEST_SECRET": SECRET}
    command = [sys.executable, "-m", "rstar2_sandbox.cli", "serve", "--port", "0", "--workers", "1"]
    command += ["--session-cpu-s", str(SESSION_CPU_S)]  # small, so that its test is short
    if request.param == "nobody":
        command = [sys.executable, str(AS_NOBODY), *command]
    # stderr to a file, not a pipe: a full pipe would stall the server
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd="/"
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if not match:
            log.seek(0)
            tail = log.read().decode()[-2000:]
            raise AssertionError(f"{request.param} server did not start: {tail}")
        yield process, match.group(1)
        process.terminate()
        assert process.wait(30) == 0
        process.stdout.close()


@pytest.fixture(scope="module")
def client(server, runner: asyncio.Runner):
    c = SandboxClient(server[1])
    yield c
    runner.run(c.close())


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return sorted(int(p) for p in f.read().split())
    except FileNotFoundError:
        return []


def _worker_tree(server_pid: int) -> list[int]:
    """The server's workers and their zygotes, once they are all up."""
    for _ in range(200):
        workers = _children(server_pid)
        zygotes = [z for w in workers for z in _children(w)]
        if workers and len(zygotes) == len(workers):
            return sorted(workers + zygotes)
        time.sleep(0.05)
    raise AssertionError("the server's workers did not come up")


@pytest.fixture(scope="module")
def workers(server):
    return _worker_tree(server[0].pid)


HOSTILE = [
    ("fork_bomb", "import os\nwhile True:\n    os.fork()", S.ERROR, "PermissionError"),
    (
        "subprocess",
        "import subprocess\nsubprocess.Popen(['sleep', '100'])",
        S.ERROR,
        "PermissionError",
    ),
    ("busy_loop", "while True:\n    pass", S.TIMEOUT, ""),
    ("ten_gigabytes", "x = bytearray(10 * 1024**3)", S.MEMORY_EXCEEDED, "MemoryError"),
    (
        "numpy_ten_gigabytes",
        "import numpy as np\nx = np.ones(10 * 1024**3 // 8)",
        S.MEMORY_EXCEEDED,
        "MemoryError",
    ),
    ("hundred_megabytes_out", "print('z' * 100_000_000)", S.OUTPUT_TRUNCATED, ""),
    ("write_etc", "open('/etc/rstar2-owned', 'w')", S.ERROR, "Read-only file system"),
    ("write_tmp_is_private", "open('/tmp/rstar2-owned', 'w').write('x')", S.OK, ""),
    ("write_parent", "open('../rstar2-owned', 'w')", S.ERROR, "Read-only file system"),
    (
        "socket",
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        S.ERROR,
        "PermissionError",
    ),
    ("kill_parent", "import os\nos.kill(os.getppid(), 9)", S.ERROR, "PermissionError"),
    ("kill_everyone", "import os\nos.kill(-1, 9)", S.ERROR, "PermissionError"),
    ("kill_group_of_init", "import os\nos.killpg(1, 9)", S.ERROR, "PermissionError"),
    (
        "sysv_shared_memory",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.shmget(0, 1 << 30, 0o1600) == -1, 'created'\n"
        "raise OSError(ctypes.get_errno(), 'shmget')",
        S.ERROR,
        "[Errno 1]",
    ),
    (
        "sysv_message_queue",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.msgget(0, 0o1600) == -1, 'created'\n"
        "raise OSError(ctypes.get_errno(), 'msgget')",
        S.ERROR,
        "[Errno 1]",
    ),
    ("memfd", "import os\nos.memfd_create('x')", S.ERROR, "PermissionError"),
    ("zygote_memory", "open('/proc/1/mem', 'rb')", S.ERROR, "PermissionError"),
    ("zygote_environ", "open('/proc/1/environ', 'rb')", S.ERROR, "PermissionError"),
    (
        "posix_shared_memory",
        "from multiprocessing import shared_memory\nshared_memory.SharedMemory(create=True, size=1 << 30)",
        S.ERROR,
        "Error",
    ),
    ("self_sigkill", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", S.ERROR, "SIGKILL"),
    (
        "clear_pdeathsig",
        "import ctypes\nassert ctypes.CDLL(None).prctl(1, 0, 0, 0, 0) == 0\nprint('cleared')",
        S.OK,
        "",
    ),
    (
        "ignore_sigterm",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.1)",
        S.TIMEOUT,
        "",
    ),
    ("syntax_error", "def f(:\n    pass", S.ERROR, "SyntaxError"),
    ("sys_exit", "import sys\nsys.exit(3)", S.ERROR, ""),
    ("os_exit", "import os\nprint('bye', flush=True)\nos._exit(0)", S.OK, ""),
    ("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)", S.ERROR, "RecursionError"),
    (
        "ptrace_parent",
        "import ctypes\nassert ctypes.CDLL(None).ptrace(16, __import__('os').getppid(), 0, 0) == 0",
        S.ERROR,
        "AssertionError",
    ),
]


def _alive_below(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except FileNotFoundError:
            kids = []
        found += kids
        frontier += kids
    return sorted(found)


def _assert_clean_and_fast(runner, client, server, workers):
    for _ in range(20):  # the worker reaps within milliseconds; allow the scheduler some slack
        if _alive_below(server[0].pid) == workers:
            break
        time.sleep(0.05)
    assert _alive_below(server[0].pid) == workers  # no call survived, no worker was replaced
    start = time.monotonic()
    r = runner.run(client.execute(ExecutionRequest(code="print(6 * 7)")))
    assert (r.status, r.stdout) == (S.OK, "42\n")
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize(("name", "code", "status", "needle"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_code(runner, client, server, workers, name, code, status, needle):
    timeout = 1.0 if status is S.TIMEOUT else 10.0  # pushing 100 MB through a pipe takes time
    r = runner.run(client.execute(ExecutionRequest(code=code, timeout_s=timeout)))
    assert r.status is status, (r.status, r.message, r.traceback[-300:])
    assert needle in r.traceback + r.message
    if name == "hundred_megabytes_out":
        assert len(r.stdout) < 17_000 and "output truncated" in r.stdout
    if name == "sys_exit":
        assert r.exit_code == 3
    if name == "busy_loop":  # stopped by its CPU time (on a busy host, later in wall time)
        assert "(CPU time)" in r.message and 0.9 <= r.cpu_s < 2.0, r.message
    if name == "ignore_sigterm":  # asleep: stopped by its own wall time, at the limit
        assert "(running, sleeping or blocked)" in r.message and 1.0 <= r.wall_s < 2.0
    _assert_clean_and_fast(runner, client, server, workers)


def test_threads_do_not_outlive_the_call(runner, client, server, workers):
    daemon = (
        "import threading, time\n"
        "threading.Thread(target=lambda: time.sleep(1000), daemon=True).start()\n"
        "print('main done', flush=True)"
    )
    r = runner.run(client.execute(ExecutionRequest(code=daemon, timeout_s=1.0)))
    assert (r.status, r.stdout) == (S.OK, "main done\n") and r.wall_s < 0.5
    stuck = daemon.replace("daemon=True", "daemon=False")  # python file.py would wait for it
    r = runner.run(client.execute(ExecutionRequest(code=stuck, timeout_s=1.0)))
    assert (r.status, r.stdout) == (S.TIMEOUT, "main done\n")
    _assert_clean_and_fast(runner, client, server, workers)


def test_the_servers_environment_is_out_of_reach(runner, client, server, workers):
    code = (
        "import os\n"
        "print(dict(os.environ))\n"
        "for path in ('/proc/self/environ', f'/proc/{os.getppid()}/environ', '/proc/1/environ'):\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print(path, type(e).__name__)\n"
    )
    r = runner.run(client.execute(ExecutionRequest(code=code)))
    assert r.status is S.OK
    assert SECRET not in r.stdout and "RSTAR2_TEST_SECRET" not in r.stdout
    assert "PermissionError" in r.stdout  # the worker's and init's environ are not readable
    _assert_clean_and_fast(runner, client, server, workers)


def test_writing_inside_the_working_directory_works(runner, client):
    code = "open('notes.txt', 'w').write('ok')\nprint(open('notes.txt').read())"
    r = runner.run(client.execute(ExecutionRequest(code=code)))
    assert (r.status, r.stdout) == (S.OK, "ok\n")


def _raw_execute(address: str, payload: bytes) -> grpc.RpcError:
    channel = grpc.insecure_channel(address)
    call = channel.unary_unary("/rstar2_proto.sandbox.v1.SandboxService/Execute")
    try:
        with pytest.raises(grpc.RpcError) as info:
            call(payload, timeout=10)
        return info.value
    finally:
        channel.close()


def test_invalid_utf8_is_invalid_argument(server):
    payload = b"\x0a\x04\xff\xfe\x28\x29"  # field 1 (code), 4 bytes that are not UTF-8
    error = _raw_execute(server[1], payload)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "UTF-8" in error.details()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("request_kw", "reason"),
    [
        ({"code": ""}, "code is empty"),
        ({"code": "print(1)", "timeout_s": -1.0}, "timeout_s must be positive"),
        ({"code": "x = 1\n" * ((10 << 20) // 6)}, "code exceeds 1048576 bytes"),
    ],
    ids=["no_code", "negative_timeout", "ten_megabytes_of_source"],
)
def test_bad_requests_are_invalid_argument(server, request_kw, reason):
    with grpc.insecure_channel(
        server[1], options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        stub = pb_grpc.SandboxServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Execute(pb.ExecuteRequest(**request_kw), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert reason in info.value.details()  # type: ignore[attr-defined]


def test_info_reports_every_confinement(runner, client):
    (info,) = runner.run(client.info())
    assert set(REQUIRED) <= set(info.confinements), info.unavailable
    assert info.warning == ""
    assert "cgroup" in info.unavailable  # no cgroup v2 delegation here: said, not claimed
    v1 = {}  # controller -> its cgroup v1 hierarchy id (0: none), as the kernel lists them
    with open("/proc/cgroups") as table:
        for fields in (line.split() for line in table if not line.startswith("#")):
            v1[fields[0]] = fields[1]
    if v1.get("memory", "0") != "0":  # this host: memory is on a v1 hierarchy, so v2 lacks it
        assert "no memory" in info.unavailable["cgroup"], info.unavailable["cgroup"]
        assert "RLIMIT_AS" in info.unavailable["cgroup"]


def test_the_host_is_out_of_sight(runner, client, server, workers, host_data):
    code = f"""
import os, sys, errno
seen = {{}}
try:
    open({str(host_data)!r}).read()
    seen["gold"] = "READ"
except OSError as e:
    seen["gold"] = type(e).__name__
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
seen["pids"] = len(pids)
seen["server"] = any(b"rstar2_sandbox.cli" in open(f"/proc/{{p}}/cmdline", "rb").read() for p in pids)
seen["dev"] = sorted(os.listdir("/dev"))
for path in (sys.prefix + "/owned.pth", "/var/tmp/owned", "/dev/shm/owned", "/owned"):
    try:
        open(path, "w")
        seen[path] = "WROTE"
    except OSError as e:
        seen[path] = errno.errorcode[e.errno]
status = open("/proc/self/status").read().splitlines()
seen["caps"] = sorted({{line.split()[1] for line in status if line.startswith("Cap")}})
print(seen)
"""
    r = runner.run(client.execute(ExecutionRequest(code=code)))
    assert r.status is S.OK, r.traceback
    seen = eval(r.stdout)
    assert seen["gold"] == "FileNotFoundError"  # not mounted in the call's tree
    assert seen["pids"] <= 3 and not seen["server"]  # the zygote, the call, maybe a sibling
    assert seen["dev"] == [
        "fd",
        "full",
        "null",
        "random",
        "stderr",
        "stdin",
        "stdout",
        "urandom",
        "zero",
    ]
    # no .pth into the virtualenv (EACCES where it lives under /tmp: the call's own /tmp holds
    # the read-only trees in root-owned folders)
    assert seen[sys.prefix + "/owned.pth"] in ("EROFS", "EACCES")
    assert all(
        seen[p] in ("EROFS", "ENOENT") for p in ("/var/tmp/owned", "/dev/shm/owned", "/owned")
    )
    assert seen["caps"] == ["0000000000000000"]  # effective, permitted, bounding, ambient: empty
    _assert_clean_and_fast(runner, client, server, workers)


def test_a_hostile_report_is_that_calls_error_only(runner, client, server, workers):
    sibling = ExecutionRequest(code="import time\ntime.sleep(0.8)\nprint('sibling')", timeout_s=5)
    hostile = [
        ExecutionRequest(code="import json\njson.dumps = None\nprint('x')"),
        ExecutionRequest(code="import os\nos.write(3, b'{\"exc_type\": 7}')\nos._exit(0)"),
        ExecutionRequest(code="import os\nos.write(3, b'[' * 3_000_000)\nos._exit(0)"),
    ]
    results = runner.run(client.execute_many([sibling, *hostile]))
    assert (results[0].status, results[0].stdout) == (S.OK, "sibling\n")
    assert (results[1].status, results[1].stdout) == (S.OK, "x\n")
    assert results[2].status is S.ERROR and "report was refused" in results[2].message
    assert results[3].status is S.ERROR and "report over" in results[3].message
    _assert_clean_and_fast(runner, client, server, workers)


def test_a_call_cannot_find_its_siblings_requests(runner, client, server, workers):
    marker = "SIBLING-" + "SECRET"
    code = f"import time\nstdin = input()\ntime.sleep(1.0)\n# {marker} in the code too"
    victim = ExecutionRequest(code=code, stdin=marker + "\n", timeout_s=5)
    spy = """
import gc, sys, time
time.sleep(0.3)
needle, me, hits = "SIBLING" + "-SECRET", globals(), 0
for o in gc.get_objects():
    if type(o) is dict and o is not me:
        for v in list(o.values()):
            if type(v) in (str, bytes, bytearray) and needle in str(v):
                hits += 1
frame = sys._getframe().f_back
while frame is not None:  # the frames it was forked in: the zygote's, never a worker's request
    for v in list(frame.f_locals.values()):
        if v is not me and needle in repr(v):
            hits += 1
    frame = frame.f_back
print(hits)
"""
    results = runner.run(client.execute_many([victim, ExecutionRequest(code=spy, timeout_s=5)]))
    assert results[0].status is S.OK
    assert results[1].stdout == "0\n", results[1].stdout  # nothing of the other call inherited
    _assert_clean_and_fast(runner, client, server, workers)


def test_a_call_ends_the_way_python_file_py_ends(runner, client):
    code = (
        "import atexit, threading, time, sys\n"
        "atexit.register(print, 'atexit ran')\n"
        "class Noisy:\n"
        "    def __del__(self):\n"
        "        print('finalizer ran')\n"
        "keep = Noisy()\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()\n"
        "sys.stdout.write('unflushed, no newline')\n"
    )
    r = runner.run(client.execute(ExecutionRequest(code=code)))
    assert r.status is S.OK
    lines = r.stdout.splitlines()
    assert lines[0].startswith("unflushed, no newline")
    assert {"thread joined", "atexit ran", "finalizer ran"} <= {lines[0][21:], *lines[1:]}


FINALIZER_SEES = (
    "import pickle\n"
    "limit = 3\n"
    "class Late:\n"
    "    def __del__(self):\n"
    "        print('finalizer sees', limit, pickle.dumps(1)[:1])\n"
    "keep = Late()\n"
)
FINALIZER_HANGS = (
    "spin = True\nclass Hang:\n    def __del__(self):\n        while spin: pass\nh = Hang()\n"
)


def test_finalizers_at_exit_see_the_programs_globals(runner, client):
    """As under plain `python`: __main__'s globals are intact when its finalizers run, so one
    that loops on a global holds the call until its timeout (it used to see NameError: ok)."""
    seen = runner.run(client.execute(ExecutionRequest(code=FINALIZER_SEES)))
    assert (seen.status, seen.stdout, seen.stderr) == (S.OK, "finalizer sees 3 b'\\x80'\n", "")
    hung = runner.run(client.execute(ExecutionRequest(code=FINALIZER_HANGS, timeout_s=1.5)))
    assert hung.status is S.TIMEOUT and "(CPU time)" in hung.message, hung.message
    assert hung.wall_s >= 1.5 and 1.4 <= hung.cpu_s < 3  # it spins: its CPU time is what ends it


def test_sessions_are_scoped_to_the_caller_and_frozen_between_cells(runner, client, server):
    async def scenario():
        async with SandboxClient(server[1]) as other:
            first = await client.execute(ExecutionRequest(code="x = 41", session_id="shared"))
            stranger = await other.execute(ExecutionRequest(code="x", session_id="shared"))
            await client.execute(ExecutionRequest(code="1", session_id="mine-only"))
            closed_by_stranger = await other.close_session("mine-only")
            await other.close_session("shared")  # its own session of that name
            mine = await client.execute(ExecutionRequest(code="x + 1", session_id="shared"))
            spin = (
                "import threading, time\n"
                "threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()\n"
                "t0 = time.process_time()"
            )
            await client.execute(ExecutionRequest(code=spin, session_id="shared"))
            await asyncio.sleep(1.0)
            burnt = await client.execute(
                ExecutionRequest(code="time.process_time() - t0", session_id="shared")
            )
            await client.close_session("shared")
            await client.close_session("mine-only")
            return first, stranger, closed_by_stranger, mine, burnt

    first, stranger, closed_by_stranger, mine, burnt = runner.run(scenario())
    assert first.status is S.OK
    assert stranger.status is S.ERROR and "NameError" in stranger.traceback  # a session of its own
    assert closed_by_stranger is False
    assert (mine.status, mine.result_repr) == (S.OK, "42")
    assert burnt.status is S.OK and float(burnt.result_repr) < 0.5  # stopped while idle


def test_tmp_is_the_calls_own(runner, client, server, workers):
    """A call's /tmp (its cwd) is a tmpfs of its own: what it writes reaches neither the host's
    /tmp nor the next call, so Info's `private_tmp` is true."""
    name = f"rstar2-private-{os.getpid()}-{time.monotonic_ns()}"
    write = f"open('/tmp/{name}', 'w').write('x')\nimport os\nprint(sorted(os.listdir('/tmp')))"
    first = runner.run(client.execute(ExecutionRequest(code=write)))
    assert first.status is S.OK and name in first.stdout, first.traceback
    assert not os.path.exists(f"/tmp/{name}")  # not the host's /tmp
    look = f"import os\nprint(os.path.exists('/tmp/{name}'), os.getcwd())"
    second = runner.run(client.execute(ExecutionRequest(code=look)))
    assert (second.status, second.stdout) == (S.OK, "False /tmp\n")  # gone with the call
    _assert_clean_and_fast(runner, client, server, workers)


def test_each_namespace_hides_its_part_of_the_host(runner, client, server, workers):
    """Network, UTS and IPC namespaces, each seen on its own (seccomp would hide a missing
    network namespace from a socket test): only a loopback interface, the hostname `sandbox`,
    and none of the host's SysV objects (a segment this test creates on the host)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5EED0000 + os.getpid() % 0xFFFF
    segment = libc.shmget(key, 4096, 0o1600)  # IPC_CREAT, owner-only
    assert segment >= 0, os.strerror(ctypes.get_errno())
    try:
        with open("/proc/sysvipc/shm") as table:
            assert any(line.split()[0] == str(key) for line in table.readlines()[1:])
        code = (
            "import socket\n"
            "nets = [line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]]\n"
            "keys = [line.split()[0] for line in open('/proc/sysvipc/shm').readlines()[1:]]\n"
            "print(nets, socket.gethostname(), keys)"
        )
        r = runner.run(client.execute(ExecutionRequest(code=code)))
    finally:
        libc.shmctl(segment, 0, None)  # IPC_RMID
    assert (r.status, r.stdout) == (S.OK, "['lo'] sandbox []\n"), r.traceback
    _assert_clean_and_fast(runner, client, server, workers)


def test_a_root_server_never_reuses_a_uid_at_once(runner, client, server):
    """As root, each call runs as a uid of its own, and a freed uid goes to the back of the
    line: consecutive calls never share one (as nobody every call is nobody: documented)."""
    if server[0].args[1] == str(AS_NOBODY):
        pytest.skip("an unprivileged server has one uid; calls are apart by namespaces only")
    code = "import os\nprint(os.getuid(), os.getgid())"
    uids = []
    for _ in range(4):
        r = runner.run(client.execute(ExecutionRequest(code=code)))
        assert r.status is S.OK
        uid, gid = map(int, r.stdout.split())
        assert uid == gid and uid >= 61000
        uids.append(uid)
    assert len(set(uids)) == 4, uids


def test_a_hostile_session_frame_resets_that_session_only(runner, client, server, workers):
    """A session cell writes a huge frame header to its report pipe: that session is reset with
    a sandbox-side message; a call in flight on the same worker and the worker are unaffected."""

    async def scenario():
        await client.execute(ExecutionRequest(code="x = 1", session_id="forger"))
        sibling = asyncio.create_task(
            client.execute(ExecutionRequest(code="import time\ntime.sleep(0.5)\nprint('fine')"))
        )
        forged = "import os\nos.write(4, b'\\xff\\xff\\xff\\xff' + b'x' * 64)\nimport time\ntime.sleep(5)"
        hostile = await client.execute(
            ExecutionRequest(code=forged, session_id="forger", timeout_s=10)
        )
        after = await client.execute(ExecutionRequest(code="x", session_id="forger"))
        await client.close_session("forger")
        return hostile, await sibling, after

    hostile, sibling, after = runner.run(scenario())
    assert hostile.status is S.SANDBOX_ERROR and "malformed report" in hostile.message
    assert (sibling.status, sibling.stdout) == (S.OK, "fine\n")
    assert after.status is S.ERROR and "NameError" in after.traceback  # a fresh session
    _assert_clean_and_fast(runner, client, server, workers)


def test_closing_a_busy_session_does_not_wait_for_it(runner, client, server, workers):
    async def scenario():
        stuck = asyncio.create_task(
            client.execute(
                ExecutionRequest(
                    code="import time\ntime.sleep(30)", session_id="busy", timeout_s=40
                )
            )
        )
        await asyncio.sleep(1.0)
        start = time.monotonic()
        closed = await client.close_session("busy")
        closing = time.monotonic() - start
        answer = await asyncio.wait_for(stuck, 5)
        return closed, closing, answer

    closed, closing, answer = runner.run(scenario())
    assert closed is True and closing < 1.0
    assert answer.status is S.ERROR and "was closed" in answer.message
    _assert_clean_and_fast(runner, client, server, workers)


def test_a_session_has_a_cumulative_cpu_budget_on_the_server(runner, client, server, workers):
    """The server's --session-cpu-s is the whole session's CPU, not each cell's: two cells of
    60 % of it each, and the second ends as a timeout naming the budget (not a crash)."""
    burn = (
        "import time\nt = time.process_time()\n"
        f"while time.process_time() - t < {0.6 * SESSION_CPU_S}: pass"
    )

    async def scenario():
        first = await client.execute(ExecutionRequest(code=burn, session_id="burner", timeout_s=20))
        second = await client.execute(
            ExecutionRequest(code=burn, session_id="burner", timeout_s=20)
        )
        await client.close_session("burner")
        return first, second

    first, second = runner.run(scenario())
    assert first.status is S.OK
    assert second.status is S.TIMEOUT and "CPU budget" in second.message, second.message
    _assert_clean_and_fast(runner, client, server, workers)


def test_limits_are_the_servers(server):
    with grpc.insecure_channel(server[1]) as channel:
        stub = pb_grpc.SandboxServiceStub(channel)
        asks = (
            ("memory_bytes", 1 << 40, pb.ExecuteRequest(code="1", memory_bytes=1 << 40)),
            ("max_output_bytes", 1 << 30, pb.ExecuteRequest(code="1", max_output_bytes=1 << 30)),
        )
        for field, value, message in asks:
            with pytest.raises(grpc.RpcError) as info:
                stub.Execute(message, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert f"{field} {value} exceeds the server's maximum" in info.value.details()  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as info:
            stub.Execute(pb.ExecuteRequest(code="1", timeout_s=1e6), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "timeout_s 1000000.0 exceeds the maximum" in info.value.details()  # type: ignore[attr-defined]
        smaller = stub.Execute(pb.ExecuteRequest(code="print('z' * 100)", max_output_bytes=10))
        assert smaller.status == pb.STATUS_OUTPUT_TRUNCATED


def test_no_call_outlives_its_worker(runner, client, server, workers):
    """Last in the module: it kills a worker (the server replaces it)."""
    code = "import ctypes, time\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\ntime.sleep(60)"

    async def scenario():
        task = asyncio.create_task(client.execute(ExecutionRequest(code=code, timeout_s=30)))
        await asyncio.sleep(1.0)
        worker = _children(server[0].pid)[0]
        calls = [p for z in _children(worker) for p in _children(z)]
        os.kill(worker, signal.SIGKILL)
        return await task, calls

    lost, calls = runner.run(scenario())
    assert lost.status is S.SANDBOX_ERROR and "exited" in lost.message
    assert calls
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in calls) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in calls)
    workers[:] = _worker_tree(server[0].pid)
    for _ in range(300):  # the replacement pre-imports before it serves
        r = runner.run(client.execute(ExecutionRequest(code="1")))
        if r.status is S.OK:
            break
        time.sleep(0.2)
    _assert_clean_and_fast(runner, client, server, workers)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

"""A call that burns CPU yields to short ones: the worker's renice has to weigh.

The worker renices a call that has used `demote_after_s` of CPU (or half a core that long). A
nice value only weighs a task against others of its scheduling group, and where the kernel
groups sessions (`sched_autogroup_enabled`) a call in a session of its own would be a group of
its own, so the renice would change nothing. Calls therefore share the zygote's session (which
has no controlling terminal) in process groups of their own. Checked as root and as `nobody`.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

AS_NOBODY = Path(__file__).with_name("as_nobody.py")

PROBE = r'''
import asyncio, json, sys
from rstar2_sandbox import ExecutionRequest
from rstar2_sandbox.config import SandboxConfig
from rstar2_sandbox.local import LocalSandbox

REPORT = """
import json, os
def group():
    try:
        return open("/proc/self/autogroup").read().split()[0]
    except OSError:
        return None
def renice_the_group():  # shared with the worker's other calls: must be refused
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
        return True
    except OSError:
        return False
print(json.dumps({"nice": os.getpriority(os.PRIO_PROCESS, 0), "group": group(),
                  "reniced_the_group": renice_the_group(),
                  "session_leader": os.getsid(0) == os.getpid(),
                  "group_leader": os.getpgid(0) == os.getpid()}))
"""
BURN = """
import os, threading, time
stop = threading.Event()
def spin():
    while not stop.is_set():
        pass
spinner = threading.Thread(target=spin)
spinner.start()  # a thread started before the renice spins on, and must be reniced too
t = time.process_time()
while time.process_time() - t < 0.6:
    pass
thread_nice = os.getpriority(os.PRIO_PROCESS, spinner.native_id)
stop.set()
spinner.join()
print(thread_nice)
"""

async def main():
    async with LocalSandbox(SandboxConfig(workers=1)) as sandbox:
        burner, short = await asyncio.gather(
            sandbox.execute(ExecutionRequest(code=BURN + REPORT, timeout_s=10)),
            sandbox.execute(ExecutionRequest(code=REPORT, timeout_s=10)),
        )
    thread_nice, report = burner.stdout.splitlines()
    seen = {"burner": json.loads(report), "short": json.loads(short.stdout)}
    print(json.dumps(seen | {"thread_nice": int(thread_nice)}))

asyncio.run(main())
'''


def _run(user: str) -> dict:
    argv = [sys.executable, "-c", PROBE]
    if user == "nobody":
        if os.geteuid() != 0:
            pytest.skip("needs root to run as nobody")
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("no user nobody")
        argv = [sys.executable, str(AS_NOBODY), *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_cpu_burner_is_reniced_where_the_nice_value_weighs(user):
    if user == "root" and os.geteuid() != 0:
        pytest.skip("the root case needs root")
    seen = _run(user)
    burner, short = seen["burner"], seen["short"]
    assert burner["nice"] == 19 and seen["thread_nice"] == 19  # demoted after 0.1 s of CPU
    assert short["nice"] == 0
    for call in (burner, short):  # its own process group, no session (and autogroup) of its own
        assert call["group_leader"] and not call["session_leader"]
        assert not call["reniced_the_group"]  # a call cannot slow its neighbours down
    if burner["group"] is not None:  # a kernel with autogroups: the two calls share one
        assert burner["group"] == short["group"]

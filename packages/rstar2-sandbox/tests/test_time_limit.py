"""A call's limit is its own time: a busy host never turns a call that fits into a timeout.

The limit counts the call's CPU time and, while it sleeps or blocks, its wall time less what it
waited for a CPU; a call still running at `wall_ceiling_factor` times its limit without having
used it was starved by the host and is a `sandbox_error`. One probe, as root and as `nobody`,
with known shares: the calls pin themselves to CPU 0 (allowed: it aims at the call itself), and
the worker's demotion is off so that the endless loops there keep their full weight.
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
import asyncio, json
from rstar2_sandbox import ExecutionRequest
from rstar2_sandbox.config import SandboxConfig
from rstar2_sandbox.local import LocalSandbox

PIN = "import os\nos.sched_setaffinity(0, {0})\n"
BURN = PIN + """import time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print('done')"""
LOOP = PIN + "while True: pass"
LOWERED = PIN + "os.setpriority(os.PRIO_PROCESS, 0, 19)\nwhile True: pass"

async def beside(sandbox, neighbours, calls):
    """Run `calls` (code, limit) while `neighbours` endless loops share CPU 0 with them."""
    run = lambda code, limit: sandbox.execute(ExecutionRequest(code=code, timeout_s=limit))
    loops = [asyncio.create_task(run(LOOP, 60)) for _ in range(neighbours)]
    await asyncio.sleep(0.3)
    done = await asyncio.gather(*(run(code, limit) for code, limit in calls))
    for task in loops:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    return done

async def main():
    config = SandboxConfig(workers=1, max_in_flight=40, preload=(), warmup_code="",
                           wall_ceiling_factor=16.0, demote_after_s=1000.0,
                           demote_again_after_s=1000.0)
    async with LocalSandbox(config) as sandbox:
        heavy, nap = await beside(sandbox, 5, [
            (BURN, 1.0),  # 0.3 s of CPU with a sixth of a core: about 1.8 s of wall time
            ("import time\ntime.sleep(100)", 0.5),
        ])
        starved, lowered = await beside(sandbox, 30, [
            (LOOP, 0.1),  # a 32nd of a core: about 0.05 s of CPU in its 1.6 s ceiling
            (LOWERED, 0.1),  # the same, having lowered its own priority
        ])
        loop = await sandbox.execute(ExecutionRequest(code="while True: pass", timeout_s=0.5))
    seen = {"heavy": heavy, "nap": nap, "starved": starved, "lowered": lowered, "loop": loop}
    print(json.dumps({name: r.model_dump(mode="json") | {"sandbox_fault": r.sandbox_fault}
                      for name, r in seen.items()}))

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
    elif os.geteuid() != 0:
        pytest.skip("the root case needs root")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_the_limit_is_the_calls_own_time(user):
    seen = _run(user)
    heavy, loop, nap = seen["heavy"], seen["loop"], seen["nap"]
    starved, lowered = seen["starved"], seen["lowered"]
    # Fits its 1 s limit alone, was slowed past it by its neighbours, and is not timed out.
    assert (heavy["status"], heavy["stdout"]) == ("ok", "done\n"), heavy["message"]
    assert heavy["cpu_s"] < 1.0 < heavy["wall_s"] < 16.0
    # An endless loop is stopped by its CPU time.
    assert loop["status"] == "timeout" and "(CPU time)" in loop["message"], loop["message"]
    assert 0.45 <= loop["cpu_s"] < 1.5
    # A sleeping call by its own wall time, at its limit (not at the ceiling).
    assert nap["status"] == "timeout", nap["message"]
    assert "(running, sleeping or blocked)" in nap["message"] and nap["wall_s"] < 2.0
    # A call the host never let run is the sandbox's failure, not the program's...
    assert starved["status"] == "sandbox_error" and starved["sandbox_fault"], starved["message"]
    assert "the host was too busy" in starved["message"]
    assert starved["cpu_s"] < 0.1 and starved["wall_s"] >= 1.6  # stopped at 16 x 0.1 s
    # ...unless it lowered its own priority: then its starving is its own doing.
    assert lowered["status"] == "timeout", lowered["message"]
    assert "(it lowered its own priority)" in lowered["message"]

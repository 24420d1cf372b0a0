"""A `child` sandbox whose server is killed (SIGKILL, by pid) while calls run in it: the child is
started again, the calls in flight are sent again and come back with their own output, and none
comes back as the code's failure. With no restarts left the calls come back `sandbox_error`,
which a trainer does not count against the model."""

from __future__ import annotations

import asyncio
import os
import signal

from rstar2_sandbox import (
    ChildSandbox,
    ChildSandboxConfig,
    ExecutionRequest,
    ExecutionStatus,
    SandboxConfig,
    open_sandbox,
)

LIGHT = SandboxConfig(preload=("math",), warmup_code="", default_timeout_s=10.0)
CALLS = 4


def _slow(i: int) -> ExecutionRequest:
    return ExecutionRequest(code=f"import time\ntime.sleep(1.5)\nprint({i} * 7)")


async def _kill_while_running(sandbox: ChildSandbox) -> list:
    calls = [asyncio.create_task(sandbox.execute(_slow(i))) for i in range(CALLS)]
    await asyncio.sleep(0.8)  # every call is in the server's workers (two at a time)
    pid = sandbox.process.pid
    os.kill(pid, signal.SIGKILL)
    results = await asyncio.gather(*calls)
    return [pid, *results]


def test_a_killed_child_is_restarted_and_its_calls_run_again(runner):
    async def scenario():
        backend = ChildSandboxConfig(workers=2)
        async with open_sandbox(backend, LIGHT, restarts=2, retry_for_s=60) as sandbox:
            assert isinstance(sandbox, ChildSandbox)
            first = sandbox.address
            pid, *results = await _kill_while_running(sandbox)
            after = await sandbox.execute(ExecutionRequest(code="print('again')"))
            return first, pid, results, after, sandbox

    first, pid, results, after, sandbox = runner.run(scenario())
    assert [r.status for r in results] == [ExecutionStatus.OK] * CALLS
    assert [r.stdout for r in results] == [f"{i * 7}\n" for i in range(CALLS)]
    assert sandbox.restarts == 1 and sandbox.retried >= 2  # at least the two that were running
    assert sandbox.address != first and sandbox.process.pid != pid  # a new server, re-pointed
    assert after.stdout == "again\n"


def test_with_no_restart_left_the_calls_are_the_sandboxs_failure(runner):
    async def scenario():
        backend = ChildSandboxConfig(workers=2)
        async with open_sandbox(backend, LIGHT, restarts=0, retry_for_s=60) as sandbox:
            assert isinstance(sandbox, ChildSandbox)
            _, *results = await _kill_while_running(sandbox)
            return results, sandbox.alive

    results, alive = runner.run(scenario())
    assert [r.status for r in results] == [ExecutionStatus.SANDBOX_ERROR] * CALLS
    assert all(not r.failed for r in results)  # never the code's error, timeout or memory
    assert alive is False

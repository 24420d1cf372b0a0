"""Per-worker cgroups (`_cgroup`) on the host's real cgroup v2 hierarchy.

The development machine is hybrid: memory and pids sit on cgroup v1 hierarchies, and its cgroup
v2 (`/sys/fs/cgroup/unified`) offers only hugetlb. So the first test checks what `Info` says
here, and the rest drive the real mechanics (a pool under the server's own cgroup, the move into
a leaf, workers joined before they fork, `cgroup.kill`, removal, a restarted worker) with a
hugetlb limit in place of `memory.max` and `pids.max`: the same files and kernel rules, another
controller. They need root and a writable cgroup v2 offering hugetlb, and skip otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from rstar2_sandbox import ExecutionRequest, ExecutionStatus, LocalSandbox, SandboxConfig
from rstar2_sandbox._cgroup import PREFIX, CgroupUnavailable, WorkerCgroups, own_cgroup

AS_NOBODY = Path(__file__).with_name("as_nobody.py")
LIMIT = {"hugetlb.2MB.max": 2 << 20}


def _hierarchy() -> Path:
    """This process's cgroup v2 directory, with hugetlb offered to its children; else skip."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make cgroups")
    try:
        base = own_cgroup()
    except CgroupUnavailable as exc:
        pytest.skip(str(exc))
    if "hugetlb" not in (base / "cgroup.controllers").read_text().split():
        pytest.skip(f"cgroup v2 {base} offers no hugetlb controller to stand in")
    if not os.access(base / "cgroup.subtree_control", os.W_OK):
        pytest.skip(f"cgroup v2 {base} is not writable")
    return base


def _cgroup_of(pid: int | str) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line[3:] for line in lines if line.startswith("0::"))


def test_info_names_what_the_host_lacks(tmp_path):
    """No cgroup v2 at all, or one whose memory and pids are not offered (this host)."""
    v1_only = tmp_path / "v1"
    v1_only.write_text("30 24 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")
    with pytest.raises(CgroupUnavailable, match=r"^no cgroup v2 hierarchy is mounted"):
        WorkerCgroups.create({"memory.max": 1 << 30}, mountinfo=str(v1_only))
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("hugetlb\n")
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(f"35 24 0:30 / {root} rw,relatime - cgroup2 cgroup2 rw\n")
    membership = tmp_path / "self"
    membership.write_text("4:memory:/x\n0::/\n")
    with pytest.raises(CgroupUnavailable, match=f"cgroup v2 {root} offers no memory or pids"):
        WorkerCgroups.create(
            {"memory.max": 1 << 30, "pids.max": 64}, mountinfo=str(hybrid), cgroup=str(membership)
        )
    membership.write_text("0::/elsewhere/deeper\n")
    mounted_below = tmp_path / "below"
    mounted_below.write_text(f"35 24 0:30 /only/here {root} rw - cgroup2 cgroup2 rw\n")
    with pytest.raises(CgroupUnavailable, match="outside every cgroup2 mount"):
        WorkerCgroups.create({}, mountinfo=str(mounted_below), cgroup=str(membership))


def test_a_pool_under_a_busy_cgroup_moves_its_processes_to_a_leaf():
    """A server in a non-root cgroup (a systemd scope, a container): its processes move into
    `rstar2-rest`, the pool is made beside it, a joined process is limited and killed with it."""
    base = _hierarchy()
    (base / "cgroup.subtree_control").write_text("+hugetlb")
    scope = base / f"rstar2-test-{uuid.uuid4().hex[:8]}"
    scope.mkdir()
    script = textwrap.dedent(
        f"""
        import json, subprocess, sys
        from rstar2_sandbox._cgroup import WorkerCgroups
        sys.stdin.readline()  # until the test has moved us into the scope
        pool = WorkerCgroups.create({LIMIT!r})
        sleeper = subprocess.Popen(["sleep", "60"])
        pool.join(0, sleeper.pid)
        seen = {{
            "server": open("/proc/self/cgroup").read().split("::")[-1].strip(),
            "sleeper": open(f"/proc/{{sleeper.pid}}/cgroup").read().split("::")[-1].strip(),
            "limit": (pool.path(0) / "hugetlb.2MB.max").read_text().strip(),
            "pool": str(pool.pool),
        }}
        pool.kill(0)
        seen["killed_by"] = -sleeper.wait(10)
        pool.close()
        seen["pool_left"] = pool.pool.exists()
        print(json.dumps(seen))
        """
    )
    server = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        (scope / "cgroup.procs").write_text(str(server.pid))
        out, _ = server.communicate("go\n", timeout=60)
        assert server.returncode == 0
        seen = json.loads(out)
        assert seen["server"].endswith(f"{scope.name}/rstar2-rest"), seen
        assert Path(seen["pool"]).parent == scope
        assert seen["sleeper"].endswith(f"{Path(seen['pool']).name}/w0"), seen
        assert seen["limit"] == str(LIMIT["hugetlb.2MB.max"])
        assert seen["killed_by"] == signal.SIGKILL
        assert seen["pool_left"] is False
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for leftover in sorted(scope.rglob("*"), key=lambda p: -len(p.parts)):
            if leftover.is_dir():
                leftover.rmdir()
        scope.rmdir()


def test_an_unprivileged_server_is_told_how_to_get_cgroups():
    base = _hierarchy()
    probe = (
        "from rstar2_sandbox._cgroup import WorkerCgroups, CgroupUnavailable\n"
        f"try: WorkerCgroups.create({LIMIT!r})\n"
        "except CgroupUnavailable as exc: print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, str(AS_NOBODY), sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    if done.returncode != 0 and "nobody" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.stdout.startswith(f"cgroup v2 {base} is not writable by uid "), done
    assert "Delegate=yes" in done.stdout


def test_every_worker_and_call_of_a_pool_runs_in_its_workers_cgroup(runner, monkeypatch):
    """The real pool with a hugetlb limit: workers, zygotes and calls sit in w<i>, a restarted
    worker goes back into it, and closing the pool removes it."""
    base = _hierarchy()
    monkeypatch.setattr(SandboxConfig, "cgroup_limits", lambda self: LIMIT)
    sandbox = LocalSandbox(SandboxConfig(workers=2, max_in_flight=4, warmup_code=""))
    runner.run(sandbox.start())
    try:
        active, unavailable = sandbox.confinements()
        assert "cgroup" in active, unavailable
        pool = sandbox._cgroups.pool  # type: ignore[union-attr]
        assert pool.parent == base and pool.name.startswith(f"{PREFIX}{os.getpid()}-")
        for index, (worker, zygote) in enumerate(sandbox.worker_processes()):
            assert _cgroup_of(worker).endswith(f"{pool.name}/w{index}")
            assert _cgroup_of(zygote).endswith(f"{pool.name}/w{index}")
            assert (pool / f"w{index}" / "hugetlb.2MB.max").read_text().strip() == "2097152"
        code = "print(open('/proc/self/cgroup').read(), open('/proc/self/oom_score_adj').read())"

        async def four_calls():
            return await asyncio.gather(
                *(sandbox.execute(ExecutionRequest(code=code)) for _ in range(4))
            )

        results = runner.run(four_calls())
        for result in results:
            assert result.status == ExecutionStatus.OK, result
            assert f"{pool.name}/w" in result.stdout, result.stdout
            assert result.stdout.split()[-1] == "1000"  # the OOM killer takes a call first
        old, _ = sandbox.worker_processes()[0]
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while sandbox.worker_processes()[0][0] == old and time.monotonic() < deadline:
            runner.run(asyncio.sleep(0.1))
        new, _ = sandbox.worker_processes()[0]
        assert new != old and _cgroup_of(new).endswith(f"{pool.name}/w0")
    finally:
        runner.run(sandbox.close())
    assert not pool.exists()

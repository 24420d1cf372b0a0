"""Per-worker cgroup v2 limits (`memory.max`, `pids.max`) where the host delegates them.

Contract. `WorkerCgroups.create(limits)` runs in the server process before any worker starts. It
finds the server's own cgroup on the v2 hierarchy (`0::PATH` in /proc/self/cgroup, under a cgroup2
mount of /proc/self/mountinfo), checks that the cgroup offers the controllers `limits` needs and
that this process may write it (root, or a delegated cgroup: systemd's `Delegate=yes`, a
container's own cgroup namespace), and otherwise raises `CgroupUnavailable` with one line for
`Info`. A cgroup that hands controllers to its children may hold no process itself (v2's
no-internal-process rule; the root is exempt), so the processes of a non-root cgroup first move
into a leaf, `rstar2-rest`. The pool gets `rstar2-sandbox-<server pid>-<n>/`, one child `w<i>`
per worker with `limits` written. `join(i, pid)` moves a worker into its child while it still
waits for its setup frame, before it has forked anything, so its zygote and every call it runs
are inside and charged there: memory outside RLIMIT_AS too (tmpfs pages of the private /tmp,
SysV shared memory, page cache), and every thread. `kill(i)` ends all that is left in a child
(`cgroup.kill`; SIGKILL of each process before Linux 5.14), `close()` kills and removes the pool.
Pools of servers that no longer run are removed at `create`.

Not covered: cgroup v1 (a host whose memory and pids controllers sit on v1 hierarchies, like the
2-core development machine, is told so in `Info`; RLIMIT_AS, the call's tmpfs size and the
seccomp ban on fork bound calls there), and CPU: calls are bounded by RLIMIT_CPU and the wall
clock, and long ones are reniced.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

LEAF = "rstar2-rest"
PREFIX = "rstar2-sandbox-"
_POOLS = itertools.count()
WITHOUT = "memory is bounded by RLIMIT_AS, processes by seccomp (no fork)"
_SETUP_HINT = (
    "start the server in a cgroup of its own with delegation, e.g. "
    "`systemd-run --user --scope -p Delegate=yes rstar2-sandbox serve ...`"
)


class CgroupUnavailable(RuntimeError):
    """Why there are no per-worker cgroup limits on this host: one line for `Info`."""


def _unescape(field: str) -> str:
    """A mountinfo path field: spaces and the like are octal escapes (`\\040`)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def own_cgroup(mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> Path:
    """The directory of this process's cgroup on a mounted cgroup v2 hierarchy."""
    mounts = []  # (path of the mount's root inside the hierarchy, mount point)
    with contextlib.suppress(OSError), open(mountinfo) as lines:
        for line in lines:
            before, _, after = line.partition(" - ")
            if after.startswith("cgroup2 "):
                fields = before.split()
                mounts.append((_unescape(fields[3]), _unescape(fields[4])))
    if not mounts:
        raise CgroupUnavailable("no cgroup v2 hierarchy is mounted (cgroup v1 only)")
    path = None
    with contextlib.suppress(OSError), open(cgroup) as lines:
        path = next((line.rstrip("\n")[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        raise CgroupUnavailable(
            "this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)"
        )
    for root, point in mounts:
        inside = os.path.relpath(path, root)
        if not inside.startswith(".."):
            return Path(point, inside).resolve()
    raise CgroupUnavailable(f"this process's cgroup v2 {path} is outside every cgroup2 mount")


def _v1_controllers() -> set[str]:
    """Controllers bound to a cgroup v1 hierarchy (/proc/cgroups: name, hierarchy id, ...)."""
    with contextlib.suppress(OSError, IndexError), open("/proc/cgroups") as table:
        rows = (line.split() for line in table if not line.startswith("#"))
        return {row[0] for row in rows if row[1] != "0"}
    return set()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as out:
        out.write(value)


def _procs(cgroup: Path) -> list[int]:
    return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _kill(cgroup: Path) -> None:
    """SIGKILL every process in `cgroup` (`cgroup.kill`; one by one before Linux 5.14)."""
    if not cgroup.is_dir():
        return
    try:
        _write(cgroup / "cgroup.kill", "1")
    except OSError:
        with contextlib.suppress(OSError):
            for pid in _procs(cgroup):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class WorkerCgroups:
    """The cgroups of one pool's workers, under the server's own (delegated) cgroup."""

    def __init__(self, base: Path, pool: Path, limits: dict[str, str]) -> None:
        self.base = base
        self.pool = pool
        self.limits = limits
        self.joined: set[int] = set()

    @classmethod
    def create(
        cls,
        limits: dict[str, int | None],
        *,
        mountinfo: str = "/proc/self/mountinfo",
        cgroup: str = "/proc/self/cgroup",
    ) -> WorkerCgroups:
        """Set up the pool's cgroup, or raise `CgroupUnavailable` saying what the host lacks.

        `limits` maps an interface file to its value (None: `max`), e.g. `{"memory.max": 2 << 30,
        "pids.max": 512}`; the controllers needed are the files' prefixes."""
        base = own_cgroup(mountinfo, cgroup)
        needed = sorted({key.split(".", 1)[0] for key in limits})
        try:
            offered = set((base / "cgroup.controllers").read_text().split())
        except OSError as exc:
            raise CgroupUnavailable(f"cannot read {base}/cgroup.controllers: {exc}") from None
        missing = [name for name in needed if name not in offered]
        if missing:
            v1 = " (bound to cgroup v1 hierarchies)" if set(missing) <= _v1_controllers() else ""
            raise CgroupUnavailable(
                f"cgroup v2 {base} offers no {' or '.join(missing)} controller{v1}"
            )
        writable = all(
            os.access(path, os.W_OK)
            for path in (base, base / "cgroup.procs", base / "cgroup.subtree_control")
        )
        if not writable:
            raise CgroupUnavailable(
                f"cgroup v2 {base} is not writable by uid {os.geteuid()}; {_SETUP_HINT}"
            )
        written = {key: "max" if value is None else str(value) for key, value in limits.items()}
        pool = base / f"{PREFIX}{os.getpid()}-{next(_POOLS)}"
        try:
            _remove_stale_pools(base)
            if (base / "cgroup.type").exists():  # not the root: empty it into a leaf first
                leaf = base / LEAF
                leaf.mkdir(exist_ok=True)
                for pid in _procs(base):
                    with contextlib.suppress(ProcessLookupError):
                        _write(leaf / "cgroup.procs", str(pid))
            enable = " ".join(f"+{name}" for name in needed)
            _write(base / "cgroup.subtree_control", enable)
            pool.mkdir()
            _write(pool / "cgroup.subtree_control", enable)
        except OSError as exc:
            with contextlib.suppress(OSError):
                pool.rmdir()
            raise CgroupUnavailable(f"cannot set up worker cgroups under {base}: {exc}") from None
        return cls(base, pool, written)

    def path(self, index: int) -> Path:
        return self.pool / f"w{index}"

    def join(self, index: int, pid: int) -> None:
        """Move process `pid` (a worker that has not forked yet) into worker `index`'s cgroup,
        made with the limits on first use. OSError when the kernel refuses."""
        cgroup = self.path(index)
        cgroup.mkdir(exist_ok=True)
        for key, value in self.limits.items():
            _write(cgroup / key, value)
        _write(cgroup / "cgroup.procs", str(pid))
        self.joined.add(index)

    def kill(self, index: int) -> None:
        """SIGKILL everything left in worker `index`'s cgroup (a dead worker's stragglers)."""
        _kill(self.path(index))

    def close(self, wait_s: float = 5.0) -> None:
        """Kill what is left in every worker's cgroup and remove the pool (best effort)."""
        for index in sorted(self.joined):
            self.kill(index)
        _remove_pool(self.pool, wait_s)


def _remove_pool(pool: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    children = [p for p in pool.iterdir() if p.is_dir()] if pool.is_dir() else []
    for cgroup in [*children, pool]:
        while True:
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the killed processes are still being reaped
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)


def _remove_stale_pools(base: Path) -> None:
    """Remove the pools of servers that are gone (a SIGKILLed server leaves its own behind)."""
    for pool in base.glob(f"{PREFIX}*"):
        owner = pool.name.removeprefix(PREFIX).split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            with contextlib.suppress(OSError):  # gone meanwhile
                for cgroup in (p for p in pool.iterdir() if p.is_dir()):
                    _kill(cgroup)
            _remove_pool(pool, wait_s=1.0)

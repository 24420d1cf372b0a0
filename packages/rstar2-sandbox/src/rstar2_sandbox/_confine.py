"""Confinement of the worker, its zygote and every call, the same with or without root.

Contract. Three stages, each recorded in `Confinements` (what is active, and for what is not, why;
nothing is skipped silently):

- `enter_worker_namespaces` (the worker, once): a user namespace when not root (mapping only the
  server's own uid), then new network (no interface but a downed loopback), IPC (no SysV object or
  message queue of the host or of another worker), UTS and pid namespaces. The worker stays in
  the host's pid namespace; its first child, the zygote, is pid 1 of the new one, so when the
  zygote dies the kernel kills every call, and a call can see or signal nothing outside it.
- `build_root` (the zygote, once): a private mount namespace whose root is a read-only tmpfs
  holding only what the interpreter needs: /usr and the /lib directories, a few /etc files, the
  interpreter's prefix, the virtualenv and the import directories (all bound read-only, nosuid,
  nodev), a minimal /dev (null, zero, full, random, urandom), a fresh /proc of the zygote's pid
  namespace and an empty /tmp; then pivot_root and the host's tree is detached.
- `confine_call` (each forked call): own session and process group, parent-death signal, first in
  line for the OOM killer (so a full worker cgroup loses a call, not its zygote or worker), a
  private mount namespace with its own tmpfs on /tmp as working directory (gone with the call),
  rlimits, a uid of its own when the server is root, every capability dropped (bounding set
  included), not dumpable (no /proc/<pid>/mem, environ, fd for anyone else), and last the seccomp
  filter of `_seccomp`.

Not covered: cgroups (the server puts each worker in a cgroup of its own where the host delegates
cgroup v2, `_cgroup`; elsewhere memory is bounded by RLIMIT_AS and the call's tmpfs size, CPU by
rlimits and the wall clock).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import resource
import signal
import socket
import sys
from dataclasses import dataclass, field

from rstar2_sandbox import _child, _seccomp

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_KEPT_FLAGS = 0x1 | 0x2 | 0x4 | 0x8 | 0x400 | 0x800 | 0x1000  # statvfs bits a remount must keep

# What a server insists on unless started with --allow-weak-isolation.
REQUIRED = (
    "netns",
    "pidns",
    "ipcns",
    "utsns",
    "mountns",
    "rootfs",
    "proc",
    "dev",
    "private_tmp",
    "no_caps",
    "seccomp",
    "rlimits",
    "new_session",
)
_DEVICES = ("null", "zero", "full", "random", "urandom")
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "localtime", "nsswitch.conf", "host.conf")
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")


@dataclass
class Confinements:
    """Which confinements are active, and why the others are not."""

    active: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)

    def missing(self) -> list[str]:
        """Required confinements that are not active."""
        return [name for name in REQUIRED if name not in self.active]


_LIBC = ctypes.CDLL(None, use_errno=True)


def _cap_last() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


_CAP_LAST = _cap_last()  # read while the host's /proc is still there


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_LIBC.unshare(flags), "unshare")


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str = "") -> None:
    _check(
        _LIBC.mount(
            source.encode() if source else None,
            target.encode(),
            kind.encode() if kind else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source or kind} on {target}",
    )


# --- the worker ---------------------------------------------------------------------------------
def enter_worker_namespaces(conf: Confinements) -> None:
    """User (when not root), network, IPC, UTS and pid namespaces for the worker's children."""
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        try:
            _unshare(_CLONE_NEWUSER)
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
            conf.active.append("userns")
        except OSError as exc:
            reason = f"no user namespace for a non-root server: {exc}"
            for name in ("userns", "netns", "ipcns", "utsns", "pidns"):
                conf.unavailable[name] = reason
            return
    for name, flag in (
        ("netns", _CLONE_NEWNET),
        ("ipcns", _CLONE_NEWIPC),
        ("utsns", _CLONE_NEWUTS),
        ("pidns", _CLONE_NEWPID),
    ):
        try:
            _unshare(flag)
            conf.active.append(name)
        except OSError as exc:
            conf.unavailable[name] = str(exc)
    if "utsns" in conf.active:
        socket.sethostname("sandbox")


# --- the zygote: a read-only root of its own ------------------------------------------------------
def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def python_trees() -> list[str]:
    """The interpreter's prefixes and import directories, outermost first, nested ones dropped."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    candidates |= {e for e in sys.path if e}
    trees: list[str] = []
    for tree in sorted({os.path.realpath(c) for c in candidates if os.path.isdir(c)}):
        if tree == "/" or any(_under(tree, d) for d in _SYSTEM_DIRS):
            continue  # under /usr or /lib: bound anyway
        if not any(_under(tree, kept) for kept in trees):
            trees.append(tree)
    return trees


def _bind_readonly(fd: int, target: str, source_path: str) -> None:
    """Bind the directory or file held by `fd` on `target`, then make it read-only.

    A remount inside a user namespace must keep the flags the source mount has locked (nosuid,
    noexec...), so they are read from the source and kept.
    """
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
    kept = os.statvfs(source_path).f_flag & _KEPT_FLAGS
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept
    _mount(None, target, None, flags)


def _pivot_root(root: str) -> None:
    number = _seccomp._TABLES[platform.machine()][1]["pivot_root"]
    os.chdir(root)
    _check(_LIBC.syscall(number, b".", b"."), "pivot_root")
    _check(_LIBC.umount2(b".", _MNT_DETACH), "detach the host's root")
    os.chdir("/")


UNDER_TMP: list[str] = []  # Python trees under /tmp (a virtualenv there), set by build_root


def build_root(conf: Confinements) -> None:
    """Replace the zygote's view of the host by a read-only tree of what Python needs."""
    try:
        _unshare(_CLONE_NEWNS)
        _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    except OSError as exc:
        for name in ("mountns", "rootfs", "proc", "dev", "private_tmp"):
            conf.unavailable[name] = f"no private mount namespace: {exc}"
        return
    conf.active.append("mountns")
    trees = python_trees()
    # A call mounts its own /tmp, which would hide these; it binds them back (confine_call).
    UNDER_TMP[:] = [t for t in trees if t.startswith("/tmp/")]
    try:
        # Hold every source before the new root covers /tmp (a virtualenv may live there).
        sources: list[tuple[str, int, bool]] = []  # path, O_PATH fd, is a directory
        links: list[tuple[str, str]] = []
        for path in _SYSTEM_DIRS:
            if os.path.islink(path):
                links.append((path, os.readlink(path)))
            elif os.path.isdir(path):
                sources.append((path, os.open(path, os.O_PATH), True))
        for name in _ETC_FILES:
            path = f"/etc/{name}"
            if os.path.islink(path):
                links.append((path, os.readlink(path)))
            elif os.path.isfile(path):
                sources.append((path, os.open(path, os.O_PATH), False))
        for tree in trees:
            sources.append((tree, os.open(tree, os.O_PATH), True))
        devices = [(f"/dev/{d}", os.open(f"/dev/{d}", os.O_PATH)) for d in _DEVICES]
        root = "/tmp"
        _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=16m,mode=0755")
        for path, fd, is_dir in sources:
            target = root + path
            if is_dir:
                os.makedirs(target, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                open(target, "w").close()
            _bind_readonly(fd, target, f"/proc/self/fd/{fd}")
            os.close(fd)
        for path, destination in links:
            os.makedirs(os.path.dirname(root + path), mode=0o755, exist_ok=True)
            os.symlink(destination, root + path)
        os.makedirs(root + "/tmp", mode=0o755, exist_ok=True)  # holds the trees under /tmp
        conf.active.append("rootfs")
    except OSError as exc:
        conf.unavailable["rootfs"] = str(exc)
        return
    try:
        os.makedirs(root + "/dev", mode=0o755)
        _mount("tmpfs", root + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
        for path, fd in devices:
            open(root + path, "w").close()
            _mount(f"/proc/self/fd/{fd}", root + path, None, _MS_BIND)
            os.close(fd)
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"{root}/dev/{name}")
        _mount(None, root + "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
        conf.active.append("dev")
    except OSError as exc:
        conf.unavailable["dev"] = str(exc)
    try:
        os.makedirs(root + "/proc", mode=0o555)
        _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        conf.active.append("proc")
    except OSError as exc:
        conf.unavailable["proc"] = f"cannot mount a fresh /proc: {exc}"
    try:
        _mount(None, root, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        _pivot_root(root)
    except OSError as exc:  # the tree is built but not entered: nothing of it counts
        for name in ("rootfs", "dev", "proc"):
            if name in conf.active:
                conf.active.remove(name)
            conf.unavailable[name] = f"pivot_root failed: {exc}"


# --- each call ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallLimits:
    """The limits one forked call runs under."""

    cpu_s: float | None  # RLIMIT_CPU; None: none (the wall clock still holds)
    memory_bytes: int
    file_size_bytes: int
    open_files: int
    processes: int
    tmp_bytes: int


def _address_space(statm: int | None = None) -> int:
    """This process's address space in bytes (from an open /proc/self/statm if given)."""
    if statm is not None:
        return int(os.pread(statm, 64, 0).split()[0]) * resource.getpagesize()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _drop_bounding_set() -> None:
    """Empty the bounding and ambient sets (needs CAP_SETPCAP: before any uid change)."""
    for cap in range(_CAP_LAST + 1):
        _check(_LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


# Built once: a call only passes them (fewer objects made, fewer inherited pages copied).
_CAP_HEADER = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
_CAP_EMPTY = (_CapData * 2)()


def _drop_capabilities() -> None:
    """Empty the effective, permitted and inheritable sets."""
    _check(_LIBC.capset(ctypes.byref(_CAP_HEADER), ctypes.byref(_CAP_EMPTY)), "capset")


def confine_call(
    uid: int | None,
    limits: CallLimits,
    seccomp: bool,
    private_tmp: bool,
    address_space: int | None = None,
    stamps: list[tuple[str, int, int, int]] | None = None,
) -> None:
    """Confine a freshly forked call; the order matters (mounts and uid before seccomp).

    `address_space`: the parent's size at the fork (the zygote reads it, which spares every
    call opening /proc); RLIMIT_AS is that plus `limits.memory_bytes`. `stamps` (bench only)
    gets a stamp (`_child.stamper`) at the end of each stage.
    """
    stamp = _child.stamper(stamps)
    # A process group of its own in the zygote's session, which has no controlling terminal (the
    # zygote called setsid): killable as a group, no terminal to reach, and in the zygote's
    # scheduling autogroup, so the worker's renice of a long call weighs against other calls
    # (a session per call would be an autogroup per call, where a task's nice does nothing).
    os.setpgid(0, 0)
    parent = os.getppid()
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(70)
    with contextlib.suppress(OSError):  # out of memory in a worker's cgroup: a call goes first
        adj = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:  # os.open, not open(): no text stack built, fewer copy-on-write faults
            os.write(adj, b"1000")
        finally:
            os.close(adj)
    stamp("session")
    if private_tmp:
        _unshare(_CLONE_NEWNS)
        held = [(tree, os.open(tree, os.O_PATH | os.O_DIRECTORY)) for tree in UNDER_TMP]
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        options = f"size={limits.tmp_bytes},nr_inodes=4096,mode=0700{owner}"
        _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, options)
        for tree, fd in held:  # the interpreter's trees under /tmp, read-only again
            os.makedirs(tree, mode=0o755, exist_ok=True)
            _bind_readonly(fd, tree, f"/proc/self/fd/{fd}")
            os.close(fd)
        os.chdir("/tmp")
    stamp("private_tmp")
    if limits.cpu_s is not None:
        cpu = max(1, int(limits.cpu_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    space = (address_space or _address_space()) + limits.memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (space, space))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    stamp("rlimits")
    _drop_bounding_set()
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # setuid cleared it
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    _drop_capabilities()
    _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    stamp("caps_uid")
    if seccomp:
        _seccomp.install_filter()
    stamp("seccomp")

"""The zygote: pid 1 of the worker's pid namespace, the clean process every call is forked from.

Contract. The worker forks the zygote (`start`) right after entering its namespaces. The zygote
builds its read-only root (`_confine.build_root`), pre-imports the maths stack, runs the warm-up,
freezes the GC, tries the per-call confinement once in a throwaway child, and says `ready` on its
socket (a SOCK_SEQPACKET pair with the worker). Then it only forks: each `fork` message carries the
call's descriptors (SCM_RIGHTS: memfds holding the code and stdin, the output and result pipes, or
a session's pipes) and its limits, never the code itself, so the zygote holds no request data and a
call cannot find another call's code, stdin or output in its inherited memory. It forks one call at
a time, so under load a call may wait here; it answers `started` with a pidfd of the child (the
worker kills and renices through it) and the moment of the fork (CLOCK_MONOTONIC, where the
worker starts the call's clock), reaps every child and reports
`exited` with the wait status and the CPU time. When the worker goes away (its end of the socket
closes, or PR_SET_PDEATHSIG fires) the zygote exits, and as pid 1 of the namespace takes every call
with it: no call can outlive its worker, whatever it does to its own signals.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from rstar2_sandbox import _child, _confine, _seccomp

MAX_FDS = 8
_UID_SLOTS = 1000
_MADV_COLLAPSE = 25  # Linux 6.1
_HUGE = 1 << 21
_RECOLLAPSE_EVERY = 256  # forks; the zygote's own writes split huge pages its calls still share
_LIBC = ctypes.CDLL(None, use_errno=True)
_clock = time.perf_counter_ns  # CLOCK_MONOTONIC: one clock for the worker, zygote and calls
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_PYLIBC = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across fork, as os.fork


def _raw_fork() -> int:
    """fork(2) without the interpreter's after-fork work; only for a single-threaded zygote.

    `os.fork` re-initialises the runtime's locks and threads and runs the `register_at_fork`
    hooks (threading's, random's) in the child: about 200 copy-on-write faults of the warm
    image, 1.5 ms of a call's CPU on this machine. With one thread and no lock held there is
    nothing to re-initialise; the one hook whose effect a call can see, random's reseed, the
    child does itself (`_reseed`).
    """
    pid = _PYLIBC.fork()
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fork: {os.strerror(err)}")
    return pid


def _reseed() -> None:
    """What random's at-fork hook does: a fresh seed, so two calls never share a sequence."""
    module = sys.modules.get("random")
    if module is not None:
        module.seed()


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1 and threading.active_count() == 1
    except OSError:
        return False


# The per-call messages are fixed structs, not JSON: the zygote's pages are shared with every
# call it just forked, so each page it writes costs it a copy-on-write fault, and a JSON round
# trip touches about 85 of them (bench/sandbox_profile.py; struct: about 10).
_FORK = struct.Struct("!qBidq")  # tag, kind (0 once, 1 session), slot, cpu_s (NaN: none), memory
_STARTED = struct.Struct("!qiq")  # tag, pid, fork time (CLOCK_MONOTONIC ns)
_EXITED = struct.Struct("!qid")  # tag, wait status, cpu_s; a profile's stamps follow as JSON
_KINDS = ("once", "session")


def _sendmsg(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    ancillary = []
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
    sock.sendmsg([data], ancillary)


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """A message of any shape (ready, failed), as JSON."""
    _sendmsg(sock, b"J" + json.dumps(message).encode(), fds)


def send_fork(
    sock: socket.socket, tag: int, kind: str, slot: int, cpu_s: float | None, memory: int, fds
) -> None:
    cpu = math.nan if cpu_s is None else cpu_s
    _sendmsg(sock, b"F" + _FORK.pack(tag, _KINDS.index(kind), slot, cpu, memory), fds)


def _decode(data: bytes) -> dict[str, Any]:
    op, body = data[:1], data[1:]
    if op == b"F":
        tag, kind, slot, cpu_s, memory = _FORK.unpack(body)
        cpu = None if math.isnan(cpu_s) else cpu_s
        return {"op": "fork", "tag": tag, "kind": _KINDS[kind], "slot": slot, "cpu_s": cpu,
                "memory_bytes": memory}  # fmt: skip
    if op == b"S":
        tag, pid, forked = _STARTED.unpack(body)
        return {"op": "started", "tag": tag, "pid": pid, "forked_s": forked / 1e9}
    if op == b"X":
        tag, status, cpu_s = _EXITED.unpack_from(body)
        message = {"op": "exited", "tag": tag, "status": status, "cpu_s": cpu_s}
        if len(body) > _EXITED.size:
            message["profile"] = json.loads(body[_EXITED.size :])
        return message
    if op == b"J":
        return json.loads(body)
    raise ValueError(f"unknown message kind {op!r}")


def receive(sock: socket.socket, size: int = 1 << 16) -> tuple[dict[str, Any], list[int]] | None:
    """One message and the descriptors it carried; None when the peer closed."""
    data, ancillary, _flags, _ = sock.recvmsg(size, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            carried = array.array("i")
            carried.frombytes(payload[: len(payload) - len(payload) % carried.itemsize])
            fds += list(carried)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return _decode(data), fds


class Zygote:
    def __init__(self, sock: socket.socket, config: dict[str, Any], index: int, seccomp: bool):
        self.sock = sock
        self.config = config
        self.index = index
        self.seccomp = seccomp
        self.private_tmp = True
        self.children: dict[int, tuple[int, int]] = {}  # pid -> (tag, pidfd)
        self.poll = select.epoll()  # raw epoll: fewer objects touched per call than selectors
        self.pids: dict[int, int] = {}  # pidfd -> pid
        self.forks = 0
        self.raw_fork = False  # set once the warm-up is over and one thread is left (`main`)
        self.stamps: list[tuple[str, int, int, int]] | None = [] if config.get("profile") else None
        self.profiles: dict[int, list[tuple[str, int, int, int]]] = {}  # tag -> the zygote's stamps
        try:  # read at each fork: a call's RLIMIT_AS is this size plus its memory limit
            self.statm: int | None = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no /proc (weak isolation): each call reads its own
            self.statm = None

    def uid(self, slot: int) -> int | None:
        if os.geteuid() != 0:
            return None
        return self.config["uid_base"] + self.index * _UID_SLOTS + slot

    def limits(self, cpu_s: float | None, memory_bytes: int) -> _confine.CallLimits:
        c = self.config
        return _confine.CallLimits(
            cpu_s,
            memory_bytes,
            c["file_size_bytes"],
            c["open_files"],
            c["processes"],
            c["tmpfs_bytes"],
        )

    def fork(self, message: dict[str, Any], fds: list[int]) -> int:
        """Fork a confined call whose descriptors 0.. are `fds` (sessions: 3.. with 0-2 null)."""
        uid = self.uid(message["slot"])
        limits = self.limits(message["cpu_s"], message["memory_bytes"])
        kind = message["kind"]
        space = _confine._address_space(self.statm) if self.statm is not None else None
        self.forks += 1
        if self.forks % _RECOLLAPSE_EVERY == 0:
            collapse_warm_image()
        stamps = self.stamps
        if stamps is not None:
            stamps.append(("zygote_fork", _clock(), time.process_time_ns(), 0))
        pid = _raw_fork() if self.raw_fork else os.fork()
        if pid == 0:  # the call: never returns
            try:
                stamp = _child.stamper(stamps)
                if stamps is not None:
                    stamps.clear()
                stamp("forked")
                if self.raw_fork:
                    _reseed()
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds]
                if kind == "session":
                    null = os.open("/dev/null", os.O_RDWR)
                    targets = [null, null, null, *high]
                else:
                    targets = high
                for target, source in enumerate(targets):
                    os.dup2(source, target)
                os.closerange(len(targets), 1 << 16)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                stamp("descriptors")
                _confine.confine_call(uid, limits, self.seccomp, self.private_tmp, space, stamps)
                if kind == "session":
                    _child.serve_session(3, 4)
                else:
                    _child.run_once(code_fd=4, result_fd=3, stamps=stamps)
            except BaseException as exc:
                with contextlib.suppress(BaseException):
                    os.write(2, f"sandbox: call set-up failed: {exc!r}\n".encode())
                os._exit(70)
            os._exit(0)
        if stamps is not None:
            stamps.append(("zygote_forked", _clock(), time.process_time_ns(), 0))
        return pid

    def handle(self, message: dict[str, Any], fds: list[int]) -> None:
        if self.stamps is not None:
            self.stamps[:] = [("zygote_received", _clock(), time.process_time_ns(), 0)]
        try:
            if message.get("op") != "fork":
                raise ValueError(f"unknown operation {message.get('op')!r}")
            forked = _clock()
            pid = self.fork(message, fds)
        except (OSError, ValueError, KeyError) as exc:
            send(self.sock, {"op": "failed", "tag": message.get("tag"), "error": repr(exc)})
            return
        finally:
            for fd in fds:
                os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = (message["tag"], pidfd)
        self.pids[pidfd] = pid
        self.poll.register(pidfd, select.EPOLLIN)
        _sendmsg(self.sock, b"S" + _STARTED.pack(message["tag"], pid, forked), [pidfd])
        if self.stamps is not None:
            self.stamps.append(("zygote_started_sent", _clock(), time.process_time_ns(), 0))
            self.profiles[message["tag"]] = self.stamps[:]

    def reap(self, pid: int) -> None:
        seen = _clock() if self.stamps is not None else 0
        tag, pidfd = self.children.pop(pid)
        self.poll.unregister(pidfd)
        del self.pids[pidfd]
        os.close(pidfd)
        _, status, usage = os.wait4(pid, 0)
        data = b"X" + _EXITED.pack(tag, status, usage.ru_utime + usage.ru_stime)
        if self.stamps is not None:
            stamps = self.profiles.pop(tag, [])
            stamps += [
                ("zygote_exit_seen", seen, 0, 0),
                ("zygote_reaped", _clock(), 0, usage.ru_minflt),
            ]
            data += json.dumps(stamps).encode()
        _sendmsg(self.sock, data)

    def reap_orphans(self) -> None:
        """As pid 1, reap what calls left behind (only possible without seccomp)."""
        while True:
            try:
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if found is None or found.si_pid in self.children:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(found.si_pid, 0)

    def serve(self) -> None:
        own = self.sock.fileno()
        self.poll.register(own, select.EPOLLIN)
        while True:
            for fd, _ in self.poll.poll(1.0):
                if fd == own:
                    received = receive(self.sock)
                    if received is None:
                        return
                    self.handle(*received)
                elif fd in self.pids:
                    self.reap(self.pids[fd])
            self.reap_orphans()


def _trial(zygote: Zygote) -> str | None:
    """Confine a throwaway child exactly as a call; None if it worked, else why not."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _confine.confine_call(
                zygote.uid(0), zygote.limits(1.0, 1 << 30), zygote.seccomp, zygote.private_tmp
            )
            os._exit(0)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(write, repr(exc).encode()[:1000])
            os._exit(1)
    os.close(write)
    why = os.read(read, 1000).decode(errors="replace")
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return why or f"the trial call exited with status {status}"


def collapse_warm_image() -> int:
    """Back the warm image's anonymous memory with 2 MiB pages; returns the MiB collapsed.

    Each fork copies the page tables of the anonymous memory and each call's exit tears its copy
    down: with 4 KiB pages that is one entry per page of the ~80 MiB image, with huge pages one
    per 2 MiB. A call that writes to a huge page gets a 4 KiB copy of what it wrote, as with small pages.
    Best effort: nothing is collapsed where the kernel has no MADV_COLLAPSE or THP is off.
    """
    collapsed = 0
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # only private anonymous memory: the heap, arenas, numpy's buffers
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start, end = (start + _HUGE - 1) & ~(_HUGE - 1), end & ~(_HUGE - 1)
        for chunk in range(start, end, _HUGE):
            if _LIBC.madvise(chunk, _HUGE, _MADV_COLLAPSE) == 0:
                collapsed += 2
    return collapsed


def warm_up(preload: Sequence[str], warmup_code: str) -> tuple[list[str], dict[str, str]]:
    """The warm image: import `preload`, then run `warmup_code` if every import worked; the
    modules loaded and what failed (module or `<warmup>` -> repr of the error)."""
    loaded, failed = [], {}
    for module in preload:
        try:
            importlib.import_module(module)
            loaded.append(module)
        except Exception as exc:  # a missing optional module is reported, not fatal
            failed[module] = repr(exc)
    if warmup_code and not failed:
        try:
            exec(compile(warmup_code, "<warmup>", "exec"), {})
        except Exception as exc:
            failed["<warmup>"] = repr(exc)
    return loaded, failed


def main(sock: socket.socket, config: dict[str, Any], index: int, conf: _confine.Confinements):
    """The zygote's life: confine, warm up, probe, announce, fork until the worker goes."""
    os.umask(0o022)
    _confine.build_root(conf)
    loaded, failed = warm_up(config["preload"], config["warmup_code"])
    reason = _seccomp.supported() if config["seccomp"] else "disabled by configuration"
    zygote = Zygote(sock, config, index, seccomp=reason is None)
    if reason is None:
        _seccomp.prepare()
    why = _trial(zygote)
    if why is not None and zygote.seccomp:  # the filter, or something else?
        zygote.seccomp = False
        if _trial(zygote) is None:
            reason, why = f"the kernel refused the filter: {why}", None
        else:
            zygote.seccomp = True
    if why is not None:  # the private /tmp, or something else?
        zygote.private_tmp = False
        if _trial(zygote) is None:
            conf.unavailable["private_tmp"] = f"a call cannot mount its own /tmp: {why}"
            why = None
        else:
            zygote.private_tmp = True
    if why is not None:
        for name in ("rlimits", "new_session", "no_caps", "private_tmp"):
            conf.unavailable[name] = f"a confined call could not be set up: {why}"
    else:
        conf.active += ["rlimits", "new_session", "no_caps"]
        if zygote.private_tmp:
            conf.active.append("private_tmp")
        if os.geteuid() == 0:
            conf.active.append("uid")
    if zygote.seccomp:
        conf.active.append("seccomp")
    else:
        conf.unavailable["seccomp"] = reason or "not available"
    zygote.raw_fork = _single_threaded()
    gc.collect()
    gc.freeze()  # forked calls then leave the inherited objects' pages unwritten by the collector
    huge = collapse_warm_image()
    send(
        sock,
        {
            "op": "ready",
            "active": conf.active,
            "unavailable": conf.unavailable,
            "preloaded": loaded,
            "preload_failed": failed,
            "huge_pages_mib": huge,
        },
    )
    zygote.serve()


def start(
    config: dict[str, Any], index: int, conf: _confine.Confinements
) -> tuple[socket.socket, int]:
    """Fork the zygote (pid 1 of the worker's new pid namespace): the worker's end of the socket
    and the zygote's pid. The zygote dies with the worker (PR_SET_PDEATHSIG) and is not dumpable,
    so a call of the same uid can neither read nor write its memory."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _LIBC.prctl(_confine._PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _LIBC.prctl(_confine._PR_SET_DUMPABLE, 0, 0, 0, 0)
            os.setsid()  # no controlling terminal for the zygote or any call it forks
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            main(theirs, config, index, conf)
        except BaseException:
            traceback.print_exc()
            os._exit(70)
        os._exit(0)
    theirs.close()
    return ours, pid

"""A call's process through its pidfd: the worker holds no pid of a call until it needs one.

`outer_pid(pidfd)` is the call's pid in the worker's pid namespace (0 once it is gone),
`has_exited(pidfd)` polls without reaping (the zygote reaps), `signal_pidfd(pidfd, signum)` sends
a signal that cannot reach a recycled pid; a negative pidfd (not forked yet) is a no-op.
`cpu_seconds(pid)` and `renice(pid, nice)` read a running call's CPU time and set the nice value
of all its threads, by the pid `outer_pid` gave; `usage(pid)` reads what the worker's time limit
is judged on: the CPU time of every thread, the thread count, the longest time any live thread
has spent runnable but waiting for a CPU (`/proc/PID/task/TID/schedstat`, whose second field is
that wait in ns; kernels without it give 0, so the limit falls back to wall time), whether a
thread is runnable now, and the lowest priority a thread has (nice value, scheduling policy).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from dataclasses import dataclass

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def outer_pid(pidfd: int) -> int:
    with open(f"/proc/self/fdinfo/{pidfd}") as info:
        for line in info:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    return 0


def has_exited(pidfd: int) -> bool:
    return pidfd >= 0 and bool(select.select([pidfd], [], [], 0)[0])


def signal_pidfd(pidfd: int, signum: int) -> None:
    if pidfd >= 0:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signum)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of the process so far; None when it cannot be read (it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Usage:
    """A running call's account, read from /proc (see the module docstring)."""

    cpu_s: float  # user + system of every thread, live or exited (clock-tick precision)
    threads: int
    wait_s: float  # the longest a live thread has waited, runnable, for a CPU
    runnable: bool  # a thread is running or waiting for a CPU (its current wait is not in wait_s)
    nice: int = 0  # the highest nice value of its threads
    policy: int = 0  # the highest scheduling policy of its threads (3 batch, 5 idle; 0 normal)


def usage(pid: int) -> Usage | None:
    """The call's `Usage`; None when it cannot be read (it is gone).

    The kernel adds a wait to schedstat when the thread gets the CPU, so a thread waiting now
    has its current wait missing: `wait_s` is complete only when `runnable` is False.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        tids = os.listdir(f"/proc/{pid}/task")
    except (OSError, IndexError, ValueError):
        return None
    wait_ns, runnable, nice, policy = 0, False, -20, 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            runnable |= fields[0] == b"R"
            nice, policy = max(nice, int(fields[16])), max(policy, int(fields[38]))
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as schedstat:
                wait_ns = max(wait_ns, int(schedstat.read().split()[1]))
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended, or no schedstat on this kernel
    return Usage(cpu, len(tids), wait_ns / 1e9, runnable, max(nice, 0), policy)


def renice(pid: int, nice: int) -> None:
    """Set the nice value of every thread of a call (a nice value is a thread's own, and one a
    call started early would keep spinning at full weight). Calls share the zygote's session and
    scheduling autogroup, so the value weighs against the worker's other calls. Lowering it needs
    root; a thread started while the list is read is caught by the next pass."""
    done: set[int] = set()
    for _ in range(3):
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - done
        except (OSError, ValueError):
            return
        if not tids:
            return
        for tid in tids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        done |= tids

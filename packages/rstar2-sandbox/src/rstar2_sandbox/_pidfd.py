"""A call's process through its pidfd: the worker holds no pid of a call until it needs one.

`outer_pid(pidfd)` is the call's pid in the worker's pid namespace (0 once it is gone),
`has_exited(pidfd)` polls without reaping (the zygote reaps), `signal_pidfd(pidfd, signum)` sends
a signal that cannot reach a recycled pid; a negative pidfd (not forked yet) is a no-op.
"""

from __future__ import annotations

import contextlib
import select
import signal


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

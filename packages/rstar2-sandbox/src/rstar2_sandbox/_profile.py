"""The worker's profile stamps (`SandboxConfig.profile`; bench/sandbox_profile.py reads them).

Contract. With profiling on, a call carries a list of stamps, each (phase, perf_counter_ns, CPU
ns, minor faults); the worker's own stamps carry 0 for CPU and faults. `begin` opens the list
with `worker_received` (the pool's `received` time) and `worker_prepared`; `mark` appends a phase
and does nothing when the list is None (profiling off); `answer` is the `profile` entry of a
`done` frame: the worker's, the zygote's and the child's stamps and the child's CPU ns. The
zygote and the child stamp their own phases (`_zygote`, `_child.stamper`). Stamps are measuring
only: nothing a call does depends on them.
"""

from __future__ import annotations

import time
from typing import Any

Stamp = tuple[str, int, int, int]  # phase, perf_counter_ns, CPU ns, minor page faults


def begin(received_s: float) -> list[Stamp]:
    """A call's first stamps: the pool's send (`received_s`, perf_counter seconds) and now."""
    return [("worker_received", int(received_s * 1e9), 0, 0), _now("worker_prepared")]


def mark(stamps: list[Stamp] | None, phase: str) -> None:
    """Stamp `phase` now; nothing when profiling is off (`stamps` is None)."""
    if stamps is not None:
        stamps.append(_now(phase))


def answer(
    worker: list[Stamp], zygote: list[Any] | None, child: Any, cpu_s: float
) -> dict[str, Any]:
    """The `profile` entry of a call's answer; a child's stamps that are not a list count as none
    (they come from the call's own report)."""
    return {
        "worker": worker,
        "zygote": zygote or [],
        "child": child if isinstance(child, list) else [],
        "child_cpu_ns": int(cpu_s * 1e9),
    }


def _now(phase: str) -> Stamp:
    return (phase, time.perf_counter_ns(), 0, 0)

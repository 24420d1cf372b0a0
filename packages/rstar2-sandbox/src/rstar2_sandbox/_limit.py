"""A call's time limit and its priority: the pure rules the worker applies to what /proc says.

Contract. The limit is the program's own time, never its neighbours': `judge` ends a call when
its CPU time (every thread) reaches the limit, or when it is found asleep or blocked (no thread
runnable) having spent the limit running, sleeping or blocking, i.e. its wall time less the time
its threads waited, runnable, for a CPU. A runnable call is judged on its CPU time alone: the
kernel adds a wait to a thread's account only when the wait ends, so while a thread waits the
account lacks it, and a call that is only waiting for a CPU must not be charged for it. So an
endless loop ends after its limit of CPU, a `sleep` after its limit of wall time, and a call
slowed by a busy host runs until it has had its time. A call still running at `ceiling_factor`
times its limit in wall time, having used neither, was starved by the host: "starved", which the
worker answers as a `sandbox_error` (not the program's fault), unless the call lowered its own
priority below the worker's (a higher nice value, or the batch or idle policy on any thread):
then its starving is its own doing and a timeout. Each verdict says when to look again: the
earliest moment the limit or the ceiling could be reached.

`demotion` is the least-attained-service order the worker renices calls by: nice 10 once a call
has used `first` seconds of CPU (or half a core that long), nice 19 at `second`; fresh short
calls run ahead of both, and a maths call that needs a few tenths of a second ahead of a loop
that has burnt more. Since the limit counts CPU time, the renice slows a call down but never
brings it closer to a timeout.

`look` and `step_down` apply them to a running call by its pid (`_pidfd`: its account, its
renice). Not covered: killing (the worker).
"""

from __future__ import annotations

from dataclasses import dataclass

from rstar2_sandbox._pidfd import Usage, cpu_seconds, renice, usage

CHECK_AT_LEAST = 0.01  # s between two looks at one call: the precision of a kill
RECHECK_RUNNABLE = 0.1  # s: a call past its own time but runnable, until it sleeps or ends
NICE_STEPS = (10, 19)


@dataclass(frozen=True)
class Verdict:
    kind: str  # "" (not yet), "timeout" or "starved"
    message: str  # the model reads a timeout's: it names the limit, never the host's load
    recheck_s: float  # when nothing was decided: look again after this long


def judge(
    limit: float, wall: float, seen: Usage, base: Usage | None, ceiling_factor: float, nice: int
) -> Verdict:
    """The verdict on a call `wall` seconds after its start; `base` is its account at the start
    (a session's before the cell; None for a one-shot call, which starts from zero); `nice` is
    the value the worker gave it."""
    base = base or Usage(0.0, 1, 0.0, False)
    cpu, waited = seen.cpu_s - base.cpu_s, max(0.0, seen.wait_s - base.wait_s)
    own = wall - waited  # running, sleeping or blocked: what it would have taken alone
    ceiling = ceiling_factor * limit
    if cpu >= limit:
        return Verdict("timeout", f"time limit of {limit:g} s reached (CPU time)", 0.0)
    if own >= limit and not seen.runnable:
        message = f"time limit of {limit:g} s reached (running, sleeping or blocked)"
        return Verdict("timeout", message, 0.0)
    if wall >= ceiling and (seen.nice > nice or seen.policy != 0):
        message = f"time limit of {limit:g} s reached (it lowered its own priority)"
        return Verdict("timeout", message, 0.0)
    if wall >= ceiling:
        message = (
            f"sandbox: the host was too busy: the call had {cpu:.2f} s of CPU in {wall:.1f} s "
            f"and was stopped before reaching its {limit:g} s limit"
        )
        return Verdict("starved", message, 0.0)
    own_left = limit - own if own < limit else RECHECK_RUNNABLE  # runnable: it may sleep soon
    left = min((limit - cpu) / max(1, seen.threads), ceiling - wall, own_left)
    return Verdict("", "", max(CHECK_AT_LEAST, left))


def demotion(cpu: float, wall: float, nice: int, first: float, second: float) -> tuple[int, float]:
    """(the call's nice value now, seconds until it could need another step; 0: none)."""
    if cpu >= second:
        return NICE_STEPS[1], 0.0
    if nice == 0 and (cpu >= first or cpu >= 0.5 * wall):
        nice = NICE_STEPS[0]
    return nice, max(CHECK_AT_LEAST, (first if nice == 0 else second - cpu))


def look(
    pid: int, limit: float, wall: float, base: Usage | None, ceiling_factor: float, nice: int
) -> Verdict:
    """`judge` on the running call `pid`; one that is gone is left to its exit (a second look)."""
    seen = usage(pid) if pid > 0 else None
    if seen is None:
        return Verdict("", "", CHECK_AT_LEAST)
    return judge(limit, wall, seen, base, ceiling_factor, nice)


def step_down(pid: int, nice: int, wall: float, first: float, second: float) -> tuple[int, float]:
    """Renice the running call `pid` as `demotion` says: (its nice now, seconds to the next
    look; 0 when it is at the last step or gone)."""
    cpu = cpu_seconds(pid) if pid > 0 else None
    if cpu is None:
        return nice, 0.0
    now, recheck = demotion(cpu, wall, nice, first, second)
    if now != nice:
        renice(pid, now)
    return now, recheck

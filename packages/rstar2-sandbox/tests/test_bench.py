"""The bench's false timeouts: timed out in the mix, not an endless loop, fits its limit alone."""

from __future__ import annotations

from rstar2_sandbox import ExecutionResult, ExecutionStatus
from rstar2_sandbox.bench import _false_timeouts
from rstar2_sandbox.workload import make_workload

S = ExecutionStatus


def test_a_false_timeout_is_one_that_fits_its_limit_alone():
    jobs = make_workload(100, "standard", seed=0)
    loop = next(i for i, j in enumerate(jobs) if j.kind == "loop")
    cpu = [i for i, j in enumerate(jobs) if j.kind == "cpu"][:3]
    results = [ExecutionResult(status=j.status) for j in jobs]
    for index in [loop, *cpu]:
        results[index] = ExecutionResult(status=S.TIMEOUT, wall_s=2.0)
    alone = {
        cpu[0]: ExecutionResult(status=S.OK, wall_s=0.4, cpu_s=0.3),  # fits: a false timeout
        cpu[1]: ExecutionResult(status=S.OK, wall_s=2.5, cpu_s=2.1),  # needs more than its limit
        cpu[2]: ExecutionResult(status=S.TIMEOUT, wall_s=8.0, cpu_s=8.0),  # times out alone too
    }
    found = _false_timeouts(jobs, results, alone, limit=2.0)
    assert [f["alone_wall_s"] for f in found] == [0.4]  # the loop is a true timeout
    assert found[0]["code"] == jobs[cpu[0]].request.code

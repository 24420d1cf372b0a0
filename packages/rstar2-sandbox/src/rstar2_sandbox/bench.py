"""`rstar2-sandbox bench`: drive a real server with the seeded maths mix and measure it.

Contract. `run_bench(options)` starts `rstar2-sandbox serve` as a child process on a free
loopback port (or uses `--address`), sends `calls` jobs from `workload.make_workload` with
`concurrency` calls in flight through `SandboxClient`, and returns a report: executions/s,
p50/p90/p99 latency (overall, for short snippets and for the CPU calls), counts per status,
correctness against the expected outputs, false timeouts, the ceiling that the infinite loops
impose (cores / (loop share x timeout): each loop uses its whole limit of CPU), and the server's
memory, process count and open descriptors before and after. `format_table` prints it; the CLI
writes it as JSON. A benchmark, not a test: nothing here asserts.

A **false timeout** is a call that timed out in the mix, is not an endless loop, and fits its
limit alone: run alone on the same server in the same run (one call in flight, before the mix
for every CPU call of the mix, after it for any other call that timed out), its `wall_s` is
below the limit. The CPU calls' alone times are reported too (`cpu_calls_alone_s`), so a
reader sees how far below the limit they are.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.execution import ExecutionStatus
from rstar2_sandbox.workload import Job, Mix, make_workload


@dataclass(frozen=True)
class BenchOptions:
    calls: int = 1000
    concurrency: int = 16
    timeout_s: float = 2.0
    mix: Mix = "standard"
    seed: int = 0
    workers: int = 2
    address: str | None = None
    warmup: int = 32


def _tree(pid: int) -> list[int]:
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        found += kids
        frontier += kids
    return found


def _resources(pid: int) -> dict[str, int]:
    """RSS (KiB), processes and open descriptors of the server and everything below it."""
    rss = fds = 0
    pids = _tree(pid)
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                rss += int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))  # type: ignore[union-attr]
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except (OSError, AttributeError):
            continue
    return {"rss_kib": rss, "processes": len(pids), "open_fds": fds}


def _cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the server process, of its workers, and of the calls the workers reaped."""
    ticks = os.sysconf("SC_CLK_TCK")

    def times(p: int) -> list[int]:
        with open(f"/proc/{p}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return [int(f) for f in fields[11:15]]  # utime stime cutime cstime

    server = times(pid)
    workers = [times(p) for p in _tree(pid)[1:]]
    return {
        "server": (server[0] + server[1]) / ticks,
        "workers": sum(w[0] + w[1] for w in workers) / ticks,
        "calls": sum(w[2] + w[3] for w in workers) / ticks,
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _alone(client: SandboxClient, jobs: list[Job], limit: float) -> dict[int, Any]:
    """Each job run by itself (one in flight), with room past the limit to show its need."""
    alone = {}
    for job in jobs:
        request = job.request.model_copy(update={"timeout_s": 4 * limit})
        alone[int(job.request.request_id)] = await client.execute(request)
    return alone


def _false_timeouts(
    jobs: list[Job], results: list[Any], alone: dict[int, Any], limit: float
) -> list[dict[str, Any]]:
    """The calls that timed out in the mix although they fit their limit alone."""
    found = []
    for index, (job, result) in enumerate(zip(jobs, results, strict=True)):
        if job.status is ExecutionStatus.TIMEOUT or result.status is not ExecutionStatus.TIMEOUT:
            continue
        solo = alone[index]
        if solo.status is not ExecutionStatus.TIMEOUT and solo.wall_s < limit:
            alone_s = {"alone_wall_s": solo.wall_s, "alone_cpu_s": solo.cpu_s}
            found.append(_example(job, result) | alone_s)
    return found


def _spread(values: list[float]) -> dict[str, float]:
    low, high = min(values, default=0.0), max(values, default=0.0)
    return {"min": low, "p50": _percentile(values, 0.5), "max": high}


async def _drive(options: BenchOptions, address: str, server_pid: int | None) -> dict[str, Any]:
    jobs = make_workload(options.calls, options.mix, options.seed, options.timeout_s)
    warm = make_workload(options.warmup, "no_loops", options.seed + 1, options.timeout_s)
    latencies: list[tuple[str, float]] = []
    results: list[Any] = [None] * len(jobs)
    async with SandboxClient(address) as client:
        await client.execute_many([j.request for j in warm])
        alone = await _alone(client, [j for j in jobs if j.kind == "cpu"], options.timeout_s)
        before = _resources(server_pid) if server_pid else {}
        cpu_before = _cpu(server_pid) if server_pid else {}
        own_before = time.process_time()
        gate = asyncio.Semaphore(options.concurrency)

        async def one(index: int) -> None:
            async with gate:
                start = time.perf_counter()
                results[index] = await client.execute(jobs[index].request)
                latencies.append((jobs[index].kind, time.perf_counter() - start))

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(jobs))))
        elapsed = time.perf_counter() - start
        own = time.process_time() - own_before
        cpu_after = _cpu(server_pid) if server_pid else {}
        await asyncio.sleep(0.5)
        after = _resources(server_pid) if server_pid else {}
        info = (await client.info())[0].model_dump()
        suspects = [  # timed out, not a loop, not yet run alone
            job
            for job, result in zip(jobs, results, strict=True)
            if result.status is ExecutionStatus.TIMEOUT
            and job.status is not ExecutionStatus.TIMEOUT
            and int(job.request.request_id) not in alone
        ]
        alone |= await _alone(client, suspects, options.timeout_s)
    false_timeouts = _false_timeouts(jobs, results, alone, options.timeout_s)
    cpu_alone = [alone[int(j.request.request_id)] for j in jobs if j.kind == "cpu"]
    wrong = [j for j, r in zip(jobs, results, strict=True) if not j.check(r)]
    loops = sum(j.kind == "loop" for j in jobs)
    cores = os.cpu_count() or 1
    ceiling = cores / (loops / len(jobs) * options.timeout_s) if loops else None
    rate = len(jobs) / elapsed
    return {
        "options": options.__dict__,
        "cores": cores,
        "confinements": info["confinements"],
        "unavailable": info["unavailable"],
        "elapsed_s": elapsed,
        "executions_per_s": rate,
        "loop_ceiling_per_s": ceiling,
        "fraction_of_ceiling": rate / ceiling if ceiling else None,
        "latency_s": {
            f"p{q}": _percentile([t for _, t in latencies], q / 100) for q in (50, 90, 99)
        },
        "short_latency_s": {
            f"p{q}": _percentile([t for k, t in latencies if k == "short"], q / 100)
            for q in (50, 90, 99)
        },
        "cpu_latency_s": {
            f"p{q}": _percentile([t for k, t in latencies if k == "cpu"], q / 100)
            for q in (50, 90, 99)
        },
        "cpu_calls_alone_s": {
            "wall": _spread([r.wall_s for r in cpu_alone]),
            "cpu": _spread([r.cpu_s for r in cpu_alone]),
        },
        "statuses": dict(Counter(r.status.value for r in results)),
        "kinds": dict(Counter(j.kind for j in jobs)),
        "correct": len(jobs) - len(wrong),
        "short_correct": sum(j.kind == "short" for j in jobs)
        - sum(j.kind == "short" for j in wrong),
        "short_total": sum(j.kind == "short" for j in jobs),
        "cpu_correct": sum(
            j.kind == "cpu" and j.check(r) for j, r in zip(jobs, results, strict=True)
        ),
        "cpu_total": sum(j.kind == "cpu" for j in jobs),
        "false_timeouts": len(false_timeouts),
        "false_timeout_examples": false_timeouts[:5],
        "wrong_examples": [
            _example(j, r) for j, r in zip(jobs, results, strict=True) if not j.check(r)
        ][:5],
        "cpu_ms_per_call": {
            "bench_client": 1000 * own / len(jobs),
            **{k: 1000 * (cpu_after[k] - cpu_before[k]) / len(jobs) for k in cpu_after},
        },
        "server_before": before,
        "server_after": after,
    }


def _example(job: Any, result: Any) -> dict[str, str]:
    return {
        "code": job.request.code,
        "want": job.status.value,
        "got": result.status.value,
        "stdout": result.stdout[:200],
        "message": result.message,
    }


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run the benchmark, starting a server child process unless an address is given."""
    if options.address:
        return asyncio.run(_drive(options, options.address, None))
    command = [
        sys.executable,
        "-m",
        "rstar2_sandbox.cli",
        "serve",
        "--port",
        "0",
        "--workers",
        str(options.workers),
        "--max-in-flight",
        str(max(32, options.concurrency)),
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if match is None:
            raise RuntimeError(f"the server did not start: {line.strip()!r}")
        return asyncio.run(_drive(options, match.group(1), server.pid))
    finally:
        server.terminate()
        server.wait(30)


def format_table(report: dict[str, Any]) -> str:
    """One table for a terminal or a README."""
    o = report["options"]
    lat, short = report["latency_s"], report["short_latency_s"]
    rows = [
        ("mix / calls / in flight", f"{o['mix']} / {o['calls']} / {o['concurrency']}"),
        ("timeout / workers / cores", f"{o['timeout_s']} s / {o['workers']} / {report['cores']}"),
        ("confinements", ", ".join(report["confinements"])),
        ("executions/s", f"{report['executions_per_s']:.1f}"),
        ("false timeouts", str(report["false_timeouts"])),
    ]
    if report["loop_ceiling_per_s"]:
        rows.append(
            (
                "loop ceiling (fraction)",
                f"{report['loop_ceiling_per_s']:.1f}/s ({report['fraction_of_ceiling']:.0%})",
            )
        )
    rows += [
        ("latency p50/p90/p99", f"{lat['p50']:.3f} / {lat['p90']:.3f} / {lat['p99']:.3f} s"),
        ("short p50/p90/p99", f"{short['p50']:.3f} / {short['p90']:.3f} / {short['p99']:.3f} s"),
    ]
    if report["cpu_total"]:
        cpu, alone = report["cpu_latency_s"], report["cpu_calls_alone_s"]
        rows += [
            ("CPU calls p50/p90/p99", f"{cpu['p50']:.3f} / {cpu['p90']:.3f} / {cpu['p99']:.3f} s"),
            (
                "CPU calls alone: wall, CPU",
                f"{alone['wall']['min']:.2f}-{alone['wall']['max']:.2f} s, "
                f"{alone['cpu']['min']:.2f}-{alone['cpu']['max']:.2f} s",
            ),
            ("CPU calls correct", f"{report['cpu_correct']}/{report['cpu_total']}"),
        ]
    rows += [
        ("statuses", ", ".join(f"{k} {v}" for k, v in sorted(report["statuses"].items()))),
        ("correct", f"{report['correct']}/{o['calls']}"),
        ("short correct", f"{report['short_correct']}/{report['short_total']}"),
    ]
    spent = report["cpu_ms_per_call"]
    rows.append(
        ("CPU ms/call " + " / ".join(spent), " / ".join(f"{v:.1f}" for v in spent.values()))
    )
    b, a = report["server_before"], report["server_after"]
    if b and a:
        for key in ("rss_kib", "processes", "open_fds"):
            rows.append((f"server {key} before -> after", f"{b[key]} -> {a[key]}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

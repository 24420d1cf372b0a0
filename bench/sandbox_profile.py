"""Where a sandbox call's time goes: per-phase timings of the warm pool, and gRPC/HTTP beside it.

Runs the seeded no-loops mix through an in-process `LocalSandbox` with `SandboxConfig(profile=
True)`: every call carries perf_counter_ns stamps (and the child's CPU ns) from the pool, the
worker, the zygote and the call itself. One pass at 1 in flight gives uncontended wall time per
phase (median); one at `--concurrency` gives the rate and the CPU per phase (mean) and per process
kind (pool, workers, zygotes, calls). Then a `rstar2-sandbox serve --http-port` child (profiling
off) is driven through gRPC (`SandboxClient`) and HTTP (`/run_code`) at the same concurrency,
rounds alternating; a cold `python -c` of the same snippets is measured in the same run, since
the machine's speed moves, and the snippets' own CPU in one warm interpreter without a sandbox
(`code_cpu_ms`: the rate no sandbox could pass on this machine today). Every answer is checked.
Prints tables, writes JSON.

    uv run python bench/sandbox_profile.py --calls 1000 --json bench/results/sandbox_profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _sandbox_drive import WARM_UP, best, code_cpu_ms, cold_rate, drive, served_rounds, snippets

from rstar2_sandbox import LocalSandbox, SandboxConfig
from rstar2_sandbox.workload import Job, make_workload

SERVE = [sys.executable, "-m", "rstar2_sandbox.cli", "serve"]
TICKS = os.sysconf("SC_CLK_TCK")

# (phase, from stamp, to stamp): consecutive stamps of one call, in the order a call meets them.
PHASES = [
    ("pool -> worker frame", "pool_sent", "worker_received"),
    ("worker: memfds, pipes", "worker_received", "worker_prepared"),
    ("worker -> zygote (SCM_RIGHTS)", "worker_prepared", "worker_handed"),
    ("zygote wakes, reads", "worker_handed", "zygote_received"),
    ("zygote: limits, statm", "zygote_received", "zygote_fork"),
    ("fork (zygote) to child running", "zygote_fork", "forked"),
    ("child: descriptors, signals", "forked", "descriptors"),
    ("child: setsid, pdeathsig, oom_adj", "descriptors", "session"),
    ("child: mount ns + tmpfs /tmp", "session", "private_tmp"),
    ("child: rlimits", "private_tmp", "rlimits"),
    ("child: caps, uid, dumpable", "rlimits", "caps_uid"),
    ("child: seccomp", "caps_uid", "seccomp"),
    ("child: read code, streams", "seccomp", "read_code"),
    ("child: user code", "read_code", "ran"),
    ("child: exit semantics, flush", "ran", "finished"),
    ("report, exit, zygote wakes", "finished", "zygote_exit_seen"),
    ("zygote: wait4", "zygote_exit_seen", "zygote_reaped"),
    ("zygote -> worker exited", "zygote_reaped", "worker_exit_heard"),
    ("worker: pipes, classify", "worker_exit_heard", "worker_answered"),
    ("worker -> pool frame", "worker_answered", "pool_answered"),
]


def _stamps(profile: dict[str, Any]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Wall ns, CPU ns and minor faults at each stamp of one call."""
    wall: dict[str, int] = {}
    cpu: dict[str, int] = {}
    faults: dict[str, int] = {}
    for part in ("pool", "worker", "zygote", "child"):
        for name, at, used, minflt in profile.get(part, []):
            wall[name], cpu[name], faults[name] = at, used, minflt
    return wall, cpu, faults


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _phase_table(profiles: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase: median and mean wall ms; in the call (and the fork, the zygote's CPU) also
    mean CPU ms and minor (mostly copy-on-write) page faults."""
    rows: dict[str, dict[str, float]] = {}
    parsed = [_stamps(p) for p in profiles]
    for phase, start, end in PHASES:
        walls = [(w[end] - w[start]) / 1e6 for w, _, _ in parsed if start in w and end in w]
        row = {"wall_p50_ms": statistics.median(walls), "wall_mean_ms": _mean(walls)}
        if phase.startswith("fork"):  # the page-table copy is the zygote's CPU
            row["cpu_mean_ms"] = _mean(
                [(c["zygote_forked"] - c["zygote_fork"]) / 1e6 for _, c, _ in parsed]
            )
            row["faults_mean"] = _mean([f["forked"] for _, _, f in parsed if "forked" in f])
        elif phase.startswith("child"):
            spans = [(c, f) for _, c, f in parsed if start in c and end in c]
            row["cpu_mean_ms"] = _mean([(c[end] - c[start]) / 1e6 for c, _ in spans])
            row["faults_mean"] = _mean([f[end] - f[start] for _, f in spans])
        rows[phase] = row
    ended = [(p, c, f) for p, (_, c, f) in zip(profiles, parsed, strict=True) if "finished" in c]
    rows["report, exit, zygote wakes"]["cpu_mean_ms"] = _mean(
        [(p["child_cpu_ns"] - c["finished"]) / 1e6 for p, c, _ in ended]
    )
    rows["report, exit, zygote wakes"]["faults_mean"] = _mean(
        [f["zygote_reaped"] - f["finished"] for _, _, f in ended]
    )
    totals = [(w["pool_answered"] - w["pool_sent"]) / 1e6 for w, _, _ in parsed]
    rows["total (pool sent -> answered)"] = {
        "wall_p50_ms": statistics.median(totals),
        "wall_mean_ms": _mean(totals),
        "cpu_mean_ms": _mean([p["child_cpu_ns"] / 1e6 for p in profiles]),
        "faults_mean": _mean([f.get("zygote_reaped", 0) for _, _, f in parsed]),
    }
    return rows


def _cpu_of(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS


async def _profile(jobs: list[Job], serial: int, width: int) -> dict[str, Any]:
    config = SandboxConfig(profile=True, max_in_flight=max(32, width))
    async with LocalSandbox(config) as sandbox:
        await drive(sandbox.execute, make_workload(WARM_UP, "no_loops", seed=1), width)
        sandbox.profiles.clear()
        await drive(sandbox.execute, jobs[:serial], 1)
        serial_table = _phase_table(sandbox.profiles)
        sandbox.profiles.clear()
        pids = sandbox.worker_processes()
        before = [(_cpu_of(w), _cpu_of(int(z))) for w, z in pids]
        own = time.process_time()
        rate, good = await drive(sandbox.execute, jobs, width)
        own = time.process_time() - own
        after = [(_cpu_of(w), _cpu_of(int(z))) for w, z in pids]
        loaded_table = _phase_table(sandbox.profiles)
    n = len(jobs)

    def spent(index: int, which: int) -> float:
        return sum(a[index][which] - b[index][which] for a, b in zip(after, before, strict=True))

    per_call = {
        "pool_and_bench_process": 1000 * own / n,
        "workers": 1000 * spent(0, 0) / n,
        "zygotes": 1000 * spent(1, 0) / n,
        "calls": 1000 * spent(1, 1) / n,
    }
    return {
        "rate": rate,
        "correct": good,
        "serial": serial_table,
        "loaded": loaded_table,
        "cpu_ms_per_call": per_call,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--serial-calls", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cold-calls", type=int, default=48)
    parser.add_argument("--json", default="bench/results/sandbox_profile.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    jobs = make_workload(args.calls, "no_loops", seed=0)
    cold = asyncio.run(cold_rate(snippets(jobs[: args.cold_calls]), args.concurrency))
    code_ms = code_cpu_ms(snippets(jobs))
    cores = os.cpu_count() or 1
    profile = asyncio.run(_profile(jobs, args.serial_calls, args.concurrency))
    rows = [
        {"run": "cold python -c", "per_s": cold, "correct": None},
        {"run": "in-process pool", "per_s": profile["rate"], "correct": profile["correct"]},
    ]
    serve = [*SERVE, "--port", "0", "--http-port", "0", "--workers", "2"]
    rows += served_rounds(serve, jobs, args.concurrency, args.rounds)
    load_after = os.getloadavg()

    print(f"load {load_before[0]:.2f} -> {load_after[0]:.2f} (1 min), {os.cpu_count()} cores")
    width = f"@{args.concurrency}"
    print(
        f"{'phase (ms; faults: minor page faults)':<36} {'wall p50 @1':>12} "
        f"{'wall mean ' + width:>14} {'CPU ' + width:>9} {'faults':>7}"
    )
    for phase, row in profile["serial"].items():
        loaded = profile["loaded"][phase]
        cpu, faults = loaded.get("cpu_mean_ms"), loaded.get("faults_mean")
        cpu_text = f"{cpu:9.3f}" if cpu is not None else f"{'':9}"
        fault_text = f"{faults:7.0f}" if faults is not None else ""
        print(
            f"{phase:<36} {row['wall_p50_ms']:12.3f} {loaded['wall_mean_ms']:14.3f} "
            f"{cpu_text} {fault_text}"
        )
    cpu_rows = ", ".join(f"{k} {v:.2f}" for k, v in profile["cpu_ms_per_call"].items())
    print(f"CPU ms per call at {args.concurrency} in flight: {cpu_rows}")
    print(f"{'run':<18} {'executions/s':>12} {'x cold':>7} {'correct':>10}")
    for row in rows:
        correct = "" if row["correct"] is None else f"{row['correct']}/{args.calls}"
        print(f"{row['run']:<18} {row['per_s']:12.1f} {row['per_s'] / cold:7.1f} {correct:>10}")
    grpc, http = best(rows, "gRPC"), best(rows, "HTTP")
    print(f"HTTP / gRPC (best rounds): {http / grpc:.0%}")
    print(
        f"the snippets' own code, no sandbox: {code_ms:.2f} ms CPU a call, so at most "
        f"{cores * 1000 / code_ms:.0f}/s on {cores} cores for any sandbox"
    )
    report = {
        "calls": args.calls,
        "concurrency": args.concurrency,
        "load_before": load_before,
        "load_after": load_after,
        "rows": rows,
        "http_over_grpc": http / grpc,
        "phases_serial": profile["serial"],
        "phases_loaded": profile["loaded"],
        "cpu_ms_per_call": profile["cpu_ms_per_call"],
        "code_cpu_ms": code_ms,
        "code_bound_per_s": cores * 1000 / code_ms,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""HTTP (SandboxFusion's /run_code) against gRPC throughput of one `rstar2-sandbox serve`.

Starts `serve --workers 2 --http-port` on loopback, then alternates rounds of the same seeded
no-loops mix through `SandboxClient` (gRPC) and through aiohttp posting `/run_code`, at the same
number in flight, checking every answer; a cold `python -c` of the same snippets at the same
concurrency is measured in the same run (machine speed varies). Prints a table, writes JSON.

    uv run python bench/sandbox_http.py --calls 400 --rounds 2 --json bench/results/sandbox_http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.workload import Job, make_workload

BIN = Path(sys.executable).parent / "rstar2-sandbox"


def _http_ok(job: Job, answer: dict[str, Any]) -> bool:
    run = answer.get("run_result") or {}
    if job.kind == "raise":
        return answer["status"] == "Failed" and (job.exception or "") in run.get("stderr", "")
    if job.stdout is not None:
        return answer["status"] == "Success" and run.get("stdout") == job.stdout
    return answer["status"] == "Success"


async def _grpc(address: str, jobs: list[Job], width: int) -> tuple[float, int]:
    gate = asyncio.Semaphore(width)
    async with SandboxClient(address) as client:

        async def one(job: Job) -> bool:
            async with gate:
                return job.check(await client.execute(job.request))

        start = time.perf_counter()
        good = await asyncio.gather(*(one(j) for j in jobs))
        return len(jobs) / (time.perf_counter() - start), sum(good)


async def _http(url: str, jobs: list[Job], width: int) -> tuple[float, int]:
    gate = asyncio.Semaphore(width)
    connector = aiohttp.TCPConnector(limit=width)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(job: Job) -> bool:
            body = {
                "code": job.request.code,
                "stdin": job.request.stdin,
                "language": "python",
                "run_timeout": job.request.timeout_s,
            }
            async with gate, session.post(url, json=body) as reply:
                return _http_ok(job, await reply.json())

        start = time.perf_counter()
        good = await asyncio.gather(*(one(j) for j in jobs))
        return len(jobs) / (time.perf_counter() - start), sum(good)


async def _cold(jobs: list[Job], width: int) -> float:
    gate = asyncio.Semaphore(width)

    async def one(job: Job) -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                job.request.code,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await proc.communicate(job.request.stdin.encode())

    start = time.perf_counter()
    await asyncio.gather(*(one(j) for j in jobs))
    return len(jobs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cold-calls", type=int, default=48)
    parser.add_argument("--json", default="bench/results/sandbox_http.json")
    args = parser.parse_args()
    argv = [str(BIN), "serve", "--port", "0", "--http-port", "0", "--workers", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    grpc_address = http_address = ""
    while not http_address:
        line = proc.stdout.readline()
        if not line:
            sys.exit("rstar2-sandbox serve did not start")
        if line.startswith("listening on "):
            grpc_address = line.split()[-1]
        elif line.startswith("http listening on "):
            http_address = line.split()[-1]
    rows: list[dict[str, Any]] = []
    try:
        jobs = make_workload(args.calls, "no_loops", seed=0)
        cold = asyncio.run(_cold(jobs[: args.cold_calls], args.concurrency))
        rows.append({"run": "cold python -c", "per_s": cold, "correct": None})
        for index in range(args.rounds):
            for name in ("grpc", "http"):
                if name == "grpc":
                    rate, good = asyncio.run(_grpc(grpc_address, jobs, args.concurrency))
                else:
                    url = f"http://{http_address}/run_code"
                    rate, good = asyncio.run(_http(url, jobs, args.concurrency))
                rows.append({"run": f"{name} round {index + 1}", "per_s": rate, "correct": good})
    finally:
        proc.terminate()
        proc.wait(60)
    grpc_rate = max(r["per_s"] for r in rows if r["run"].startswith("grpc"))
    http_rate = max(r["per_s"] for r in rows if r["run"].startswith("http"))
    print(f"{'run':<16} {'executions/s':>12} {'correct':>9}")
    for row in rows:
        correct = "" if row["correct"] is None else f"{row['correct']}/{args.calls}"
        print(f"{row['run']:<16} {row['per_s']:>12.1f} {correct:>9}")
    print(f"http / grpc (best rounds): {http_rate / grpc_rate:.0%}")
    report = {"calls": args.calls, "concurrency": args.concurrency, "rows": rows}
    report["http_over_grpc"] = http_rate / grpc_rate
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

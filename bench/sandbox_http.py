"""HTTP (SandboxFusion's /run_code) against gRPC throughput of one `rstar2-sandbox serve`.

Starts `serve --workers 2 --http-port` on loopback, then alternates rounds of the same seeded
no-loops mix through `SandboxClient` (gRPC) and through aiohttp posting `/run_code`, at the same
number in flight, checking every answer; a cold `python -c` of the same snippets at the same
concurrency is measured in the same run (machine speed varies). Prints a table and a line for
each answer that was not as expected (what it got back), writes JSON (the same, under `failed`).

    uv run python bench/sandbox_http.py --calls 400 --rounds 2 --json bench/results/sandbox_http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from _sandbox_drive import best, cold_rate, served_rounds, snippets

from rstar2_sandbox.workload import make_workload

BIN = Path(sys.executable).parent / "rstar2-sandbox"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cold-calls", type=int, default=48)
    parser.add_argument("--json", default="bench/results/sandbox_http.json")
    args = parser.parse_args()
    jobs = make_workload(args.calls, "no_loops", seed=0)
    cold = asyncio.run(cold_rate(snippets(jobs[: args.cold_calls]), args.concurrency))
    rows: list[dict[str, Any]] = [{"run": "cold python -c", "per_s": cold, "correct": None}]
    argv = [str(BIN), "serve", "--port", "0", "--http-port", "0", "--workers", "2"]
    rows += served_rounds(argv, jobs, args.concurrency, args.rounds)
    grpc_rate, http_rate = best(rows, "gRPC"), best(rows, "HTTP")
    print(f"{'run':<16} {'executions/s':>12} {'correct':>9}")
    for row in rows:
        correct = "" if row["correct"] is None else f"{row['correct']}/{args.calls}"
        print(f"{row['run']:<16} {row['per_s']:>12.1f} {correct:>9}")
    print(f"HTTP / gRPC (best rounds): {http_rate / grpc_rate:.0%}")
    for row in rows:
        for seen in row.get("failed", []):
            print(f"not as expected in {row['run']}: {seen}")
    report = {"calls": args.calls, "concurrency": args.concurrency, "rows": rows}
    report["http_over_grpc"] = http_rate / grpc_rate
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

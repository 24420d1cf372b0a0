"""Two builds of rstar2-sandbox, alternating in one run: executions/s beside a cold `python -c`.

Each round starts `rstar2-sandbox serve --workers 2` from each interpreter in turn (as root, or
as `nobody` through `tests/as_nobody.py`), drives it with `rstar2-sandbox bench --address` (the
seeded mix, 16 in flight, every answer checked); before each pair it measures a cold `python -c`
of the same snippets at the same concurrency (they import numpy and sympy) and a bare `python -c
pass` (serial, `--bare-calls` runs; issue 29 states its target against this one), since this
shared machine's speed moves. JSON rows carry both: `cold_per_s` and `bare_cold_per_s`.
`--hog` keeps another process busy on the last core during every bench (`python -c 'while True:
pass'`, pinned there): the neighbour a shared host gives. Rows carry each bench's false timeouts
(timed out in the mix, fits its limit alone: `rstar2-sandbox bench`) and statuses.
The baseline is an interpreter whose `rstar2_sandbox` is another checkout (a venv whose .pth puts
that checkout's `src` first). Prints a table, writes JSON.

    uv run python bench/sandbox_ab.py --baseline /tmp/sbbase/venv/bin/python --mix no_loops \
        --user root --user nobody --rounds 2 --json bench/results/sandbox_ab.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _sandbox_drive import cold_rate, snippets

from rstar2_sandbox.workload import make_workload

AS_NOBODY = Path(__file__).parents[1] / "packages/rstar2-sandbox/tests/as_nobody.py"


def _serve(python: str, user: str) -> tuple[subprocess.Popen[str], str]:
    argv = [python, "-m", "rstar2_sandbox.cli", "serve", "--port", "0", "--workers", "2"]
    if user == "nobody":
        argv = [python, str(AS_NOBODY), *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if match is None:
        proc.kill()
        sys.exit(f"{python} serve as {user} did not start: {line.strip()!r}")
    return proc, match.group(1)


def _hog() -> subprocess.Popen[bytes]:
    """A process that keeps the last core busy until it is killed."""
    core = (os.cpu_count() or 1) - 1
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def _bench(python: str, user: str, args: argparse.Namespace) -> dict[str, Any]:
    server, address = _serve(python, user)
    hog = _hog() if args.hog else None
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [sys.executable, "-m", "rstar2_sandbox.cli", "bench", "--address", address]
            command += ["--mix", args.mix, "--calls", str(args.calls), "--json", out.name]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            return json.loads(Path(out.name).read_text())
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        server.terminate()
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--baseline", required=True, help="interpreter of the baseline build")
    parser.add_argument("--candidate", default=sys.executable)
    parser.add_argument("--mix", default="no_loops", choices=("no_loops", "standard"))
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--user", action="append", choices=("root", "nobody"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cold-calls", type=int, default=16)
    parser.add_argument("--bare-calls", type=int, default=20, help="serial `python -c pass` runs")
    parser.add_argument("--hog", action="store_true", help="keep the last core busy meanwhile")
    parser.add_argument("--json", default="bench/results/sandbox_ab.json")
    args = parser.parse_args()
    jobs = make_workload(args.cold_calls, "no_loops", seed=0)
    codes = snippets(jobs)
    bare = [("pass", "")] * args.bare_calls
    rows: list[dict[str, Any]] = []
    for index in range(args.rounds):
        for user in args.user or ["root"]:
            cold = asyncio.run(cold_rate(codes, 16))  # once per pair: slow on a busy machine
            bare_cold = asyncio.run(cold_rate(bare, 1))  # the floor issue 29's target is against
            for name, python in (("baseline", args.baseline), ("candidate", args.candidate)):
                load = os.getloadavg()[0]
                report = _bench(python, user, args)
                rows.append(
                    {
                        "round": index + 1,
                        "user": user,
                        "build": name,
                        "load_1min": load,
                        "per_s": report["executions_per_s"],
                        "cold_per_s": cold,
                        "bare_cold_per_s": bare_cold,
                        "hog": args.hog,
                        "correct": report["correct"],
                        "false_timeouts": report["false_timeouts"],
                        "statuses": report["statuses"],
                        "cpu_calls_alone_s": report.get("cpu_calls_alone_s"),
                        "cpu_latency_s": report.get("cpu_latency_s"),
                        "latency_s": report["latency_s"],
                        "cpu_ms_per_call": report["cpu_ms_per_call"],
                        "confinements": report["confinements"],
                    }
                )
                r = rows[-1]
                print(
                    f"round {index + 1} {user:<6} {name:<9} load {load:5.2f}  "
                    f"{r['per_s']:6.1f}/s  cold mix {cold:5.2f}/s  x{r['per_s'] / cold:5.1f}  "
                    f"bare {bare_cold:5.2f}/s  x{r['per_s'] / bare_cold:5.1f}  "
                    f"{r['correct']}/{args.calls} correct, {r['false_timeouts']} false timeouts, "
                    + ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())),
                    flush=True,
                )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"mix": args.mix, "calls": args.calls, "rows": rows}))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""What the sandbox benches share: a cold `python -c` rate, the drive loop, a served sandbox.

Not a bench itself (no table, no JSON): `sandbox_http.py`, `sandbox_profile.py` and
`sandbox_ab.py` import it (`python bench/x.py` puts bench/ first on the path).

- `cold_rate(codes, width)`: executions/s of a fresh `python -c CODE` (stdin fed) per snippet,
  `width` at once: the machine's floor that sandbox figures are reported beside.
- `code_cpu_ms(codes)`: the snippets' own CPU per call, run one after another in one warm
  interpreter (the zygote's preload and warm-up, no fork, no confinement): what a sandbox that
  cost nothing would still spend, so `cores * 1000 / code_cpu_ms` bounds any sandbox here.
- `drive(run, jobs, width, check, failed)`: `run(job.request)` for every job, `width` in flight;
  (executions/s, answers `check` accepts; default `Job.check`); each answer it refuses is
  appended to `failed`, when given, as `describe` writes it (what came back, not a count).
- `drive_grpc(address, ...)` / `drive_http(url, ...)`: the same through `SandboxClient` or
  SandboxFusion's `POST /run_code`, after 32 warm-up calls.
- `served_rounds(argv, jobs, width, rounds)`: starts `rstar2-sandbox serve ... --http-port 0`
  and alternates gRPC and HTTP rounds on it; a row per round, with its refused answers.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from rstar2_sandbox import SandboxClient
from rstar2_sandbox.workload import Job, make_workload

WARM_UP = 32  # calls before a timed pass (seed 1, not the timed jobs)


async def cold_rate(codes: Sequence[tuple[str, str]], width: int) -> float:
    """Executions/s of `python -c code` with `stdin` fed, for each (code, stdin), `width` at once."""
    gate = asyncio.Semaphore(width)

    async def one(code: str, stdin: str) -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                code,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await proc.communicate(stdin.encode())

    start = time.perf_counter()
    await asyncio.gather(*(one(code, stdin) for code, stdin in codes))
    return len(codes) / (time.perf_counter() - start)


_CODE_CPU = """
import contextlib, io, json, sys, time
from rstar2_sandbox import SandboxConfig
from rstar2_sandbox._zygote import warm_up
config = SandboxConfig()
warm_up(config.preload, config.warmup_code)
spent = 0
for code, stdin in json.load(sys.stdin):
    sys.stdin = io.StringIO(stdin)
    compiled = compile(code, "<call>", "exec")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        start = time.process_time_ns()
        try:
            exec(compiled, {"__name__": "__main__"})
        except BaseException:
            pass
        spent += time.process_time_ns() - start
print(spent / 1e6)
"""


def code_cpu_ms(codes: Sequence[tuple[str, str]]) -> float:
    """Mean CPU ms of each (code, stdin) run in one warm interpreter, no sandbox (see above)."""
    done = subprocess.run(
        [sys.executable, "-c", _CODE_CPU],
        input=json.dumps(list(codes)),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1]) / len(codes)


def snippets(jobs: Sequence[Job]) -> list[tuple[str, str]]:
    """The (code, stdin) of each job, for `cold_rate`."""
    return [(job.request.code, job.request.stdin) for job in jobs]


def _checked(job: Job, answer: Any) -> bool:
    return job.check(answer)


def describe(job: Job, answer: Any) -> dict[str, Any]:
    """What a refused answer got back: a `/run_code` reply's statuses and time, or a result's."""
    seen: dict[str, Any] = {"request_id": job.request.request_id, "kind": job.kind}
    if isinstance(answer, dict):
        run = answer.get("run_result") or {}
        seen |= {"status": answer.get("status"), "message": answer.get("message")}
        seen |= {f"run_{k}": run.get(k) for k in ("status", "return_code", "execution_time")}
        return seen | {"stdout": str(run.get("stdout"))[:80]}
    seen |= {"status": str(answer.status), "message": answer.message, "wall_s": answer.wall_s}
    return seen | {"cpu_s": answer.cpu_s, "queue_s": answer.queue_s, "stdout": answer.stdout[:80]}


async def drive(
    run: Callable[[Any], Awaitable[Any]],
    jobs: Sequence[Job],
    width: int,
    check: Callable[[Job, Any], bool] = _checked,
    failed: list[dict[str, Any]] | None = None,
) -> tuple[float, int]:
    """(executions/s, correct answers) of `run(job.request)` over `jobs`, `width` in flight."""
    gate = asyncio.Semaphore(width)

    async def one(job: Job) -> bool:
        async with gate:
            answer = await run(job.request)
        good = check(job, answer)
        if not good and failed is not None:
            failed.append(describe(job, answer))
        return good

    start = time.perf_counter()
    good = await asyncio.gather(*(one(j) for j in jobs))
    return len(jobs) / (time.perf_counter() - start), sum(good)


async def drive_grpc(
    address: str, jobs: Sequence[Job], width: int, failed: list[dict[str, Any]] | None = None
) -> tuple[float, int]:
    async with SandboxClient(address) as client:
        await client.execute_many([j.request for j in make_workload(WARM_UP, "no_loops", seed=1)])
        return await drive(client.execute, jobs, width, failed=failed)


def http_ok(job: Job, answer: dict[str, Any]) -> bool:
    """Whether a `/run_code` answer is what the job expects (SandboxFusion's statuses)."""
    run = answer.get("run_result") or {}
    if job.kind == "raise":
        return answer["status"] == "Failed" and (job.exception or "") in run.get("stderr", "")
    if job.stdout is not None:
        return answer["status"] == "Success" and run.get("stdout") == job.stdout
    return answer["status"] == "Success"


async def drive_http(
    url: str, jobs: Sequence[Job], width: int, failed: list[dict[str, Any]] | None = None
) -> tuple[float, int]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=width)) as session:

        async def run(request: Any) -> dict[str, Any]:
            body = {"code": request.code, "stdin": request.stdin, "language": "python"}
            body["run_timeout"] = request.timeout_s
            async with session.post(url, json=body) as reply:
                return await reply.json()

        await drive(run, make_workload(WARM_UP, "no_loops", seed=1), width, http_ok)
        return await drive(run, jobs, width, http_ok, failed)


def served_rounds(argv: list[str], jobs: Sequence[Job], width: int, rounds: int) -> list[dict]:
    """Start `argv` (an `rstar2-sandbox serve` with `--http-port 0`), then `rounds` times drive
    `jobs` through gRPC and then HTTP; a row each: run ("gRPC round 1"), per_s, correct, failed
    (`describe` of each refused answer). Exits
    with one line when the server does not start; stops it at the end."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    grpc_address = http_address = ""
    while not http_address:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            sys.exit("rstar2-sandbox serve did not start")
        if line.startswith("listening on "):
            grpc_address = line.split()[-1]
        elif line.startswith("http listening on "):
            http_address = line.split()[-1]
    rows = []
    try:
        for index in range(rounds):
            failed: list[dict[str, Any]] = []
            rate, good = asyncio.run(drive_grpc(grpc_address, jobs, width, failed))
            row = {"run": f"gRPC round {index + 1}", "per_s": rate, "correct": good}
            rows.append(row | {"failed": failed})
            url, failed = f"http://{http_address}/run_code", []
            rate, good = asyncio.run(drive_http(url, jobs, width, failed))
            row = {"run": f"HTTP round {index + 1}", "per_s": rate, "correct": good}
            rows.append(row | {"failed": failed})
    finally:
        proc.terminate()
        proc.wait(60)
    return rows


def best(rows: list[dict], prefix: str) -> float:
    """The highest rate among the rows whose run starts with `prefix` ("gRPC", "HTTP")."""
    return max(row["per_s"] for row in rows if row["run"].startswith(prefix))

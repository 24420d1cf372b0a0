"""`rstar2-sandbox serve --http-port` as a real subprocess on 127.0.0.1:0 with a token from
`RSTAR2_SANDBOX_TOKEN`: SandboxFusion's `/run_code` (the contract, every field and status, auth
by header and by path prefix, bad input as one-line 4xx), SandboxFusion's own SDK from PyPI,
unmodified, through the path prefix; code-judge's `/run` and `/run/long-batch` driven by rStar's
own batch client (copied below); a non-loopback HTTP bind without a token refused."""

from __future__ import annotations

import asyncio
import base64
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

BIN = Path(sys.executable).parent / "rstar2-sandbox"
TOKEN = "http-test-token-0123456789"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The server's base URL and its process."""
    argv = [str(BIN), "serve", "--port", "0", "--http-port", "0", "--workers", "1"]
    argv += ["--http-max-body-bytes", str(4 << 20)]
    env = os.environ | {"RSTAR2_SANDBOX_TOKEN": TOKEN}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    deadline, address = time.monotonic() + 180, ""
    while time.monotonic() < deadline and not address:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("http listening on "):
            address = line.split()[-1]
    if not address:
        proc.kill()
        pytest.fail(f"rstar2-sandbox serve did not start (exit {proc.wait()})")
    yield f"http://{address}", proc
    proc.terminate()
    proc.wait(30)
    proc.stdout.close()


@pytest.fixture(scope="module")
def base(served: tuple[str, subprocess.Popen[str]]) -> str:
    return served[0]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(k) for k in f.read().split()]


def _post(
    base: str, body: Any, path: str = "/run_code", token: str | None = TOKEN
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(base + path, json=body, headers=headers, timeout=60)


def _run(base: str, **fields: Any) -> dict[str, Any]:
    reply = _post(base, {"language": "python"} | fields)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_contract(base: str) -> None:
    body = {"code": "print(1+1)", "language": "python", "run_timeout": 5}
    answer = _post(base, body).json()
    assert answer["status"] == "Success"
    run = answer["run_result"]
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == (
        "Finished",
        0,
        "2\n",
        "",
    )
    assert 0 < run["execution_time"] < 5
    assert answer["message"] == "" and answer["compile_result"] is None
    assert set(answer) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
    }


def test_statuses_as_sandboxfusion_reports_them(base: str) -> None:
    error = _run(base, code="import sys\nprint('a')\nraise ValueError('boom')")
    assert error["status"] == "Failed"
    assert error["run_result"]["status"] == "Finished"
    assert error["run_result"]["return_code"] == 1
    assert error["run_result"]["stdout"] == "a\n"
    assert error["run_result"]["stderr"].startswith("Traceback (most recent call last):")
    assert error["run_result"]["stderr"].endswith("ValueError: boom\n")
    exit3 = _run(base, code="import sys; sys.exit(3)")
    assert (exit3["status"], exit3["run_result"]["return_code"]) == ("Failed", 3)
    slow = _run(base, code="import time; print('x', flush=True); time.sleep(30)", run_timeout=1)
    assert slow["status"] == "Failed"
    assert slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["return_code"] is None
    assert 1 <= slow["run_result"]["execution_time"] < 5
    memory = _run(base, code="x = bytearray(512 << 20)", memory_limit_MB=64)
    assert memory["status"] == "Failed"
    assert memory["run_result"]["return_code"] == 1
    assert "MemoryError" in memory["run_result"]["stderr"]
    roomy = _run(base, code="x = bytearray(512 << 20); print(len(x))", memory_limit_MB=1024)
    assert roomy["status"] == "Success", roomy


def test_stdin_files_and_fetch_files(base: str) -> None:
    code = (
        "import os\n"
        "print(input(), open('data/in.txt').read())\n"
        "open('out.bin', 'wb').write(bytes(range(256)))\n"
    )
    answer = _run(
        base,
        code=code,
        stdin="from stdin\n",
        files={"data/in.txt": base64.b64encode(b"from a file").decode(), "skipped": None},
        fetch_files=["out.bin", "data/in.txt", "missing.txt"],
        compile_timeout=3,
    )
    assert answer["status"] == "Success", answer
    assert answer["run_result"]["stdout"] == "from stdin from a file\n"
    assert base64.b64decode(answer["files"]["out.bin"]) == bytes(range(256))
    assert base64.b64decode(answer["files"]["data/in.txt"]) == b"from a file"
    assert "missing.txt" not in answer["files"]
    again = _run(base, code="import os; print(sorted(os.listdir('.')))")
    left = again["run_result"]["stdout"]  # a checkout under /tmp shows as its mount point
    assert "out.bin" not in left and "'data'" not in left, left  # nothing of the last call


def test_a_call_that_waits_for_its_fork_is_no_time_limit(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    """Issue 29: under load /run_code answered TimeLimitExceeded (with the right stdout) for
    calls that used milliseconds of CPU, because their wait for the worker's zygote counted as
    run time. Here the zygote is stopped past `run_timeout` while calls wait for it."""
    base, proc = served
    ((worker,),) = [_children(proc.pid)]  # --workers 1
    ((zygote,),) = [_children(worker)]  # calls are the zygote's children, not the worker's
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def while_the_zygote_is_stopped() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            os.kill(zygote, signal.SIGSTOP)
            try:
                calls = [
                    asyncio.ensure_future(
                        client.post(
                            base + "/run_code",
                            json={"code": f"print({i})", "language": "python", "run_timeout": 1},
                            headers=headers,
                        )
                    )
                    for i in range(3)
                ]
                await asyncio.sleep(3.0)  # the worker checks deadlines at least once a second
            finally:
                os.kill(zygote, signal.SIGCONT)
            return await asyncio.gather(*calls)

    answers = [reply.json() for reply in asyncio.run(while_the_zygote_is_stopped())]
    seen = [(a["status"], (a["run_result"] or {}).get("stdout")) for a in answers]
    assert seen == [("Success", f"{i}\n") for i in range(3)], answers


def test_auth_by_header_and_by_path_prefix(base: str) -> None:
    body = {"code": "print('hi')", "language": "python"}
    assert _post(base, body, token=None).status_code == 401
    assert _post(base, body, token="wrong").status_code == 403
    assert (
        _post(base.replace("://", "://") + f"/t/{TOKEN}", body, token=None).json()["run_result"][
            "stdout"
        ]
        == "hi\n"
    )
    assert _post(base + "/t/wrong", body, token=None).status_code == 403
    refused = _post(base, body, token=None).json()
    assert refused == {"detail": "missing token: send Authorization: Bearer TOKEN or /t/TOKEN/"}


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"code": "print(1)", "language": "cpp"}, 400, "language 'cpp' is not supported"),
        ({"code": "print(1)"}, 400, "field language is required"),
        ({"language": "python"}, 400, "field code is required"),
        ({"code": 3, "language": "python"}, 400, "field code must be str, got int"),
        ({"code": "1", "language": "python", "run_timeout": -1}, 400, "run_timeout must be"),
        ({"code": "1", "language": "python", "files": {"a": "%%%"}}, 400, "not valid base64"),
        ({"code": "1", "language": "python", "fetch_files": [1]}, 400, "fetch_files must be"),
        ([1, 2], 400, "the body must be a JSON object"),
        ({"code": "x" * (5 << 20), "language": "python"}, 413, ""),
    ],
)
def test_bad_requests_are_one_line_4xx(base: str, body: Any, status: int, detail: str) -> None:
    reply = _post(base, body)
    assert reply.status_code == status
    assert detail in reply.json()["detail"] and "\n" not in reply.json()["detail"]
    assert _run(base, code="print(1)")["status"] == "Success"  # the server is still there


def test_bad_json_is_400(base: str) -> None:
    reply = httpx.post(
        base + "/run_code", content=b"{bad", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert (reply.status_code, reply.json()) == (400, {"detail": "the body is not valid JSON"})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK calls pydantic v1's .dict()
def test_sandboxfusions_own_sdk_through_the_path_prefix(base: str) -> None:
    pytest.importorskip("sandbox_fusion", reason="the workspace's dev group installs it")
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    endpoint = f"{base}/t/{TOKEN}"
    request = RunCodeRequest(code="print(sum(range(10)))", language="python")  # pyright: ignore[reportCallIssue]
    ok = run_code(request, endpoint)
    assert ok.status == RunStatus.Success
    assert ok.run_result is not None and ok.run_result.stdout == "45\n"
    failed = run_code(
        RunCodeRequest(code="while True: pass", language="python", run_timeout=1),  # pyright: ignore[reportCallIssue]
        endpoint,
    )
    assert failed.status == RunStatus.Failed
    assert failed.run_result is not None and failed.run_result.status == "TimeLimitExceeded"


def _verl_sandbox_fusion() -> Any:
    """verl's own `verl.utils.reward_score.sandbox_fusion`, as installed from PyPI, unmodified.

    Loaded from its files under another package name: `import verl` would run verl's __init__,
    which needs torch, tensordict and Ray (the dev group installs verl without them; see the root
    pyproject's dependency-metadata). The reward module itself imports only requests.
    """
    pytest.importorskip("requests")
    try:
        dist = importlib.metadata.distribution("verl")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the workspace's dev group installs verl")
    folder = Path(str(dist.locate_file("verl/utils/reward_score/sandbox_fusion")))
    name = "verl_sandbox_fusion"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_verls_own_sandbox_fusion_reward(base: str) -> None:
    # What verl's code reward does with `sandbox_fusion.url` set: its compute_score posts every
    # test case to /run_code (no headers, so the token rides in the path) and maps our statuses
    # to its codes: True/False, -2 runtime error, -3 timeout.
    verl = _verl_sandbox_fusion()
    url = f"{base}/t/{TOKEN}/run_code"
    square = "```python\nn = int(input())\nprint(n * n)\n```"
    cases = {"inputs": [f"{n}\n" for n in range(8)], "outputs": [f"{n * n}\n" for n in range(8)]}
    score, meta = verl.compute_score(url, None, 1024, square, cases, timeout=5)
    assert score == 1.0, meta
    assert {m["status"] for m in meta} == {"success"}
    assert meta[3]["stdout"] == "9\n" and meta[3]["exit_code"] == 0

    wrong = square.replace("n * n", "n + n")
    score, meta = verl.compute_score(url, None, 1024, wrong, cases, timeout=5)
    assert score == 2 / 8, meta  # 0 + 0 and 2 + 2 are right by accident
    assert {m["status"] for m in meta} == {"success", "wrong_answer"}

    one = {"inputs": ["1\n"], "outputs": ["1\n"]}
    results, meta = verl.check_correctness(url, one, "raise ValueError('boom')")
    assert results == [-2] and meta[0]["status"] == "runtime_error", meta
    assert "ValueError: boom" in meta[0]["stderr"]
    results, meta = verl.check_correctness(url, one, "while True: pass", timeout=1)
    assert results == [-3] and meta[0]["status"] == "timeout", meta

    # LeetCode-style problems: verl wraps the solution in its own driver (star imports of
    # sys, io, json and more; the call under `if __name__ == '__main__'`), arguments as JSON lines.
    leet = {"fn_name": "add", "inputs": ["1\n2", "[3]\n[4]"], "outputs": ["3", "[3, 4]"]}
    solution = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
    results, meta = verl.check_correctness(url, leet, solution, timeout=5)
    assert results == [True, True], meta


def test_code_judge_run_and_batch_with_rstars_client(base: str) -> None:
    one = _post(base, {"type": "python", "solution": "print(input()*2)", "input": "ab"}, "/run")
    assert one.json() | {"sub_id": "", "cost": 0} == {
        "sub_id": "",
        "success": True,
        "run_success": True,
        "cost": 0,
        "stdout": "abab\n",
        "stderr": "",
        "reason": "",
    }
    checked = _post(
        base,
        {"type": "python", "solution": "print(41)", "expected_output": "42"},
        "/run",
    ).json()
    assert (checked["run_success"], checked["success"]) == (True, False)
    assert _post(base, {"type": "cpp", "solution": "int main(){}"}, "/run").status_code == 400

    calls = [
        {"name": "python_code_with_standard_io", "arguments": {"code": c, "input": i}}
        for c, i in [("print(int(input()) + 1)", "41"), ("1/0", ""), ("while True: pass", "")]
    ]

    async def main() -> list[str]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        host, port = base.removeprefix("http://").split(":")
        async with aiohttp.ClientSession(headers=headers) as session:
            return await run_tool_calls_on_server_async(
                calls,
                session,
                generate_tool_call_code=lambda call: call["arguments"]["code"],
                generate_tool_call_input=lambda call: call["arguments"]["input"],
                host_addr=host,
                host_port=port,
            )

    texts = asyncio.run(main())
    assert texts[0].startswith("Tool call success\nstdout: 42\n")
    assert texts[1].startswith("Tool call failure\nreason: \nstderr: Traceback")
    assert "ZeroDivisionError: division by zero" in texts[1]
    assert texts[2].startswith("Tool call failure\nreason: worker_timeout\n")


# --- rStar2-Agent's tool client, copied from github:microsoft/rStar
# rstar2_agent/tools/code_judge_utils.py (MIT, Copyright (c) Microsoft Corporation) with only
# the saving of failed submissions to a file left out: the peer's behaviour, unchanged.


async def call_long_batch(url, submissions, session, max_retries=4, backoff_factor=0.5):
    sub_num = len(submissions)
    results: list[Any] = [None] * sub_num
    sub_ids = list(range(sub_num))
    attempt_count = 0
    while submissions and attempt_count < max_retries:
        attempt_count += 1
        try:
            data = {"type": "batch", "submissions": submissions}
            queue_timeouts = []
            async with session.post(url, json=data) as response:
                response.raise_for_status()
                response_json = await response.json()
                for sub_id, result in zip(sub_ids, response_json["results"], strict=False):
                    if result["reason"] != "queue_timeout":
                        results[sub_id] = result
                    else:
                        queue_timeouts.append((sub_id, submissions[sub_id]))
            submissions = [sub for _, sub in queue_timeouts]
            sub_ids = [sub_id for sub_id, _ in queue_timeouts]
        except aiohttp.ClientResponseError as e:
            print(f"Attempt {attempt_count}: Server responded with {e.status}")
        except (TimeoutError, aiohttp.ClientError) as e:
            print(f"Attempt {attempt_count}: Caught {type(e).__name__}: {e!r}")
        finally:
            await asyncio.sleep(backoff_factor * (2 ** (attempt_count - 1)))
    return results


async def run_tool_calls_on_server_async(
    tool_calls,
    session,
    language="python",
    max_retries=4,
    backoff_factor=0.5,
    generate_tool_call_code: Any = None,
    generate_tool_call_input: Any = None,
    host_addr="localhost",
    host_port="8088",
):
    submissions = []
    for tool_call in tool_calls:
        submissions.append(
            {
                "type": language,
                "solution": generate_tool_call_code(tool_call),
                "input": generate_tool_call_input(tool_call),
            }
        )
    url = f"http://{host_addr}:{host_port}/run/long-batch"
    results = await call_long_batch(url, submissions, session, max_retries, backoff_factor)
    if None in results:
        failed_indices = [i for i, result in enumerate(results) if result is None]
        if len(failed_indices) > 0:
            raise RuntimeError(f"failed for {len(failed_indices)} tool calls")
    for i in range(len(results)):
        if results[i]["run_success"] and results[i]["success"]:
            output_parts = []
            output_parts.append("Tool call success")
            if results[i]["stdout"]:
                output_parts.append(f"stdout: {results[i]['stdout']}")
            if results[i]["stderr"]:
                output_parts.append(f"stderr: {results[i]['stderr']}")
            output_parts.append(f"execution time: {results[i]['cost']:.2f}s")
            results[i] = "\n".join(output_parts)
        else:
            output_parts = []
            output_parts.append("Tool call failure")
            output_parts.append(f"reason: {results[i]['reason']}")
            if results[i]["stdout"]:
                output_parts.append(f"stdout: {results[i]['stdout']}")
            if results[i]["stderr"]:
                output_parts.append(f"stderr: {results[i]['stderr']}")
            output_parts.append(f"execution time: {results[i]['cost']:.2f}s")
            results[i] = "\n".join(output_parts)
    return results


def test_a_non_loopback_http_bind_without_a_token_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RSTAR2_SANDBOX_TOKEN"}
    out = subprocess.run(
        [str(BIN), "serve", "--host", "0.0.0.0", "--port", "0", "--http-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("rstar2-sandbox: refusing to listen on 0.0.0.0 without a token")

"""The trainer with its rollouts on a remote service: `rstar2-rollout serve` (vLLM, the CPU build
here) and `rstar2-sandbox serve` started as subprocesses, the trainer pointed at the service with
`remote.workers`, three RL steps; the service's greedy answer changes because the trainer pushed its
SFT'd and updated weights. Also the config rules of the `remote` section."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rstar2_rollout import RolloutClient, RolloutSampling, RolloutTask
from rstar2_trainer.config import ConfigError, load_config
from rstar2_trainer.rundir import read_metrics

BIN = Path(sys.executable).parent
SMALL = [
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.tiny.max_response_tokens=[64,64,64]",
    "run.plots=false",
    "run.trackers=[jsonl]",
]


def test_remote_needs_workers_and_excludes_cluster() -> None:
    with pytest.raises(ConfigError, match=r"remote\.workers"):
        load_config("tiny", ["remote.workers=[]"])
    with pytest.raises(ConfigError, match="set cluster or remote, not both"):
        load_config("tiny", ["remote.workers=[127.0.0.1:1]", "cluster.kind=ray"])
    config = load_config("tiny", ["remote.workers=[a:1, b:2]"])
    assert config.remote is not None and config.remote.workers == ["a:1", "b:2"]


def _start(argv: list[str], timeout_s: float = 300.0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    proc.kill()
    raise AssertionError(f"{argv[0]} did not print its address (exit {proc.wait()})")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    from rstar2_rollout.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    sandbox, sandbox_address = _start([str(BIN / "rstar2-sandbox"), "serve", "--port", "0"])
    argv = [
        str(BIN / "rstar2-rollout"), "serve", "--model", str(model), "--sandbox", sandbox_address,
        "--port", "0", "--engine", "vllm", "--max-model-len", "1120", "--kv-cache-bytes",
        str(64 << 20), "--system-prompt", "compact", "--max-tool-response-chars", "256",
    ]  # fmt: skip
    try:
        proc, address = _start(argv)
    except BaseException:
        sandbox.terminate()
        raise
    yield model, address
    for p in (proc, sandbox):
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        if p.stdout is not None:
            p.stdout.close()


def _greedy(address: str) -> list[int]:
    async def main() -> list[int]:
        async with RolloutClient(address) as client:
            sampling = RolloutSampling(n=1, temperature=0.0, max_response_tokens=32, max_turns=1)
            (r,) = [
                r async for r in client.generate([RolloutTask("x", "What is 3 + 4?")], sampling)
            ]
            return r.trajectory.response_ids

    return asyncio.run(main())


@pytest.mark.slow  # vLLM start-up, SFT and three RL steps on 2 CPU cores: ~2 min
def test_trainer_rolls_out_on_a_remote_worker(
    tmp_path: Path, service: tuple[Path, str], tiny_run: list[str]
) -> None:
    model, address = service
    before = _greedy(address)
    run_dir = tmp_path / "run"
    args = [
        "tiny",
        f"run.output_dir={run_dir}",
        *tiny_run,
        *SMALL,
        f"model={{kind: pretrained, path: {model}}}",
        f"remote.workers=[{address}]",
        "eval.before_sft=true",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    records = read_metrics(run_dir)
    steps = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["trajectories"] == 2 * 4 and r["failed_jobs"] == 0
        assert r["time_rollout_s"] > 0 and r["time_generate_s"] > 0
        # the worker's engine counts the pushes the trainer counts: versions known, none stale
        assert (r["staleness_mean"], r["staleness_max"], r["staleness_unknown"]) == (0, 0, 0)
        if not r.get("skipped_update"):
            assert r["time_sync_s"] > 0
    evals = [r for r in records if r["phase"] == "eval"]
    assert [e["when"] for e in evals][:2] == ["before_sft", "after_sft"]
    assert all(e["problems"] == 4 and e["failed_jobs"] == 0 for e in evals)
    # the service now serves the trained weights, not the ones it started with
    assert _greedy(address) != before

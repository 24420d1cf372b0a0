"""Faults injected into real `rstar2-train` runs, each compared with the same run undisturbed.

Every run is a subprocess with real child servers (`rstar2-sandbox serve`, `rstar2-verify
serve`), the transformers engine (seeded per request, so a run repeats itself exactly) and a
tiny model that SFT taught to call the tool (the module's `origin` run, which each run starts
from with `--init-from`); every trajectory is graded by the verify server (`reward.graded:
response`). A fault is a SIGKILL of a server by pid, a SIGTERM of the trainer, a real full
filesystem (a tmpfs) under `checkpoints/`, or a flipped byte in a checkpoint. Each test checks
that the run reaches its last step (by itself, or after the one `--resume` the fault asks for),
that its RL records equal the undisturbed run's (so no call the service lost was scored as the
model's tool error or a wrong answer, and no trajectory was dropped), and how many steps it lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rstar2_trainer.rundir import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]  # the first test builds the origin

MODEL = [
    "model.layers=2",
    "model.hidden_size=64",
    "model.vocab_size=512",
    "engine={kind: hf}",
    "scheduler.policy={kind: least_requests}",  # the transformers engine reports no KV size
    "run.trackers=[jsonl]",
    "run.plots=false",
    "curriculum.batch_size=2",
    "curriculum.source.n=8",
    "algo.group_size=2",
    "algo.filtering=none",  # keep equal-reward groups: every step trains
    "eval.problems=2",
    "eval.max_response_tokens=64",
]
# SFT long enough on few traces that the model calls the tool in about half its rollouts.
ORIGIN = [
    *MODEL,
    "tool.kind=local",
    "verify_service.mode=local",
    "sft.examples=16",
    "sft.epochs=50",
    "sft.batch_size=8",
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.tiny.max_response_tokens=[24,24,24]",
    "run.keep_checkpoints=10",  # checkpoint 0 stays for --init-from
]
RUN = [
    *MODEL,
    "sft.examples=8",  # unused (--init-from skips SFT), so cheap to prepare
    "curriculum.tiny.steps=[3,2,1]",
    "curriculum.tiny.max_response_tokens=[160,160,160]",
    "reward.graded=response",  # every trajectory goes to the verify server
    "rollout.temperature=0.3",  # near the traces SFT taught: calls that parse and reach the sandbox
]
# What a step computed; equal between two runs when no call was lost or misattributed.
SAME = (
    "batch",
    "trajectories",
    "reward",
    "tool_calls_mean",
    "tool_use_share",
    "tool_error_ratio",
    "finish_error",
    "response_len_mean",
    "failed_jobs",
    "loss",
)
STEPS = 6


def _train(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rstar2_trainer.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 3000) -> str:
    proc.wait(timeout)
    return log.read_text()


def _rl(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["phase"] == "rl"]


def _wait(proc: subprocess.Popen, log: Path, ready: Callable[[], bool], timeout: float = 3000):
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def _same(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(got, want, strict=True):
        assert {k: a.get(k) for k in SAME} == {k: b.get(k) for k in SAME}, a["step"]


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Path:
    """A tiny model SFT-trained to call the tool, checkpoint 0 of its run."""
    run_dir = tmp_path_factory.mktemp("origin") / "run"
    log = run_dir.parent / "log"
    proc = _train(["tiny", f"run.output_dir={run_dir}", *ORIGIN], log)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    return run_dir


def _args(origin: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["tiny", f"run.output_dir={run_dir}", *RUN, *extra, "--init-from", f"{origin}:0"]


@pytest.fixture(scope="module")
def reference(origin, tmp_path_factory) -> list[dict]:
    """The undisturbed run's RL records."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    log = run_dir.parent / "log"
    proc = _train(_args(origin, run_dir), log)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    steps = _rl(run_dir)
    assert sum(r["tool_use_share"] for r in steps) > 0  # the model calls the tool
    assert all(r["service_restarts"] == 0 and r["calls_retried"] == 0 for r in steps)
    return steps


@pytest.mark.parametrize("server", ["rstar2_sandbox.cli serve", "rstar2-verify serve"])
def test_a_killed_server_comes_back_and_the_run_goes_on_unchanged(
    origin, reference, tmp_path, server, descendants
):
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = _train(_args(origin, run_dir), log)
    _wait(proc, log, lambda: len(_rl(run_dir)) >= 2)
    os.kill(descendants(proc.pid, server)[0], signal.SIGKILL)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    steps = _rl(run_dir)
    _same(steps, reference)  # nothing lost, nothing scored as the model's failure
    assert sum(r["service_restarts"] for r in steps) == 1
    assert "| services: 1 restart" in out  # the step line says so
    if "sandbox" in server:  # a call found it dead (the proof that calls reach it), and ran again
        assert sum(r["calls_retried"] for r in steps) >= 1


def test_sigterm_stops_at_the_end_of_the_step_and_the_resume_equals_the_run(
    origin, reference, tmp_path
):
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = _train(_args(origin, run_dir, "run.preempt_grace_s=120"), log)
    _wait(proc, log, lambda: len(_rl(run_dir)) >= 2)
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc, log, timeout=120)
    assert proc.returncode == 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    stopped = len(_rl(run_dir))
    assert last == (
        f"rstar2-train: stopped on SIGTERM after RL step {stopped}, checkpoint step {stopped} "
        f"saved; resume with: rstar2-train --resume {run_dir}"
    )
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{stopped:06d}"
    assert stopped < STEPS

    proc = _train(["--resume", str(run_dir)], log)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    _same(_rl(run_dir), reference)


def test_a_second_sigterm_ends_the_run_at_once(origin, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = _train(_args(origin, run_dir, "run.preempt_grace_s=600"), log)
    _wait(proc, log, lambda: len(_rl(run_dir)) >= 1)
    proc.send_signal(signal.SIGTERM)
    _wait(proc, log, lambda: "a second SIGTERM stops at once" in log.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert proc.returncode == -signal.SIGTERM


def test_a_full_disk_at_a_save_ends_with_one_line_and_the_resume_equals_the_run(
    origin, reference, tmp_path, small_disk
):
    run_dir, log = tmp_path / "run", tmp_path / "log"
    run_dir.mkdir()
    checkpoints = small_disk(16 * 1024)
    (run_dir / "checkpoints").symlink_to(checkpoints)
    proc = _train(_args(origin, run_dir), log)
    _wait(
        proc,
        log,
        lambda: (
            (checkpoints / "latest").is_file()
            and (checkpoints / "latest").read_text() == "step_000002"
        ),
    )
    free = os.statvfs(checkpoints)
    filler = checkpoints / "filler"
    filler.write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 64 * 1024))  # 64 KiB left
    out = _finish(proc, log)
    assert proc.returncode == 1, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("rstar2-train: could not write checkpoint step 3: No space left")
    assert last.endswith(
        f"checkpoint step 2 is intact; free space, then resume with --resume {run_dir}"
    )
    assert (checkpoints / "latest").read_text() == "step_000002"
    assert not list(checkpoints.glob(".tmp_*"))

    filler.unlink()
    proc = _train(["--resume", str(run_dir)], log)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    _same(_rl(run_dir), reference)


def test_a_corrupt_latest_is_skipped_and_the_resume_equals_the_run(origin, reference, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = _train(_args(origin, run_dir), log)
    latest = run_dir / "checkpoints" / "latest"
    _wait(proc, log, lambda: latest.is_file() and latest.read_text() == "step_000004")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    model = run_dir / "checkpoints" / latest.read_text() / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))

    proc = _train(["--resume", str(run_dir)], log)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    skipped = [line for line in out.splitlines() if "incomplete or corrupt" in line]
    assert skipped == [
        "checkpoint step_000004 is incomplete or corrupt (model.pt does not match its "
        "checksum); skipped"
    ]
    assert "resumed" in out and "at RL step 3" in out
    _same(_rl(run_dir), reference)


def test_a_service_dead_for_good_restarts_the_run_from_its_checkpoint(
    origin, reference, tmp_path, descendants
):
    """No service restarts allowed: the dead verify server restarts the whole run instead."""
    run_dir, log = tmp_path / "run", tmp_path / "log"
    extra = ["run.service_restarts=0", "run.service_retry_s=2"]
    proc = _train(_args(origin, run_dir, *extra), log)
    _wait(proc, log, lambda: len(_rl(run_dir)) >= 2)
    os.kill(descendants(proc.pid, "rstar2-verify serve")[0], signal.SIGKILL)
    out = _finish(proc, log)
    assert proc.returncode == 0, out[-3000:]
    restarts = [r for r in read_metrics(run_dir) if r["phase"] == "restart"]
    assert len(restarts) == 1
    record = restarts[0]
    assert record["reason"] == "service down" and record["steps_lost"] <= 1
    assert record["failed_step"] - record["resumed_step"] == record["steps_lost"]
    assert f"restart 1 of 3: service down in RL step {record['failed_step']}" in out
    _same(_rl(run_dir), reference)


def test_a_step_that_cannot_end_within_the_grace_is_dropped(origin, tmp_path):
    """A grace shorter than the reserve (twice the last save, plus 10 s): the step in progress
    is cancelled at once and the run exits 0 from its newest checkpoint."""
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = _train(_args(origin, run_dir, "run.preempt_grace_s=1"), log)
    _wait(proc, log, lambda: len(_rl(run_dir)) >= 2)
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc, log, timeout=120)
    assert proc.returncode == 0, out[-3000:]
    newest = int((run_dir / "checkpoints" / "latest").read_text().removeprefix("step_"))
    assert out.strip().splitlines()[-1] == (
        f"rstar2-train: stopped on SIGTERM in the middle of a step (dropped); checkpoint step "
        f"{newest} is the newest; resume with: rstar2-train --resume {run_dir}"
    )

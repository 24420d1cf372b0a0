"""One whole run of the trainer's main loop, fast enough for the default suite.

Everything is real and in this process: a tiny model and tokenizer built on the spot, the
transformers engine behind the rollout package's scheduler and agent loop, the sandbox and the
grader in-process, the algorithm, the driver policy's update, checkpoints, metrics and the exported
policy. Only the sizes are small. The slow suite runs the same loop on vLLM with child servers.
"""

from __future__ import annotations

import json

from rstar2_trainer.cli import main
from rstar2_trainer.rundir import read_metrics


def test_the_main_loop_runs_rl_steps_updates_and_checkpoints(tmp_path, capsys, in_process_rl):
    run_dir = tmp_path / "run"
    args = ["curriculum.tiny.steps=[1,1,1]", "run.trackers=[jsonl]", "run.plots=false"]
    assert main(["tiny", f"run.output_dir={run_dir}", *in_process_rl, *args]) == 0
    out = capsys.readouterr().out
    records = read_metrics(run_dir)
    steps = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["trajectories"] == 1 * 4  # batch 1 x 2G = 4 rollouts
        assert r["optim_steps"] == 1  # one optimizer step (optim.mini_batches=1)
        assert r["train_tokens"] > 0 and r["grad_norm"] >= 0
        assert r["time_rollout_s"] > 0 and r["time_train_s"] > 0
        # synchronous: every rollout ran on the weights the update starts from (engine versions
        # 0, 1, 2 as the trainer pushes after each step)
        assert (r["staleness_mean"], r["staleness_max"], r["staleness_unknown"]) == (0, 0, 0)
    evals = [r for r in records if r["phase"] == "eval"]
    # the tiny recipe evaluates after SFT and after the last stage (eval.every_stage: false)
    assert [e["when"] for e in evals] == ["after_sft", "after_tiny3-hard"]
    assert all(e["trajectories"] == 2 * 4 for e in evals)  # 2 problems x 4 samples (tiny)
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000003"
    assert json.loads((run_dir / "policy" / "rstar2.json").read_text())["step"] == 3
    assert "reward.graded=answer_block" in out  # the rstar2-eval command that reproduces it

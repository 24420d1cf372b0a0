"""Asynchronous steps on the simulator: whole groups, the staleness bound, drops, and the
degenerate case that must be the synchronous step."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Literal

import pytest

from rstar2_rollout.config import SchedulerConfig
from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.research.asyncsim import (
    AsyncSimConfig,
    RunResult,
    StepRecord,
    TrainModel,
    Workload,
    overlap_bound_s,
    packed_work_s,
    run_steps,
    run_sync,
)
from rstar2_rollout.research.simulate import (
    EngineModel,
    Scenario,
    SimEngine,
    TrajectorySpec,
    run_virtual,
)

# 2 engines, 4 groups of 4 per step, a long tail under a 4K budget; a trainer sized so that a
# step's training is a few seconds beside a rollout of about a minute
SMALL = Scenario(
    engines=2,
    prompts=4,
    samples_per_prompt=4,
    max_response_tokens=4096,
    max_turns=6,
    response_median_tokens=1500.0,
    engine=EngineModel(kv_tokens=60_000),
)
TRAIN = TrainModel(gpus=1, other_s=1.0, weight_sync_s=2.0)
CONFIG = SchedulerConfig()


@pytest.mark.parametrize("seed", [0, 1])
def test_no_staleness_without_partial_rollouts_is_the_synchronous_step(seed: int) -> None:
    sync = run_sync(SMALL, CONFIG, TRAIN, 3, seed)
    degenerate = run_steps(
        SMALL, CONFIG, TRAIN, AsyncSimConfig(steps=3, max_staleness=0, partial_rollout=False), seed
    )
    assert [s.end_s for s in degenerate.steps] == pytest.approx(
        [s.end_s for s in sync.steps], rel=1e-12
    )
    # the same groups per step (a batch lists them in the order they finished)
    assert [sorted(s.groups) for s in degenerate.steps] == [list(s.groups) for s in sync.steps]
    assert degenerate.trajectories_per_s == pytest.approx(sync.trajectories_per_s, rel=1e-12)
    assert degenerate.dropped_trajectories == 0
    assert degenerate.staleness_counts == {0: 3 * 4 * 4}
    # the engines idle while the trainer trains and pushes: each step ends train + push after
    # its last trajectory
    for s in sync.steps:
        assert s.end_s == pytest.approx(s.ready_s + s.train_s + TRAIN.weight_sync_s)


def test_async_trains_whole_groups_never_fewer_per_step_and_counts_every_trajectory() -> None:
    sync = run_sync(SMALL, CONFIG, TRAIN, 4, seed=0)
    result = run_steps(SMALL, CONFIG, TRAIN, AsyncSimConfig(steps=4, max_staleness=1), seed=0)
    seen: set[int] = set()
    for step, base in zip(result.steps, sync.steps, strict=True):
        assert len(step.groups) == SMALL.prompts  # groups_per_step
        assert all(n == SMALL.samples_per_prompt for _, n in step.groups)  # each one whole
        assert sum(n for _, n in step.groups) >= sum(n for _, n in base.groups)
        indices = {g for g, _ in step.groups}
        assert not indices & seen  # a group trains once
        seen |= indices
    # out of order: the first groups to finish train first, not the first admitted
    assert sorted(seen) != list(range(len(seen)))
    assert result.admitted_trajectories == (
        result.trained_trajectories + result.dropped_trajectories + result.unfinished_trajectories
    )


@pytest.mark.parametrize("bound", [1, 2])
def test_staleness_never_exceeds_the_bound_and_drops_are_counted(bound: int) -> None:
    result = run_steps(SMALL, CONFIG, TRAIN, AsyncSimConfig(steps=5, max_staleness=bound), seed=0)
    assert max(result.staleness_counts) <= bound
    assert max(result.staleness_counts) >= 1  # trajectories did span a push
    for step in result.steps:
        assert all(0 <= s <= bound for s in step.staleness)
    if bound == 1:  # this workload's stragglers outlive one version
        assert result.dropped_trajectories > 0
        assert result.dropped_trajectories % SMALL.samples_per_prompt == 0  # whole groups
    assert result.mean_staleness > 0


def test_async_beats_sync_on_a_long_tail() -> None:
    sync = run_sync(SMALL, CONFIG, TRAIN, 4, seed=0)
    # a step's 16 trajectories (8 per engine) leave these engines half empty: two steps'
    # worth in flight keeps them full
    run = AsyncSimConfig(steps=4, max_staleness=1, inflight_steps=2.0)
    result = run_steps(SMALL, CONFIG, TRAIN, run, seed=0)
    assert result.trajectories_per_s > 1.4 * sync.trajectories_per_s
    assert result.idle_share < sync.idle_share / 2  # the engines keep generating while it trains
    assert max(result.staleness_counts) <= 1


@pytest.mark.parametrize("unit", ["trajectories", "groups"])
def test_no_more_in_flight_than_the_cap(unit: Literal["trajectories", "groups"]) -> None:
    # a quarter of a step's load: 4 of 16 trajectories, or 1 of 4 groups: one group at a time
    one_group = AsyncSimConfig(steps=3, cap_unit=unit, inflight_steps=0.25)
    tight = run_steps(SMALL, CONFIG, TRAIN, one_group, seed=0)
    two_steps = AsyncSimConfig(steps=3, cap_unit=unit, inflight_steps=2.0)
    wide = run_steps(SMALL, CONFIG, TRAIN, two_steps, seed=0)
    assert tight.trajectories_per_s < wide.trajectories_per_s  # one group at a time starves
    # each step's batch is the next 4 groups in admission order: one in flight, none overtakes
    assert [sorted(g for g, _ in s.groups) for s in tight.steps] == [
        list(range(4 * k, 4 * k + 4)) for k in range(3)
    ]


def test_workload_groups_are_one_prompts_samples_and_stable() -> None:
    w = Workload(SMALL, seed=3)
    g5 = w.group(5)  # chunk 1, prompt 1
    assert [s.key for s in g5] == [f"c1p1-s{i}" for i in range(SMALL.samples_per_prompt)]
    assert len({s.group for s in g5}) == 1
    assert Workload(SMALL, seed=3).group(5) == g5
    assert Workload(SMALL, seed=4).group(5) != g5
    assert w.chunk(0) != w.chunk(1)  # every chunk is a fresh draw


def test_engine_pause_delays_running_requests_and_counts_as_idle() -> None:
    def finish(pause_s: float) -> tuple[float, float]:
        engine = SimEngine("e", EngineModel())

        async def main() -> float:
            task = asyncio.ensure_future(
                engine.generate(range(100), SamplingParams(max_tokens=500), "r/0")
            )
            await asyncio.sleep(1.0)
            engine.pause(pause_s)
            out = await task
            assert len(out.token_ids) == 500  # it kept its place and finished
            return asyncio.get_running_loop().time()

        return run_virtual(main()), engine.stats.busy_s

    plain, plain_busy = finish(0.0)
    paused, paused_busy = finish(5.0)
    assert paused == pytest.approx(plain + 5.0, abs=0.05)
    assert paused_busy == pytest.approx(plain_busy)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncSimConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="inflight_steps"):
        AsyncSimConfig(inflight_steps=0)
    with pytest.raises(ValueError, match="cap_unit"):
        AsyncSimConfig(cap_unit="tokens")  # type: ignore[arg-type]


def test_time_is_itemised_and_no_run_beats_the_overlap_bound() -> None:
    sync = run_sync(SMALL, CONFIG, TRAIN, 4, seed=0)
    # sync writes only what it trains; its trainer idles exactly while the engines roll out,
    # and a push finds nothing running (nothing to abort, no step in flight to wait for)
    assert sync.trained_decoded_tokens == sync.decoded_tokens
    starts = [0.0, *(s.end_s for s in sync.steps[:-1])]
    rollouts = [s.ready_s - start for s, start in zip(sync.steps, starts, strict=True)]
    assert sync.trainer_idle_s == pytest.approx(sum(rollouts))
    assert sync.engine_paused_s == pytest.approx(4 * TRAIN.weight_sync_s)
    assert sync.abort_recompute_s == 0.0
    run = AsyncSimConfig(steps=4, max_staleness=1, inflight_steps=2.0)
    result = run_steps(SMALL, CONFIG, TRAIN, run, seed=0)
    # async writes tokens it never trains (dropped groups, groups unfinished at the end), its
    # trainer waits less, and its pushes find running turns holding KV
    assert result.decoded_tokens > result.trained_decoded_tokens
    assert result.trainer_idle_s < sync.trainer_idle_s
    assert result.abort_recompute_s > 0
    for r in (sync, result):
        assert r.engine_idle_s >= -1e-9
        assert 0 < r.packed_work_s < r.engine_busy_s
        assert overlap_bound_s(r, TRAIN.weight_sync_s) < r.seconds


def test_packed_work_by_hand() -> None:
    # prompt 100, turn of 10, tool output 20, turn of 5: 15 tokens decoded reading
    # 10 x 100 + 45 then 5 x 130 + 10 KV tokens; 120 prefilled; the mean context 1705 / 15
    # fits 60 times in 6820 KV tokens
    spec = TrajectorySpec("p0-s0", 100, (10, 5), (20,), (0.1,))
    model = EngineModel(kv_tokens=6820)
    expected = (
        15 * model.per_request_step_s
        + 1705 * model.per_kv_token_step_s
        + 120 / model.prefill_tokens_per_s
        + (model.base_step_s + model.scheduler_step_s) * 15 / 60
    )
    assert packed_work_s([spec], model) == pytest.approx(expected, rel=1e-12)
    # a tool output after the last turn is never prefilled
    assert packed_work_s([dataclasses.replace(spec, tool_tokens=(20, 99))], model) == (
        pytest.approx(expected, rel=1e-12)
    )


def _record(step: int, train_s: float) -> StepRecord:
    return StepRecord(step, 0.0, 0.0, train_s, 0, ((step, 4),), (0,))


@pytest.mark.parametrize(
    ("work", "bound"),
    [
        (100.0, 100 + 2 * 5 + 30 + 5),  # the engines' work, two pauses, the last step
        (30.0, 30 / 3 + (10 + 5) + (20 + 5) + 30 + 5),  # the trainer's chain is longer
    ],
)
def test_overlap_bound_by_hand(work: float, bound: float) -> None:
    steps = tuple(_record(k, t) for k, t in enumerate([10.0, 20.0, 30.0]))
    result = RunResult("async", steps, 4, 12, 0, 0, 0, 0.0, packed_work_s=work)
    assert overlap_bound_s(result, weight_sync_s=5.0) == pytest.approx(bound)

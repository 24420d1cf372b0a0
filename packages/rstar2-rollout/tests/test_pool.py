"""`RolloutPool` on the transformers engine with the tiny model: groups come back whole as they
finish, the slow one stays in flight across a real weight update and its later turns carry the
new version; a group is never dropped for its staleness but taken when due; submissions start
only while they fit; a pause holds the next turns and loses nothing; `close` stops everything.

The agent is scripted (how many turns a sample takes, a tool wait between turns) so the long tail
is known; every turn is a real `generate` on the engine, which tags it with its weights version.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rstar2_rollout import RolloutConfig, RolloutPool, RolloutTask
from rstar2_rollout.config import LeastRequestsPolicy, SchedulerConfig
from rstar2_rollout.engine import Engine, SamplingParams
from rstar2_rollout.scheduler import Scheduler
from rstar2_rollout.service import RolloutSampling, RolloutService
from rstar2_rollout.trajectory import Trajectory

N = 3  # samples per problem
TOOL_S = 0.25  # the scripted tool's wait between turns
CONFIG = RolloutConfig(temperature=1.0, max_response_tokens=64, max_turns=8)


class Reward:
    """Reward 1 for every trajectory that has sampled tokens; remembers what it graded."""

    def __init__(self) -> None:
        self.graded: list[tuple[str, int]] = []

    async def score(self, problem: RolloutTask, trajectory: Trajectory) -> float:
        self.graded.append((problem.id, trajectory.sample_index))
        trajectory.reward = float(trajectory.sampled_tokens > 0)
        return trajectory.reward


class Counted:
    """The transformers engine, with the request id of every generation it started."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: Any, params: SamplingParams, request_id: str) -> Any:
        self.calls.append(request_id)
        return await self.engine.generate(prompt_ids, params, request_id)


@pytest.fixture(scope="module")
def engine(tiny_model) -> Any:
    from transformers import AutoModelForCausalLM

    from rstar2_rollout.engines.hf import HFEngine

    return Counted(HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model), name="hf-0"))


def _service(engine: Any, tokenizer: Any, cap: int | None = None) -> RolloutService:
    """A service whose agent takes 4 turns for the last sample of a 'long*' problem, else 1;
    least_requests with `cap` jobs per engine at most."""

    def prompt_ids(problem: RolloutTask) -> list[int]:
        return tokenizer.encode(problem.question)

    async def produce(
        problem: RolloutTask,
        index: int,
        engine: Engine,
        sampling: RolloutSampling,
        request_id: str,
    ) -> Trajectory:
        traj = Trajectory(group_id=problem.id, sample_index=index, prompt_ids=prompt_ids(problem))
        turns = 4 if problem.id.startswith("long") and index == sampling.n - 1 else 1
        for turn in range(turns):
            params = SamplingParams(max_tokens=4, seed=index * 10 + turn)
            out = await engine.generate(
                traj.prompt_ids + traj.response_ids, params, f"{request_id}/{turn}"
            )
            traj.turns += 1
            traj.append(
                out.token_ids, sampled=True, logprobs=out.logprobs, version=out.weights_version
            )
            if turn < turns - 1:
                await asyncio.sleep(TOOL_S)  # the tool
                traj.append([1, 2], sampled=False)
        traj.finish_reason = "answered"
        return traj

    policy = LeastRequestsPolicy(max_running_per_engine=cap)
    scheduler: Scheduler[Trajectory] = Scheduler([engine], SchedulerConfig(policy=policy))
    return RolloutService(scheduler, produce, lambda p: len(prompt_ids(p)))


async def _update(engine: Any) -> int:
    """A real weight update (the same weights again): the engine's version goes up by one."""
    await engine.update_weights(list(engine.model.state_dict().items()))
    return engine.weights_version


def test_groups_come_back_whole_and_the_slow_one_continues_on_the_new_weights(
    runner, engine, tokenizer
):
    async def main():
        service = _service(engine, tokenizer)
        reward = Reward()
        pool = RolloutPool(service, reward, groups_per_step=2, max_staleness=1)
        try:
            start = engine.weights_version
            pool.submit([RolloutTask("long", "q long"), RolloutTask("a", "q a")], N, CONFIG)
            pool.submit([RolloutTask("b", "q b")], N, CONFIG)
            first = await pool.next_batch()
            carried = pool.in_flight
            version = await _update(engine)
            pool.submit([RolloutTask("c", "q c")], N, CONFIG)
            second = await pool.next_batch()
            return start, first, carried, version, second, pool.in_flight, reward.graded
        finally:
            await pool.close()
            await service.scheduler.close()

    start, first, carried, version, second, left, graded = runner.run(main())
    # the two short groups, each whole; the long one (two of its samples already done) waits
    assert sorted(p.id for p in first.problems) == ["a", "b"]
    assert [(t.group_id, t.sample_index) for t in first.trajectories][:N] == [
        (first.problems[0].id, i) for i in range(N)
    ]
    assert len(first.trajectories) == 2 * N and first.carried == 1 and carried == 1
    assert first.failed_jobs == [] and first.step_metrics()["groups_trained"] == 2
    # after the update: the long group (due: started a step ago) and the new one
    assert sorted(p.id for p in second.problems) == ["c", "long"] and left == 0
    slow = [t for t in second.trajectories if t.group_id == "long"][-1]
    sampled = [v for v, m in zip(slow.versions, slow.loss_mask, strict=True) if m]
    assert sampled[0] == start and sampled[-1] == version == start + 1
    assert sampled == sorted(sampled)  # old tokens first, then the new weights' tokens
    assert slow.oldest_version == start and slow.turns == 4
    new = [t for t in second.trajectories if t.group_id == "c"]
    assert all(t.oldest_version == version for t in new)
    assert all(t.reward == 1.0 for t in first.trajectories + second.trajectories)
    assert sorted(graded) == sorted((p, i) for p in ("long", "a", "b", "c") for i in range(N))


def test_a_stale_group_is_kept_and_taken_when_due_before_fresher_finished_ones(
    runner, engine, tokenizer
):
    async def main():
        service = _service(engine, tokenizer)
        pool = RolloutPool(service, Reward(), groups_per_step=1, max_staleness=2)
        try:
            pool.submit([RolloutTask("long", "q"), RolloutTask("a", "q a")], N, CONFIG)
            first = await pool.next_batch()  # "a": the first to finish
            await _update(engine)
            pool.submit([RolloutTask("b", "q b")], N, CONFIG)
            await asyncio.sleep(TOOL_S)  # "b" finishes long before "long" does
            second = await pool.next_batch()  # "long" is not due yet: the oldest finished
            await _update(engine)
            pool.submit([RolloutTask("c", "q c")], N, CONFIG)
            await asyncio.sleep(TOOL_S)
            third = await pool.next_batch()  # "long" is due now: waited for, "c" stays
            return first, second, third, engine.weights_version
        finally:
            await pool.close()
            await service.scheduler.close()

    first, second, third, version = runner.run(main())
    assert [p.id for p in first.problems] == ["a"]
    assert [p.id for p in second.problems] == ["b"]
    assert [p.id for p in third.problems] == ["long"] and third.carried == 1
    assert len(third.trajectories) == N  # whole, none dropped, its tokens two versions old
    assert min(t.oldest_version for t in third.trajectories) == version - 2


def test_submissions_start_only_while_they_fit_and_a_pause_holds_the_next_turns(
    runner, engine, tokenizer
):
    async def main():
        service = _service(engine, tokenizer)
        pool = RolloutPool(service, Reward(), groups_per_step=1, max_staleness=1)
        try:
            pool.submit([RolloutTask("long1", "q")], N, CONFIG)
            pool.submit([RolloutTask("long2", "q")], N, CONFIG)
            pool.submit([RolloutTask("a", "q a")], N, CONFIG)  # over the capacity of 2
            counts = (pool.in_flight, pool.queued, pool.room)
            await asyncio.sleep(TOOL_S / 2)  # every first turn is done, the long ones' tools run
            async with pool.paused():
                calls = len(engine.calls)
                await asyncio.sleep(3 * TOOL_S)  # the tools return: the next turns wait
                held = len(engine.calls) - calls
                pending = [[p.id for p in q.problems] for q in pool.pending()]
            first = await pool.next_batch()  # a long one, then "a" starts
            second = await pool.next_batch()
            third = await pool.next_batch()
            return counts, held, pending, first, second, third
        finally:
            await pool.close()
            await service.scheduler.close()

    counts, held, pending, first, second, third = runner.run(main())
    assert counts == (2, 1, -1)
    assert held == 0  # paused: no engine call while the tools of the long samples returned
    assert pending == [["long1"], ["long2"], ["a"]]
    longs = [first, second]
    assert sorted(b.problems[0].id for b in longs) == ["long1", "long2"]
    assert all(len(b.trajectories) == N and b.trajectories[-1].turns == 4 for b in longs)
    assert [p.id for p in third.problems] == ["a"] and third.carried == 0


def test_one_group_per_problem_per_batch_and_close_stops_everything(runner, engine, tokenizer):
    async def main():
        service = _service(engine, tokenizer)
        pool = RolloutPool(service, Reward(), groups_per_step=2, max_staleness=2)
        try:
            pool.submit([RolloutTask("a", "q a")], N, CONFIG)
            pool.submit([RolloutTask("a", "q a")], N, CONFIG)  # drawn again by a later step
            once = await pool.next_batch()
            pool.submit([RolloutTask("long1", "q"), RolloutTask("long2", "q")], N, CONFIG)
            await asyncio.sleep(TOOL_S / 2)  # the long samples are running
            running = sum(s.running for s in service.scheduler.status())
            gone = await pool.close()
            await asyncio.sleep(0.05)
            after = sum(s.running for s in service.scheduler.status())
            empty = await pool.next_batch()
            return once, running, gone, after, empty, (pool.in_flight, pool.queued)
        finally:
            await pool.close()
            await service.scheduler.close()

    once, running, gone, after, empty, left = runner.run(main())
    assert [p.id for p in once.problems] == ["a"] and len(once.trajectories) == N
    assert once.carried == 1  # the second group of "a" waits for the next batch
    assert running >= 2 and gone == 3 and after == 0  # long1, long2 and the second "a"
    assert empty.problems == [] and left == (0, 0)


def test_submission_order_returns_the_oldest_batch_whole_while_the_next_one_runs(
    runner, engine, tokenizer
):
    async def main():
        service = _service(engine, tokenizer)
        pool = RolloutPool(
            service, Reward(), groups_per_step=2, max_staleness=1, order="submission"
        )
        try:
            pool.submit([RolloutTask("long", "q long"), RolloutTask("a", "q a")], N, CONFIG)
            pool.submit([RolloutTask("b", "q b")], N, CONFIG)  # the next step's batch
            first = await pool.next_batch()
            b_ready = len(pool.core.ready)  # "b" finished long before "long" did, and waited
            pool.submit([RolloutTask("c", "q c")], N, CONFIG)
            second = await pool.next_batch()
            left = pool.in_flight + pool.queued
            return first, b_ready, second, left
        finally:
            await pool.close()
            await service.scheduler.close()

    first, b_ready, second, left = runner.run(main())
    # finish order would have returned "a" and "b"; submission order waits for "long"
    assert (
        sorted(p.id for p in first.problems) == ["a", "long"] and len(first.trajectories) == 2 * N
    )
    assert b_ready == 1 and first.carried == 1
    # the next call stops where "b"'s submission ends (one group), though "c" could follow
    assert [p.id for p in second.problems] == ["b"] and second.carried == 1
    assert left == 1  # "c" is still in the pool for the step after
    with pytest.raises(ValueError, match="order must be"):
        RolloutPool(None, Reward(), groups_per_step=1, order="random")  # type: ignore[arg-type]


def test_a_pause_holds_no_job_where_the_scheduler_caps_them(runner, engine, tokenizer):
    """With one job per engine at most, a held job would keep the only place from the
    evaluation the pause makes room for: the pool's trajectories go on, the evaluation runs."""
    from rstar2_rollout import collect

    async def main():
        service = _service(engine, tokenizer, cap=1)
        pool = RolloutPool(service, Reward(), groups_per_step=1, max_staleness=1)
        try:
            pool.submit([RolloutTask("long", "q")], N, CONFIG)
            await asyncio.sleep(TOOL_S / 2)
            async with pool.paused():
                evaluation = collect(service, Reward(), [RolloutTask("e", "q e")], 2, CONFIG)
                got = await asyncio.wait_for(evaluation, timeout=60)
            taken = await pool.next_batch()
            return got, taken
        finally:
            await pool.close()
            await service.scheduler.close()

    got, taken = runner.run(main())
    assert len(got.trajectories) == 2 and [p.id for p in taken.problems] == ["long"]

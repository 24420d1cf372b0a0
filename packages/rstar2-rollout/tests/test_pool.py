"""`RolloutPool` on the transformers engine with the tiny model: groups come back whole as they
finish, the slow one stays in flight across a real weight update and its later turns carry the
new version, stale groups are dropped and counted, `drain` leaves nothing running.

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


class Grader:
    """Reward 1 for every trajectory that has sampled tokens; remembers what it graded."""

    def __init__(self) -> None:
        self.graded: list[tuple[str, int]] = []

    async def score(self, problem: RolloutTask, trajectory: Trajectory) -> float:
        self.graded.append((problem.id, trajectory.sample_index))
        trajectory.reward = float(trajectory.sampled_tokens > 0)
        return trajectory.reward


@pytest.fixture(scope="module")
def engine(tiny_model) -> Any:
    from transformers import AutoModelForCausalLM

    from rstar2_rollout.engines.hf import HFEngine

    return HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model), name="hf-0")


def _service(engine: Any, tokenizer: Any) -> RolloutService:
    """A service whose agent takes 4 turns for the last sample of a 'long*' problem, else 1."""

    def prompt_ids(problem: RolloutTask) -> list[int]:
        return tokenizer.encode(problem.question)

    async def produce(
        problem: RolloutTask, index: int, engine: Engine, sampling: RolloutSampling
    ) -> Trajectory:
        traj = Trajectory(group_id=problem.id, sample_index=index, prompt_ids=prompt_ids(problem))
        turns = 4 if problem.id.startswith("long") and index == sampling.n - 1 else 1
        for turn in range(turns):
            params = SamplingParams(max_tokens=4, seed=index * 10 + turn)
            out = await engine.generate(
                traj.prompt_ids + traj.response_ids, params, f"{problem.id}/{index}/{turn}"
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

    policy = LeastRequestsPolicy(max_running_per_engine=16)
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
        grader = Grader()
        pool = RolloutPool(service, grader, max_staleness=1)
        try:
            start = engine.weights_version
            pool.submit([RolloutTask("long", "q long"), RolloutTask("a", "q a")], N, CONFIG)
            pool.submit([RolloutTask("b", "q b")], N, CONFIG)
            first = await pool.next_batch(2, start)
            carried = (pool.in_flight, pool.waiting)
            version = await _update(engine)
            pool.submit([RolloutTask("c", "q c")], N, CONFIG)
            second = await pool.next_batch(2, version)
            return start, first, carried, version, second, pool.in_flight, grader.graded
        finally:
            await pool.close()
            await service.scheduler.close()

    start, first, carried, version, second, left, graded = runner.run(main())
    # the two short groups, each whole; the long one (two of its samples already done) waits
    assert sorted(p.id for p in first.problems) == ["a", "b"]
    assert [(t.group_id, t.sample_index) for t in first.trajectories][:N] == [
        (first.problems[0].id, i) for i in range(N)
    ]
    assert len(first.trajectories) == 2 * N and first.carried == 1 and carried == (1, 0)
    assert first.stale_dropped == 0 and first.failed_jobs == []
    # after the update: the long group and the new one
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


def test_a_group_older_than_max_staleness_is_dropped_and_counted(runner, engine, tokenizer):
    async def main():
        service = _service(engine, tokenizer)
        pool = RolloutPool(service, Grader(), max_staleness=0)
        try:
            pool.submit([RolloutTask("long", "q"), RolloutTask("a", "q a")], N, CONFIG)
            first = await pool.next_batch(1, engine.weights_version)
            version = await _update(engine)
            second = await pool.next_batch(1, version)  # only the stale long group is left
            return first, second
        finally:
            await pool.close()
            await service.scheduler.close()

    first, second = runner.run(main())
    assert [p.id for p in first.problems] == ["a"] and first.carried == 1
    assert second.problems == [] and second.trajectories == []
    assert second.stale_dropped == 1 and second.carried == 0


def test_one_group_per_problem_per_batch_and_drain_stops_everything(runner, engine, tokenizer):
    async def main():
        service = _service(engine, tokenizer)
        pool = RolloutPool(service, Grader(), max_staleness=2)
        try:
            pool.submit([RolloutTask("a", "q a")], N, CONFIG)
            pool.submit([RolloutTask("a", "q a")], N, CONFIG)  # drawn again by a later step
            once = await pool.next_batch(2, engine.weights_version)
            pool.submit([RolloutTask("long1", "q"), RolloutTask("long2", "q")], N, CONFIG)
            await asyncio.sleep(TOOL_S / 2)  # the long samples are running
            running = sum(s.running for s in service.scheduler.status())
            gone = await pool.drain()
            await asyncio.sleep(0.05)
            after = sum(s.running for s in service.scheduler.status())
            empty = await pool.next_batch(1, engine.weights_version)
            return once, running, gone, after, empty, (pool.in_flight, pool.waiting)
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
        pool = RolloutPool(service, Grader(), max_staleness=1, order="submission")
        try:
            pool.submit([RolloutTask("long", "q long"), RolloutTask("a", "q a")], N, CONFIG)
            pool.submit([RolloutTask("b", "q b")], N, CONFIG)  # the next step's batch
            first = await pool.next_batch(2, engine.weights_version)
            b_ready = pool.waiting  # "b" finished long before "long" did, and waited
            pool.submit([RolloutTask("c", "q c")], N, CONFIG)
            second = await pool.next_batch(2, engine.weights_version)
            left = (pool.in_flight, pool.waiting)
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
    assert left[0] + left[1] == 1  # "c" is still in the pool for the step after
    with pytest.raises(ValueError, match="order must be"):
        RolloutPool(None, Grader(), order="random")  # type: ignore[arg-type]

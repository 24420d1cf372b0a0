"""The pool trains on what it drew: driven as the trainer drives it (`RolloutPool.step` every
step, a blocking update and a weight push after it, a checkpoint inside `paused()`), with every
group taking time in proportion to its length, the groups trained have the mean length of the
groups drawn (within 5 %) and no finished group is discarded, for partial rollouts and
one-step-off steps, checkpointing every step and every 10 steps.

The source is the real one: `RolloutService` and `Scheduler` over the simulator's engines
(`research.simengine`: a model of vLLM V1's scheduler on a virtual clock, each token a decode
step), an agent whose turns write the lengths drawn for each sample (long-tailed, shared by the
samples of one problem as difficulty is), tool waits between turns, the pool and its core.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any, Literal

import pytest

from rstar2_rollout import (
    RolloutConfig,
    RolloutPool,
    RolloutTask,
    SchedulerConfig,
    Trajectory,
)
from rstar2_rollout.engine import Engine, SamplingParams
from rstar2_rollout.research.simengine import EngineModel, SimEngine, run_virtual
from rstar2_rollout.scheduler import Scheduler
from rstar2_rollout.service import RolloutSampling, RolloutService

B, N, STEPS = 8, 4, 40  # groups a step, samples a group, steps
BUDGET = 4096
CONFIG = RolloutConfig(max_response_tokens=BUDGET, max_turns=4)
TRAIN_S, PUSH_S, SAVE_S = 20.0, 2.0, 10.0  # virtual seconds


def turns_of(problem: str, index: int) -> list[int]:
    """The tokens each turn of sample `index` writes: a problem's difficulty (lognormal, shared
    by its samples) times the sample's own draw, split over 1-3 turns."""
    difficulty = random.Random(problem).lognormvariate(0.0, 0.8)
    rng = random.Random(f"{problem}/{index}")
    total = min(BUDGET - 8, max(8, round(400 * difficulty * rng.lognormvariate(0.0, 0.3))))
    turns = rng.choice([1, 2, 3])
    return [total // turns + (1 if t < total % turns else 0) for t in range(turns)]


def length(problem: str) -> float:
    """A group's length: the mean tokens its samples write."""
    return statistics.fmean(sum(turns_of(problem, i)) for i in range(N))


class Reward:
    async def score(self, problem: RolloutTask, trajectory: Trajectory) -> float:
        trajectory.reward = 1.0
        return 1.0


def source(engines: list[SimEngine], script: dict[str, int]) -> RolloutService:
    """The rollout service over simulated engines; its agent writes each turn's drawn length
    (the engine's script) and waits 0.5 virtual seconds on a tool between turns."""

    async def produce(
        problem: RolloutTask, index: int, engine: Engine, sampling: RolloutSampling, rid: str
    ) -> Trajectory:
        traj = Trajectory(group_id=problem.id, sample_index=index, prompt_ids=[1] * 64)
        turns = turns_of(problem.id, index)
        for turn, tokens in enumerate(turns):
            script[f"{rid}/{turn}"] = tokens
            left = sampling.max_response_tokens - len(traj.response_ids)
            params = SamplingParams(max_tokens=left, logprobs=False)
            out = await engine.generate(
                traj.prompt_ids + traj.response_ids, params, f"{rid}/{turn}"
            )
            if out.finish_reason == "error":
                raise RuntimeError(out.error)
            traj.append(out.token_ids, sampled=True)
            traj.turns += 1
            if turn < len(turns) - 1:
                await asyncio.sleep(0.5)
        traj.finish_reason = "answered"
        return traj

    scheduler: Scheduler[Trajectory] = Scheduler(list(engines), SchedulerConfig())
    return RolloutService(scheduler, produce, lambda p: 64, engines=engines)


def drive(
    order: Literal["finish", "submission"], max_staleness: int, checkpoint_every: int
) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        script: dict[str, int] = {}
        model = EngineModel(kv_tokens=160_000, max_num_seqs=64)
        engines = [SimEngine(f"e{i}", model, script) for i in range(2)]
        service = source(engines, script)
        pool: RolloutPool[RolloutTask] = RolloutPool(
            service, Reward(), groups_per_step=B, max_staleness=max_staleness, order=order
        )
        count = 0

        def draw() -> list[RolloutTask]:
            nonlocal count
            count += B
            return [RolloutTask(f"q{k}", "q") for k in range(count - B, count)]

        drawn: list[str] = []
        trained: list[str] = []
        try:
            for step in range(1, STEPS + 1):
                batch, asked = await pool.step(draw(), N, CONFIG, ahead=lambda _k: (draw(), CONFIG))
                drawn += [p.id for p in asked]
                trained += [p.id for p in batch.problems]
                assert len(batch.trajectories) == N * len(batch.problems)  # whole groups
                await asyncio.sleep(TRAIN_S)  # the update
                for engine in engines:
                    engine.pause(PUSH_S)  # the weight load between engine steps
                await asyncio.sleep(PUSH_S)
                if step % checkpoint_every == 0:
                    async with pool.paused():
                        await asyncio.sleep(SAVE_S)
            left = [p.id for q in pool.pending() for p in q.problems]
        finally:
            await pool.close()
            await service.scheduler.close()
        return {"drawn": drawn, "trained": trained, "left": left}

    return run_virtual(main())


@pytest.mark.parametrize("checkpoint_every", [1, 10])
@pytest.mark.parametrize(
    ("order", "max_staleness"),
    [("finish", 1), ("finish", 2), ("submission", 1)],
    ids=["partial-1", "partial-2", "one_step_off"],
)
def test_the_groups_trained_are_the_groups_drawn(order, max_staleness, checkpoint_every):
    got = drive(order, max_staleness, checkpoint_every)
    drawn, trained, left = got["drawn"], got["trained"], got["left"]
    assert len(trained) == STEPS * B and len(set(trained)) == len(trained)
    # nothing discarded: every group drawn was trained or is still in the pool at the end
    assert sorted(trained + left) == sorted(drawn)
    assert len(left) == max_staleness * B
    drawn_mean = statistics.fmean(length(p) for p in drawn)
    trained_mean = statistics.fmean(length(p) for p in trained)
    assert trained_mean == pytest.approx(drawn_mean, rel=0.05)

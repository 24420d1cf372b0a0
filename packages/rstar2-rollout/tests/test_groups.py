"""The core under `collect` and `RolloutPool` (`GradedGroups`): one problem in flight in two
submissions never sends a request id that is already running; failed jobs are formatted once
and cut a submission at `max_failures`; a source that raises ends its groups with the error;
`collect` and `next_batch` hand back one shape of step metrics.

The engine is the `ScriptedModel` of conftest.py (what the model says is fixed; the service,
scheduler, agent loop, sandbox and core are the real ones)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from rstar2_rollout import (
    GradedGroups,
    RolloutConfig,
    RolloutPool,
    RolloutTask,
    Trajectory,
    collect,
    one_engine_service,
)
from rstar2_rollout.engine import Generation, SamplingParams
from rstar2_rollout.service import RolloutResult, RolloutSampling

ANSWER = "<answer>\\boxed{42}</answer></reason>"
CONFIG = RolloutConfig(temperature=0, max_turns=2, max_response_tokens=64)


class Reward:
    """Reward 1 when the final answer holds 42."""

    async def score(self, problem: RolloutTask, trajectory: Trajectory) -> float:
        trajectory.reward = float("42" in (trajectory.final_answer or ""))
        return trajectory.reward


class Running:
    """Records the request ids in flight at once; refuses one already running, as vLLM does."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.name = engine.name
        self.running: set[str] = set()
        self.seen: list[str] = []

    def kv_capacity(self) -> Any:
        return self.engine.kv_capacity()

    async def update_weights(self, named_tensors: Any) -> None:
        await self.engine.update_weights(named_tensors)

    async def close(self) -> None:
        await self.engine.close()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if request_id in self.running:
            return Generation([], finish_reason="error", error=f"{request_id!r} is running")
        self.running.add(request_id)
        self.seen.append(request_id)
        try:
            return await self.engine.generate(prompt_ids, params, request_id)
        finally:
            self.running.discard(request_id)


def test_one_problem_in_two_submissions_fails_no_request(runner, sandbox, tokenizer, scripted):
    engine = Running(scripted(tokenizer, {"p": [ANSWER]}, delay_s=0.05))
    service = one_engine_service(engine, sandbox, tokenizer, CONFIG)

    async def main():
        core: GradedGroups[RolloutTask] = GradedGroups(service, Reward())
        first = core.submit([RolloutTask("p", "q")], 3, CONFIG)
        second = core.submit([RolloutTask("p", "q")], 3, CONFIG)  # in flight at once
        await core.settled(first)
        await core.settled(second)
        return first, second, core

    first, second, core = runner.run(main())
    runner.run(service.scheduler.close())
    assert first.failed_jobs == [] and second.failed_jobs == []
    assert [len(s.trajectories) for s in (first, second)] == [3, 3]
    assert len(engine.seen) == 6 and len(set(engine.seen)) == 6  # every request id its own
    assert sum("@" in r for r in engine.seen) == 3  # the second stream's, while the first ran
    assert [len(g.trajectories) for g in core.ready] == [3, 3] and core.finished == 2


def test_failed_jobs_are_counted_once_and_cut_the_submission(runner, sandbox, tokenizer, scripted):
    engine = scripted(tokenizer, {"ok": [ANSWER]})  # "bad" has no script: the engine raises
    service = one_engine_service(engine, sandbox, tokenizer, CONFIG)
    problems = [RolloutTask("bad", "q"), RolloutTask("ok", "q")]

    got = runner.run(collect(service, Reward(), problems, 2, CONFIG))
    cut = runner.run(collect(service, Reward(), problems, 2, CONFIG, max_failures=1))
    runner.run(service.scheduler.close())
    assert [t.group_id for t in got.trajectories] == ["ok", "ok"]
    assert len(got.failed_jobs) == 2 and got.failed_jobs[0].startswith("bad#")
    assert "KeyError" in got.failed_jobs[0] and got.failed_groups == 1
    assert got.step_metrics()["groups"] == ["ok"] and got.step_metrics()["groups_failed"] == 1
    assert len(cut.failed_jobs) == 1  # the rest cancelled after the first failure


class Broken:
    """A source whose stream raises after its first trajectory."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def generate(
        self, problems: Sequence[RolloutTask], sampling: RolloutSampling
    ) -> AsyncIterator[RolloutResult]:
        async for result in self.service.generate(problems, sampling):
            yield result
            raise ConnectionError("the rollout service went away")


def test_a_source_that_raises_ends_its_groups_with_the_error(runner, sandbox, tokenizer, scripted):
    engine = scripted(tokenizer, {"a": [ANSWER], "b": [ANSWER]})
    service = one_engine_service(engine, sandbox, tokenizer, CONFIG)
    problems = [RolloutTask("a", "q"), RolloutTask("b", "q")]

    async def pooled():
        pool = RolloutPool(Broken(service), Reward(), groups_per_step=2)
        try:
            pool.submit(problems, 2, CONFIG)
            return await pool.next_batch()
        finally:
            await pool.close()

    with pytest.raises(ConnectionError, match="went away"):
        runner.run(collect(Broken(service), Reward(), problems, 2, CONFIG))
    with pytest.raises(ConnectionError, match="went away"):
        runner.run(pooled())
    runner.run(service.scheduler.close())


def test_collect_and_the_pool_report_one_shape_of_step_metrics(
    runner, sandbox, tokenizer, scripted
):
    engine = scripted(tokenizer, {"a": [ANSWER], "b": [ANSWER]})
    service = one_engine_service(engine, sandbox, tokenizer, CONFIG)
    problems = [RolloutTask("a", "q"), RolloutTask("b", "q")]

    async def pooled():
        pool = RolloutPool(service, Reward(), groups_per_step=2, order="submission")
        try:
            pool.submit(problems, 2, CONFIG)
            return await pool.next_batch()
        finally:
            await pool.close()

    whole = runner.run(collect(service, Reward(), problems, 2, CONFIG))
    taken = runner.run(pooled())
    runner.run(service.scheduler.close())
    a, b = whole.step_metrics(), taken.step_metrics()
    assert a.keys() == b.keys()
    same = ("groups", "groups_trained", "groups_carried", "groups_failed", "failed_jobs")
    assert [a[k] for k in same] == [b[k] for k in same] == [["a", "b"], 2, 0, 0, 0]
    assert [(t.group_id, t.sample_index) for t in taken.trajectories] == [
        (t.group_id, t.sample_index) for t in whole.trajectories
    ]


def test_a_cancelled_collect_closes_its_stream(runner, sandbox, tokenizer, scripted):
    engine = scripted(tokenizer, {"a": [ANSWER]}, delay_s=5.0)
    service = one_engine_service(engine, sandbox, tokenizer, CONFIG)

    async def main():
        task = asyncio.create_task(collect(service, Reward(), [RolloutTask("a", "q")], 2, CONFIG))
        await asyncio.sleep(0.2)
        running = sum(s.running for s in service.scheduler.status())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        return running, sum(s.running for s in service.scheduler.status())

    before, after = runner.run(main())
    runner.run(service.scheduler.close())
    assert before == 2 and after == 0

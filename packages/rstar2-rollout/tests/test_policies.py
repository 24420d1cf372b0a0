"""Every scheduling policy behind the one `Admission` interface: each config spelling builds and
runs a batch to the end on simulated engines; the peers place as their frameworks do; the
forecast policy queues centrally and learns lengths (Kaplan-Meier over finished and running)."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_rollout.research.config import ForecastPolicy, ResearchSchedulerConfig
from rstar2_rollout.research.forecast import lengths
from rstar2_rollout.research.simulate import (
    EngineModel,
    SimEngine,
    TrajectorySpec,
    run_trajectory,
    run_virtual,
)
from rstar2_rollout.scheduler import Job, Scheduler

KINDS = [
    "forecast",
    "kv_progress",
    "kv_aware",
    "static",
    "least_requests",
    "power_of_two",
    "cache_aware",
    "least_tokens",
]


def spec(key: str, prompt: int, turns: tuple[int, ...]) -> TrajectorySpec:
    n = len(turns) - 1
    return TrajectorySpec(key, prompt, turns, (10,) * n, (0.2,) * n)


def play(kind: str, engines: list[SimEngine], specs: list[TrajectorySpec]):
    config = ResearchSchedulerConfig.model_validate({"policy": {"kind": kind}})

    async def main():
        sched: Scheduler[int] = Scheduler(engines, config)
        jobs = [
            Job(lambda e, s=s: run_trajectory(e, s), s.prompt_tokens, 1_000, group=s.group)
            for s in specs
        ]
        return await sched.run(jobs)

    return run_virtual(main())


@pytest.mark.parametrize("kind", KINDS)
def test_every_policy_runs_a_batch_to_the_end(kind: str) -> None:
    engines = [SimEngine(f"e{i}", EngineModel(kv_tokens=8_000)) for i in range(3)]
    specs = [spec(f"p{p}-s{i}", 100 + p, (80, 120, 60)) for p in range(4) for i in range(6)]
    results = play(kind, engines, specs)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert [r.value for r in results] == [s.prompt_tokens + 280 for s in specs]
    assert sum(e.stats.decoded_tokens for e in engines) == 260 * len(specs)


def test_cache_aware_keeps_a_problem_on_one_engine_while_the_load_is_balanced() -> None:
    engines = [SimEngine(f"e{i}", EngineModel(kv_tokens=50_000)) for i in range(4)]
    specs = [spec(f"p{p}-s{i}", 100, (50,)) for p in range(4) for i in range(4)]
    results = play("cache_aware", engines, specs)
    where: dict[str, set[str | None]] = {}
    for s, r in zip(specs, results, strict=True):
        where.setdefault(s.group, set()).add(r.engine)
    assert all(len(v) == 1 for v in where.values())  # prompt cached there: same engine
    assert len({next(iter(v)) for v in where.values()}) == 4  # new prompts: emptiest tree


def test_forecast_holds_jobs_in_its_queue_until_an_engine_has_room() -> None:
    # prior: half the 4,000-token budget, so 100 + 2,000 tokens a job: 4 fit in 9,000
    engine = SimEngine("e0", EngineModel(kv_tokens=9_000))
    seen: list[int] = []

    async def main():
        sched: Scheduler[int] = Scheduler(
            [engine], ResearchSchedulerConfig(policy=ForecastPolicy())
        )

        async def job(e):
            seen.append(sched.status()[0].running)
            await asyncio.sleep(1.0)
            return 0

        return await sched.run([Job(job, 100, 4_000) for _ in range(10)])

    results = run_virtual(main())
    assert all(r.ok for r in results)
    assert max(seen) == 4
    starts = sorted(r.started_at or 0.0 for r in results)
    assert starts[3] == 0.0 and starts[4] > 0.0  # the fifth waited in the scheduler


def test_lengths_by_kaplan_meier() -> None:
    assert lengths([], [], 10) is None
    assert lengths([2, 4], [], 10) == pytest.approx((3.0, 10.0))
    # one finished at 2, one running past 3: half the mass at 2, the rest at the budget
    assert lengths([2], [3], 10) == pytest.approx((6.0, 52.0))


def test_forecast_on_an_engine_that_reports_no_capacity_runs_up_to_its_max_running() -> None:
    class Blind(SimEngine):
        def kv_capacity(self):  # type: ignore[override]
            return None

    engine = Blind("e0", EngineModel(kv_tokens=50_000, max_num_seqs=3))
    policy = ForecastPolicy()

    async def main():
        sched: Scheduler[int] = Scheduler([engine], ResearchSchedulerConfig(policy=policy))
        jobs = [
            Job(lambda e, i=i: run_trajectory(e, spec(f"j{i}", 50, (20,))), 50, 100)
            for i in range(7)
        ]
        return await sched.run(jobs)

    results = run_virtual(main())
    assert all(r.ok for r in results)
    starts = sorted(r.started_at or 0.0 for r in results)
    assert starts[2] == 0.0 and starts[3] > 0.0  # three at once, the rest queued centrally

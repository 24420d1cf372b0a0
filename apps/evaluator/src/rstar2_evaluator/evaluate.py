"""One evaluation run, top to bottom: problems, model, run directory, rollouts, grading, summary.

The same function as training: `rstar2_rollout.collect` over a `RolloutService` on the one engine
(its scheduler places every sample, the agent loop runs it with the paper's chat format and
tool-call parser), the code tool in a sandbox (`LocalSandbox` in this process, or a sandbox
server), and rstar2-verify's `Scorer` with the config's reward rule (`config.reward`: the whole
response by default; `reward.graded=answer_block reward.truncated=zero` is rstar2-train's, so its
held-out accuracy is reproduced exactly, by construction). Each sample's seed derives from (run seed, problem id, sample index,
turn), so a resumed run draws what the uninterrupted one would have.

Order matters for "nothing half-written looks finished": the benchmark is loaded and the model
checked (an endpoint must answer) before the run directory is opened; each sample is recorded
once it is generated and graded; a sample that failed for the engine or the tool is not recorded
(a rerun retries it); the summary is written last, and only when every sample is recorded.

Not covered: several engines (one engine serves all samples here; `concurrency` caps the
samples it runs at once).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from rstar2_curriculum import Problem, load_benchmark, normalise_answer
from rstar2_evaluator.config import FREE_FORM, EvalConfig
from rstar2_evaluator.metrics import Summary, summarize
from rstar2_evaluator.model import check_model, load_tokenizer
from rstar2_evaluator.record import SampleRecord
from rstar2_evaluator.report import progress_bar
from rstar2_evaluator.store import RunStore
from rstar2_evaluator.tool import check_tool
from rstar2_rollout import (
    Engine,
    EngineConfig,
    RewardConfig,
    RolloutConfig,
    Trajectory,
    build_engine,
    collect,
    one_engine_service,
)
from rstar2_sandbox import Sandbox, open_sandbox
from rstar2_verify import Grade, Scorer, Verifier, is_correct


class EvalFailed(RuntimeError):
    """Some samples could not be produced; the finished ones are kept for a rerun."""


def answer_key(answer: str | None) -> str | None:
    """The form of an extracted answer that majority vote counts ('12.0', '$12$' -> '12')."""
    if answer is None:
        return None
    key = re.sub(r"\s+", "", normalise_answer(answer))
    return key or None


def rollout_config(config: EvalConfig, context: int | None) -> RolloutConfig:
    """The agent loop's settings: the config's sampling protocol and its tool limits."""
    loop = RolloutConfig(
        max_context_tokens=context,
        tool_timeout_s=config.tool_timeout_s,
        max_tool_response_chars=config.max_tool_response_chars,
        max_concurrency=config.concurrency,
        system_prompt=config.system_prompt,
    )
    return config.apply(loop)


def to_record(
    problem: Problem, traj: Trajectory, text: str, grade: Grade | None, seconds: float
) -> SampleRecord:
    """A finished trajectory, its grade (None: nothing to grade) and verdict, as one line."""
    extracted = grade.extracted if grade is not None else None
    return SampleRecord(
        problem_id=problem.id,
        sample_index=traj.sample_index,
        reference=problem.answer,
        answer=extracted,
        answer_key=answer_key(extracted),
        correct=is_correct(traj.reward),
        finish_reason=traj.finish_reason or "error",
        response_tokens=len(traj.response_ids),
        sampled_tokens=traj.sampled_tokens,
        turns=traj.turns,
        tool_calls={k: v for k, v in traj.tool_outcome_counts.items() if v},
        seconds=round(seconds, 3),
        response=text,
    )


async def evaluate(
    engine: Engine,
    sandbox: Sandbox,
    verifier: Verifier,
    tokenizer: Any,
    todo: Sequence[tuple[Problem, int]],
    config: RolloutConfig,
    store: RunStore,
    *,
    max_failures: int,
    reward: RewardConfig = FREE_FORM,
    on_done: Callable[[SampleRecord], None] | None = None,
) -> list[str]:
    """Roll out, grade and record every (problem, sample index) in `todo`; return the failures."""
    service = one_engine_service(engine, sandbox, tokenizer, config)

    def record(problem: Problem, traj: Trajectory, grade: Grade | None) -> None:
        text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        seconds = traj.timings.generate_s + traj.timings.tool_s  # the sample's own time
        sample = to_record(problem, traj, text, grade, seconds)
        store.append(sample)
        if on_done is not None:
            on_done(sample)

    try:
        collected = await collect(
            service,
            Scorer(verifier, reward, tokenizer),
            [],
            config.n,
            config,
            samples=todo,
            on_graded=record,
            max_failures=max_failures,
        )
    finally:
        await service.scheduler.close()
    return collected.failed_jobs


async def _run(
    config: EvalConfig,
    engine_config: EngineConfig,
    context: int | None,
    tokenizer: Any,
    todo: list[tuple[Problem, int]],
    store: RunStore,
    on_done: Callable[[SampleRecord], None],
) -> list[str]:
    rollout = rollout_config(config, context)
    async with AsyncExitStack() as stack:
        sandbox = await stack.enter_async_context(open_sandbox(config.tool, config.sandbox))
        verifier = Verifier.local(config.verify)
        stack.push_async_callback(verifier.close)
        engine = build_engine(engine_config, tokenizer=tokenizer)
        stack.push_async_callback(engine.close)
        return await evaluate(
            engine,
            sandbox,
            verifier,
            tokenizer,
            todo,
            rollout,
            store,
            max_failures=config.max_failures,
            reward=config.reward,
            on_done=on_done,
        )


def run_evaluation(
    config: EvalConfig, console: Console, *, progress: bool = True
) -> tuple[Summary, Path]:
    """Evaluate (or resume) one run; return its summary and directory."""
    problems = load_benchmark(config.benchmark)
    engine_config, context = check_model(config)
    check_tool(config)
    tokenizer = load_tokenizer(config)
    run_dir = config.run_dir()
    with RunStore.open(run_dir, config.model_dump(mode="json"), config.identity()) as store:
        wanted = {(p.id, i) for p in problems for i in range(config.samples)}
        done = {key: r for key, r in store.finished().items() if key in wanted}
        todo = [(p, i) for p in problems for i in range(config.samples) if (p.id, i) not in done]
        if todo:
            store.discard_summary()
            correct = sum(r.correct for r in done.values())
            bar = progress_bar(console) if progress else None
            task = None
            if bar is not None:
                bar.start()
                task = bar.add_task(
                    Path(config.benchmark.name).stem,
                    total=len(wanted),
                    completed=len(done),
                    resumed=len(done),
                    pass_rate=f"{correct / len(done):.3f}" if done else "-",
                )

            def on_done(record: SampleRecord) -> None:
                nonlocal correct
                done[record.key] = record
                correct += record.correct
                if bar is not None and task is not None:
                    bar.update(task, advance=1, pass_rate=f"{correct / len(done):.3f}")

            try:
                failures = asyncio.run(
                    _run(config, engine_config, context, tokenizer, todo, store, on_done)
                )
            finally:
                if bar is not None:
                    bar.stop()
            missing = len(wanted) - len(done)
            if missing:
                first = failures[0] if failures else "stopped early"
                raise EvalFailed(
                    f"{missing} of {len(wanted)} samples not finished ({len(failures)} failed, "
                    f"first: {first[:300]}); {len(done)} are kept in {run_dir}, rerun the same "
                    "command to resume"
                )
        ordered = [done[(p.id, i)] for p in problems for i in range(config.samples)]
        summary = summarize(ordered, config.pass_k)
        store.write_summary(summary)
    return summary, run_dir

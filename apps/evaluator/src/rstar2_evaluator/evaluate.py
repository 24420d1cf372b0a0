"""One evaluation run, top to bottom: problems, model, run directory, rollouts, grading, summary.

The same parts as training: rstar2-rollout's `run_agent` (the paper's chat format and tool-call
parser) over an `Engine`, the code tool in a sandbox (`LocalSandbox` in this process, or a
sandbox server), and rstar2-verify's `Grader`. Each sample's seed derives from (run seed,
problem id, sample index, turn), so a resumed run draws what the uninterrupted one would have.

Order matters for "nothing half-written looks finished": the benchmark is loaded and the model
checked (an endpoint must answer) before the run directory is opened; each sample is recorded
once it is generated and graded; a sample that failed for the engine or the tool is not recorded
(a rerun retries it); the summary is written last, and only when every sample is recorded.

Not covered: several engines behind a scheduler (one engine serves all samples here).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from rstar2_curriculum import Problem, normalise_answer
from rstar2_evaluator.benchmarks import load_benchmark
from rstar2_evaluator.config import EvalConfig
from rstar2_evaluator.metrics import Summary, summarize
from rstar2_evaluator.model import check_model, load_tokenizer
from rstar2_evaluator.record import SampleRecord
from rstar2_evaluator.report import progress_bar
from rstar2_evaluator.store import RunStore
from rstar2_evaluator.tool import check_tool, open_tool, outage
from rstar2_rollout import (
    ChatFormat,
    Engine,
    EngineConfig,
    RolloutConfig,
    Trajectory,
    build_engine,
    run_agent,
    system_prompt,
)
from rstar2_sandbox import LocalSandbox, SandboxClient
from rstar2_verify import Grader


class EvalFailed(RuntimeError):
    """Some samples could not be produced; the finished ones are kept for a rerun."""


def answer_key(answer: str | None) -> str | None:
    """The form of an extracted answer that majority vote counts ('12.0', '$12$' -> '12')."""
    if answer is None:
        return None
    key = re.sub(r"\s+", "", normalise_answer(answer))
    return key or None


def rollout_config(config: EvalConfig, context: int | None) -> RolloutConfig:
    return RolloutConfig(
        n=config.samples,
        temperature=config.temperature,
        top_p=config.top_p,
        max_turns=config.max_turns,
        max_response_tokens=config.max_response_tokens,
        max_context_tokens=context,
        tool_timeout_s=config.tool_timeout_s,
        max_concurrency=config.concurrency,
        seed=config.seed,
        system_prompt=config.system_prompt,
    )


def to_record(
    problem: Problem, traj: Trajectory, text: str, grade: Any, seconds: float
) -> SampleRecord:
    """A finished trajectory and its grade, as one line of samples.jsonl."""
    return SampleRecord(
        problem_id=problem.id,
        sample_index=traj.sample_index,
        reference=problem.answer,
        answer=grade.extracted,
        answer_key=answer_key(grade.extracted),
        correct=grade.correct,
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
    sandbox: LocalSandbox | SandboxClient,
    grader: Grader,
    tokenizer: Any,
    todo: Sequence[tuple[Problem, int]],
    config: RolloutConfig,
    store: RunStore,
    *,
    max_failures: int,
    on_done: Callable[[SampleRecord], None] | None = None,
) -> list[str]:
    """Roll out, grade and record every (problem, sample index) in `todo`; return the failures."""
    fmt = ChatFormat(tokenizer, system_prompt(style=config.system_prompt))
    slots = asyncio.Semaphore(config.max_concurrency)
    failures: list[str] = []
    stop = asyncio.Event()

    async def one(problem: Problem, index: int) -> None:
        async with slots:
            if stop.is_set():
                return
            started = time.perf_counter()
            traj = await run_agent(engine, sandbox, fmt, problem, config, sample_index=index)
            why = traj.error if traj.finish_reason == "error" else await outage(sandbox, traj)
            if why:
                failures.append(f"{problem.id}#{index}: {why}")
                if len(failures) >= max_failures:
                    stop.set()
                return
            text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
            grade = await grader.agrade(text, problem.answer)
            record = to_record(problem, traj, text, grade, time.perf_counter() - started)
            store.append(record)
            if on_done is not None:
                on_done(record)

    await asyncio.gather(*(one(problem, index) for problem, index in todo))
    return failures


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
        sandbox = await stack.enter_async_context(open_tool(config))
        grader = stack.enter_context(Grader(config.verify))
        engine = build_engine(engine_config, tokenizer=tokenizer)
        stack.push_async_callback(engine.close)
        return await evaluate(
            engine,
            sandbox,
            grader,
            tokenizer,
            todo,
            rollout,
            store,
            max_failures=config.max_failures,
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

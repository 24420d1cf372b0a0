"""One evaluation run, top to bottom: problems, model, run directory, samples, scores, summary.

Sampling follows the benchmark's kind (`catalog.py`). The agent kinds (maths, multiple choice,
code) go through the same function as training: `rstar2_rollout.collect` over a
`RolloutService` on the one engine (its scheduler places every sample, the agent loop runs it
with the paper's chat format and tool-call parser), the code tool in a sandbox (`LocalSandbox`
in this process, or a sandbox server; none offered with `use_tool=false`, when the prompt has no
tool schema and a tool call is text), graded by rstar2-verify's `Scorer` with the config's
reward rule (`config.reward`: the whole response by default; `reward.graded=answer_block
reward.truncated=zero` is rstar2-train's, so its held-out accuracy is reproduced exactly, by
construction), in its `choice` kind for multiple choice, or by the benchmark's `Checker`
(LiveCodeBench's tests in the same sandbox). A multiple-choice sample sees its problem's options
in its own seeded order (`choice_variant`), recorded in the sample's `details`. The chat kinds
(IFEval, BFCL, Arena-Hard) are sampled with the model's chat template and checked by their
reference checkers (`chat.py`). Each sample's seed derives from (run seed, problem id, sample
index, turn), so a resumed run draws what the uninterrupted one would have.

Order matters for "nothing half-written looks finished": the benchmark is loaded and the model
checked (an endpoint must answer) before the run directory is opened; each sample is recorded
once it is generated and scored; a sample that failed for the engine, the tool or a checker's
outage is not recorded (a rerun retries it); the summary is written last, and only when every
sample is recorded. The summary's headline is pass@1 (avg@n) for the answer-graded kinds and
the checker's metric otherwise; a checker's metrics are recomputed from the records.

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

from rstar2_curriculum import Problem, choice_variant, load_benchmark, normalise_answer
from rstar2_evaluator import catalog
from rstar2_evaluator.chat import sample_and_check
from rstar2_evaluator.config import FREE_FORM, EvalConfig
from rstar2_evaluator.metrics import Summary, summarize
from rstar2_evaluator.model import check_model, load_tokenizer
from rstar2_evaluator.record import SampleRecord
from rstar2_evaluator.report import progress_bar
from rstar2_evaluator.scorers import Checker, CheckFailed, Response, Verdict, reply_text
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
        tool=config.use_tool,
    )
    return config.apply(loop)


def to_record(
    problem: Problem, traj: Trajectory, text: str, outcome: Grade | Verdict | None, seconds: float
) -> SampleRecord:
    """A finished trajectory, its grade or checker verdict (None: nothing to grade) and verdict,
    as one line. A multiple-choice sample is recorded under its original problem, with the
    option order it saw."""
    details: dict[str, Any] = {}
    score = None
    if isinstance(outcome, Verdict):
        extracted, score, details = outcome.answer, outcome.score, dict(outcome.details)
    else:
        extracted = outcome.extracted if outcome is not None else None
    if "problem_id" in problem.metadata:  # a choice variant
        details["order"] = problem.metadata["order"]
    return SampleRecord(
        problem_id=str(problem.metadata.get("problem_id", problem.id)),
        sample_index=traj.sample_index,
        reference=problem.answer,
        answer=extracted,
        answer_key=answer_key(extracted) if score is None else extracted,
        correct=is_correct(traj.reward),
        finish_reason=traj.finish_reason or "error",
        response_tokens=len(traj.response_ids),
        sampled_tokens=traj.sampled_tokens,
        turns=traj.turns,
        tool_calls={k: v for k, v in traj.tool_outcome_counts.items() if v},
        seconds=round(seconds, 3),
        response=text,
        score=score,
        details=details,
    )


class CheckedGrader:
    """A `Checker` as `collect`'s grader: the trajectory's reply checked, its reward the score.
    A `CheckFailed` (an outage, not the model) comes back as the failure's text."""

    def __init__(self, checker: Checker, tokenizer: Any) -> None:
        self.checker = checker
        self.tokenizer = tokenizer

    async def score(self, problem: Problem, trajectory: Trajectory) -> Verdict | str:
        raw = self.tokenizer.decode(trajectory.response_ids, skip_special_tokens=False)
        reason = trajectory.finish_reason or "error"
        response = Response(text=reply_text(raw), raw=raw, finish_reason=reason)
        try:
            verdict = await self.checker.check(problem, response)
        except CheckFailed as error:
            trajectory.reward = 0.0
            return f"{problem.id}#{trajectory.sample_index}: {error}"
        trajectory.reward = verdict.score
        return verdict


async def evaluate(
    engine: Engine,
    sandbox: Sandbox | None,
    verifier: Verifier,
    tokenizer: Any,
    todo: Sequence[tuple[Problem, int]],
    config: RolloutConfig,
    store: RunStore,
    *,
    max_failures: int,
    reward: RewardConfig = FREE_FORM,
    on_done: Callable[[SampleRecord], None] | None = None,
    choice: bool = False,
    checker: Checker | None = None,
) -> list[str]:
    """Roll out, score and record every (problem, sample index) in `todo`; return the failures.
    Scored by rstar2-verify (its choice kind with `choice`), or by `checker`."""
    service = one_engine_service(engine, sandbox, tokenizer, config)
    grader: Any = (
        CheckedGrader(checker, tokenizer)
        if checker is not None
        else Scorer(verifier, reward, tokenizer, "choice" if choice else "math")
    )
    outages: list[str] = []

    def record(problem: Problem, traj: Trajectory, outcome: Grade | Verdict | str | None) -> None:
        if isinstance(outcome, str):  # the checker could not score it: not the model's
            outages.append(outcome)
            return
        text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        seconds = traj.timings.generate_s + traj.timings.tool_s  # the sample's own time
        sample = to_record(problem, traj, text, outcome, seconds)
        store.append(sample)
        if on_done is not None:
            on_done(sample)

    try:
        collected = await collect(
            service,
            grader,
            [],
            config.n,
            config,
            samples=todo,
            on_graded=record,
            max_failures=max_failures,
        )
    finally:
        await service.scheduler.close()
    return [*collected.failed_jobs, *outages]


def record_sample(
    store: RunStore, on_done: Callable[[SampleRecord], None], record: SampleRecord
) -> None:
    store.append(record)
    on_done(record)


def needs_sandbox(kind: str, config: EvalConfig) -> bool:
    """The tool's sandbox runs the tool calls, and LiveCodeBench's tests whatever `use_tool`."""
    return kind == "code" or (kind in ("math", "choice") and config.use_tool)


async def _run(
    config: EvalConfig,
    engine_config: EngineConfig,
    context: int | None,
    tokenizer: Any,
    todo: list[tuple[Problem, int]],
    store: RunStore,
    on_done: Callable[[SampleRecord], None],
) -> list[str]:
    kind = catalog.kind_of(config.benchmark.name)
    async with AsyncExitStack() as stack:
        sandbox = None
        if needs_sandbox(kind, config):
            sandbox = await stack.enter_async_context(open_sandbox(config.tool, config.sandbox))
        checker = catalog.build_checker(config, sandbox)
        if checker is not None:
            stack.push_async_callback(checker.close)
        engine = build_engine(engine_config, tokenizer=tokenizer)
        stack.push_async_callback(engine.close)
        if kind in catalog.CHAT_KINDS:
            assert checker is not None
            return await sample_and_check(
                engine,
                tokenizer,
                checker,
                todo,
                temperature=config.temperature,
                top_p=config.top_p,
                max_tokens=config.max_response_tokens,
                context=context,
                seed=config.seed,
                concurrency=config.concurrency,
                max_failures=config.max_failures,
                on_done=lambda record: record_sample(store, on_done, record),
            )
        verifier = Verifier.local(config.verify)
        stack.push_async_callback(verifier.close)
        return await evaluate(
            engine,
            sandbox,
            verifier,
            tokenizer,
            todo,
            rollout_config(config, context),
            store,
            max_failures=config.max_failures,
            reward=config.reward,
            on_done=on_done,
            choice=kind == "choice",
            checker=checker,
        )


def load_problems(config: EvalConfig) -> tuple[list[Problem], Checker | None]:
    """The benchmark's problems (its checker's loader, or rstar2-curriculum's), and its checker."""
    checker = catalog.build_checker(config)
    if checker is None:
        return load_benchmark(config.benchmark), None
    data = Path(config.benchmark.data) if config.benchmark.data else None
    problems = checker.load(data)
    return (problems[: config.benchmark.limit] if config.benchmark.limit else problems), checker


def headline(
    config: EvalConfig,
    checker: Checker | None,
    problems: list[Problem],
    records: list[SampleRecord],
) -> Summary:
    """The run's summary; a checker's metrics computed from the records' verdicts."""
    name = Path(config.benchmark.name).stem
    if checker is None:
        return summarize(records, config.pass_k, benchmark=name)
    by_id = {p.id: p for p in problems}
    checked = checker.metrics(
        [
            (by_id[r.problem_id], Verdict(score=r.score or 0.0, answer=r.answer, details=r.details))
            for r in records
        ]
    )
    return summarize(records, config.pass_k, benchmark=name, metric=checker.metric, checked=checked)


def run_evaluation(
    config: EvalConfig, console: Console, *, progress: bool = True
) -> tuple[Summary, Path]:
    """Evaluate (or resume) one run; return its summary and directory."""
    problems, checker = load_problems(config)
    engine_config, context = check_model(config)
    kind = catalog.kind_of(config.benchmark.name)
    if needs_sandbox(kind, config):
        check_tool(config)
    tokenizer = load_tokenizer(config)
    choice = kind == "choice"
    run_dir = config.run_dir()
    with RunStore.open(run_dir, config.model_dump(mode="json"), config.identity()) as store:
        wanted = {(p.id, i) for p in problems for i in range(config.samples)}
        done = {key: r for key, r in store.finished().items() if key in wanted}
        todo = [
            (choice_variant(p, config.seed, i) if choice else p, i)
            for p in problems
            for i in range(config.samples)
            if (p.id, i) not in done
        ]
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
        summary = headline(config, checker, problems, ordered)
        store.write_summary(summary)
    return summary, run_dir

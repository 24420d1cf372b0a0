"""The paper's label check: k answers per problem from a strong model, keep it when m match.

rStar2-Agent (section 4.2) had Qwen3-32B answer each OpenMathReasoning problem 16 times and kept
the problems whose label at least two answers matched, dropping wrong labels. `keep_verified`
is that rule on its own (pure, no model). `check_labels` samples the answers with any engine the
rollout package builds (`rstar2_rollout.build_engine`) and grades them with rstar2-verify:

- `mode="plain"`: one turn per sample with the paper's system prompt without the tool (the
  instruction: reason in `<reason>`, answer in `<answer>`), the question in the paper's user
  template, the `<reason>` generation prefix; the whole response is graded (rstar2-verify
  finds the last `<answer>` / `\\boxed{}` in it).
- `mode="agent"`: `rstar2_rollout.collect`, the path the trainer and the evaluator take (the
  agent loop with the Python tool on a sandbox), scored by rstar2-verify's `Scorer` on the final
  `<answer>` block, truncated or not; a sample whose engine or sandbox failed is not counted.

Seeds derive from (seed, problem id, sample index). The engine and grader need the
`label-check` extra (`pip install "rstar2-curriculum[label-check]"`, plus the engine's own
extra, e.g. `rstar2-rollout[hf]` or `[vllm]`); they are imported only inside `check_labels`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from rstar2_curriculum.config import LabelCheckConfig
from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import MissingExtraError

_ANSWERS_KEPT = 4
EXTRA_HINT = 'the label check needs: pip install "rstar2-curriculum[label-check]"'


class Verdict(BaseModel):
    """One problem's samples against its label."""

    id: str
    label: str
    samples: int
    agree: int
    kept: bool
    answers: list[str | None] = Field(
        default_factory=list, description="The answers graded (first few), None where none."
    )


class LabelCheckReport(BaseModel):
    """What the label check kept and why (JSON)."""

    k: int = Field(description="Samples per problem.")
    m: int = Field(description="Samples that had to match the label.")
    problems: int = Field(description="Problems checked.")
    kept: int = Field(description="Problems kept.")
    dropped: int = Field(description="Problems dropped (fewer than m matches).")
    agree_histogram: dict[int, int] = Field(description="Matches -> problems with that many.")
    finish_reasons: dict[str, int] = Field(default_factory=dict, description="Sample endings.")
    verdicts: list[Verdict] = Field(description="Per problem, in input order.")


def keep_verified(
    problems: Sequence[Problem],
    correct: Mapping[str, Sequence[bool]],
    m: int,
    k: int = 0,
    answers: Mapping[str, Sequence[str | None]] | None = None,
) -> tuple[list[Problem], LabelCheckReport]:
    """Keep the problems with at least `m` samples marked correct; order is kept.

    A problem with no samples counts 0 matches. `k` is only recorded (0: the most samples seen);
    `answers` (what each sample answered) go into the verdicts, the first few per problem.
    """
    verdicts, kept, histogram = [], [], {}
    for problem in problems:
        marks = correct.get(problem.id, ())
        agree = sum(bool(x) for x in marks)
        keep = agree >= m
        said = list((answers or {}).get(problem.id, ()))[:_ANSWERS_KEPT]
        verdicts.append(
            Verdict(
                id=problem.id,
                label=problem.answer,
                samples=len(marks),
                agree=agree,
                kept=keep,
                answers=said,
            )
        )
        histogram[agree] = histogram.get(agree, 0) + 1
        if keep:
            kept.append(problem)
    report = LabelCheckReport(
        k=k or max((v.samples for v in verdicts), default=0),
        m=m,
        problems=len(problems),
        kept=len(kept),
        dropped=len(problems) - len(kept),
        agree_histogram=dict(sorted(histogram.items())),
        verdicts=verdicts,
    )
    return kept, report


def require_extra() -> None:
    try:
        import rstar2_rollout  # noqa: F401
        import rstar2_verify  # noqa: F401
    except ImportError:
        raise MissingExtraError(EXTRA_HINT) from None


async def _plain_samples(
    problems: Sequence[Problem], engine: Any, tokenizer: Any, config: LabelCheckConfig
) -> tuple[dict[str, list[str]], dict[str, int]]:
    from rstar2_rollout import derive_seed
    from rstar2_rollout.chat import ChatFormat, system_prompt
    from rstar2_rollout.engine import SamplingParams

    fmt = ChatFormat(tokenizer, system_prompt((), style=config.system_prompt))
    slots = asyncio.Semaphore(config.max_concurrency)
    endings: dict[str, int] = {}

    async def one(problem: Problem, index: int) -> str:
        params = SamplingParams(
            max_tokens=config.max_response_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            seed=derive_seed(config.seed, problem.id, index),
            stop_token_ids=(fmt.im_end_id,),
            logprobs=False,
        )
        async with slots:
            gen = await engine.generate(
                fmt.prompt_ids(problem.question), params, f"label/{problem.id}/{index}"
            )
        endings[gen.finish_reason] = endings.get(gen.finish_reason, 0) + 1
        if gen.finish_reason in ("error", "abort"):
            return ""
        return tokenizer.decode(gen.token_ids, skip_special_tokens=True)

    texts = await asyncio.gather(*(one(p, i) for p in problems for i in range(config.k)))
    out: dict[str, list[str]] = {}
    for n, problem in enumerate(problems):
        out[problem.id] = list(texts[n * config.k : (n + 1) * config.k])
    return out, endings


async def _agent_check(
    problems: Sequence[Problem], engine: Any, tokenizer: Any, sandbox: Any, config: LabelCheckConfig
) -> tuple[dict[str, list[bool]], dict[str, list[str | None]], dict[str, int]]:
    """`rstar2_rollout.collect` (the trainer's and the evaluator's path) with rstar2-verify's
    scorer on the final `<answer>` block, truncated or not: marks, answers, sample endings."""
    from rstar2_rollout import RewardConfig, RolloutConfig, collect, one_engine_service
    from rstar2_verify import Scorer, Verifier, VerifyConfig, is_correct

    rollout = RolloutConfig(
        n=config.k,
        temperature=config.temperature,
        top_p=config.top_p,
        max_turns=config.max_turns,
        max_response_tokens=config.max_response_tokens,
        max_concurrency=config.max_concurrency,
        seed=config.seed,
        system_prompt=config.system_prompt,
    )
    worker = one_engine_service(engine, sandbox, tokenizer, rollout)
    verifier = Verifier.local(VerifyConfig())
    rule = RewardConfig(graded="answer_block", truncated="graded")
    said: dict[str, list[str | None]] = {p.id: [] for p in problems}
    try:
        collected = await collect(
            worker,
            Scorer(verifier, rule, tokenizer),
            problems,
            config.k,
            rollout,
            on_graded=lambda p, _, grade: said[p.id].append(grade and grade.extracted),
        )
    finally:
        await worker.scheduler.close()
        await verifier.close()
    correct: dict[str, list[bool]] = {p.id: [] for p in problems}
    endings: dict[str, int] = {}
    for traj in collected.trajectories:
        ending = traj.finish_reason or "unfinished"
        endings[ending] = endings.get(ending, 0) + 1
        correct[traj.group_id].append(is_correct(traj.reward))
    if collected.failed_jobs:
        endings["error"] = len(collected.failed_jobs)
    return correct, said, endings


async def check_labels(
    problems: Sequence[Problem],
    engine: Any,
    tokenizer: Any,
    config: LabelCheckConfig,
    sandbox: Any = None,
) -> tuple[list[Problem], LabelCheckReport]:
    """Sample k answers per problem, grade each against the label, keep those with >= m."""
    require_extra()
    from rstar2_verify import agrade_many

    if len({p.id for p in problems}) != len(problems):
        raise ValueError("problem ids must be unique for the label check")
    if config.mode == "agent":
        if sandbox is None:
            raise ValueError("mode 'agent' needs a sandbox for the Python tool")
        correct, said, endings = await _agent_check(problems, engine, tokenizer, sandbox, config)
    else:
        texts, endings = await _plain_samples(problems, engine, tokenizer, config)
        pairs = [(text, p.answer) for p in problems for text in texts[p.id]]
        grades = iter(await agrade_many(pairs))
        per_problem = {p.id: [next(grades) for _ in texts[p.id]] for p in problems}
        correct = {i: [g.correct for g in gs] for i, gs in per_problem.items()}
        said = {i: [g.extracted for g in gs] for i, gs in per_problem.items()}
    kept, report = keep_verified(problems, correct, config.m, config.k, said)
    return kept, report.model_copy(update={"finish_reasons": dict(sorted(endings.items()))})

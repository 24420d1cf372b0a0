"""The paper's label check: k answers per problem from a strong model, keep it when m match.

rStar2-Agent (section 4.2) had Qwen3-32B answer each OpenMathReasoning problem 16 times and kept
the problems whose label at least two answers matched, dropping wrong labels. `keep_verified`
is that rule on its own (pure, no model). `check_labels` samples the answers with any engine the
rollout package builds (`rstar2_rollout.build_engine`) and grades them with rstar2-verify.
Both modes sample and grade through `rstar2_rollout.collect`, the path the trainer and the
evaluator take, scored by rstar2-verify's `Scorer`, truncated samples included; a sample whose
engine or sandbox failed is not counted:

- `mode="plain"`: one turn per sample with the paper's system prompt without the tool (the
  instruction: reason in `<reason>`, answer in `<answer>`; `RolloutConfig.tool` False), the
  question in the paper's user template, the `<reason>` generation prefix; the whole response is
  graded (rstar2-verify finds the last `<answer>` / `\\boxed{}` in it).
- `mode="agent"`: the agent loop with the Python tool on a sandbox, the final `<answer>` block
  graded.

Seeds derive from (seed, problem id, sample index, turn), as in every rollout. The engine and grader need the
`label-check` extra (`pip install "rstar2-curriculum[label-check]"`, plus the engine's own
extra, e.g. `rstar2-rollout[hf]` or `[vllm]`); they are imported only inside `check_labels`.
"""

from __future__ import annotations

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


async def _collected(
    problems: Sequence[Problem], engine: Any, tokenizer: Any, sandbox: Any, config: LabelCheckConfig
) -> tuple[dict[str, list[bool]], dict[str, list[str | None]], dict[str, int]]:
    """Sample and grade through `rstar2_rollout.collect` (the trainer's and the evaluator's path)
    with rstar2-verify's scorer: marks, answers and sample endings per problem. Agent mode: the
    agent loop with the tool, the final `<answer>` block graded; plain mode: one turn without the
    tool, the whole response graded. Truncated samples are graded; failed ones are not counted."""
    from rstar2_rollout import RewardConfig, RolloutConfig, collect, one_engine_service
    from rstar2_verify import Scorer, Verifier, VerifyConfig, is_correct

    agent = config.mode == "agent"
    rollout = RolloutConfig(
        n=config.k,
        temperature=config.temperature,
        top_p=config.top_p,
        max_turns=config.max_turns if agent else 1,
        max_response_tokens=config.max_response_tokens,
        max_concurrency=config.max_concurrency,
        seed=config.seed,
        system_prompt=config.system_prompt,
        tool=agent,
    )
    service = one_engine_service(engine, sandbox, tokenizer, rollout)
    verifier = Verifier.local(VerifyConfig())
    rule = RewardConfig(graded="answer_block" if agent else "response", truncated="graded")
    said: dict[str, list[str | None]] = {p.id: [] for p in problems}
    try:
        collected = await collect(
            service,
            Scorer(verifier, rule, tokenizer),
            problems,
            config.k,
            rollout,
            on_graded=lambda p, _, grade: said[p.id].append(grade and grade.extracted),
        )
    finally:
        await service.scheduler.close()
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
    if len({p.id for p in problems}) != len(problems):
        raise ValueError("problem ids must be unique for the label check")
    if config.mode == "agent" and sandbox is None:
        raise ValueError("mode 'agent' needs a sandbox for the Python tool")
    correct, said, endings = await _collected(problems, engine, tokenizer, sandbox, config)
    kept, report = keep_verified(problems, correct, config.m, config.k, said)
    return kept, report.model_copy(update={"finish_reasons": dict(sorted(endings.items()))})

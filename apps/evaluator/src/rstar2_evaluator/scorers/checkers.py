"""IFEval, BFCL v3 and Arena-Hard as `Checker`s over their reference scorers.

The scoring itself is the reference modules' (`ifeval.py`: lm-eval's copy of Google's
checkers; `bfcl.py`: bfcl-eval's own per-entry checks with BFCL's Qwen function-calling handler;
`arena.py`: arena-hard-auto's judging and win rates). This module only carries their problems
and verdicts through rstar2-eval's interface: a published record becomes a `Problem` (its parts
in `metadata`, JSON-safe, so a resumed run rebuilds them), a verdict becomes a `Verdict` (its
parts in `details`, from which `metrics` recomputes the benchmark's numbers), and a reference's
data error becomes rstar2-curriculum's `BenchmarkError` (one line, exit 2).

- IFEval: the prompt alone as one user turn; `Response.text` (reasoning removed) is checked;
  the headline is strict prompt-level accuracy, with the loose and instruction-level ones beside.
- BFCL: every AST category whose files the data holds (non-live and live) and the relevance
  ones; the first turn and the functions through the model's chat template (`tools=`); the
  reply as written (chat tokens removed; the handler drops a `<think>` block and decodes the
  `<tool_call>` JSON). Headline `ast_overall`: the unweighted mean of BFCL's non-live and live
  AST summaries (BFCL's leaderboard overall also averages multi-turn, which is not run).
- Arena-Hard: the question as one user turn; two judged games per question against the
  baseline's answer (the judge: `JudgeConfig`, its key read by the app and handed in); the plain
  win rate with its bootstrap interval (the headline) and the style-controlled one, fitted with
  the judgments the data folder publishes for the same judge.

Not covered: BFCL's multi-turn, agentic and memory categories; Arena-Hard's categories beyond
one per run.
"""

from __future__ import annotations

import asyncio
import importlib
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2_curriculum import BenchmarkError, Problem
from rstar2_evaluator.config import JudgeConfig
from rstar2_evaluator.scorers import CheckFailed, Prompt, Response, Verdict

_SPECIAL = re.compile(r"<\|[a-z_]+\|>|</s>")
BFCL_REQUIRED = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")


def _reference(name: str) -> Any:
    """The reference scorer module `scorers.<name>`; a missing one (or its dependency) is one
    line, not a traceback."""
    try:
        return importlib.import_module(f"rstar2_evaluator.scorers.{name}")
    except ImportError as error:
        raise BenchmarkError(
            f"the {name} reference scorer cannot be imported ({error}); install "
            "rstar2-evaluator with its dependencies"
        ) from None


def _data_error(error: Exception) -> BenchmarkError:
    return BenchmarkError(str(error).splitlines()[0])


class IFEvalChecker:
    """IFEval through lm-eval's checkers (`scorers.ifeval`)."""

    metric = "prompt_level_strict_acc"

    def load(self, path: Path | None) -> list[Problem]:
        ifeval = _reference("ifeval")

        if path is None:
            raise BenchmarkError(f"ifeval has no copy here: download {ifeval.IFEVAL_DOWNLOAD}")
        try:
            problems = ifeval.load_ifeval(path)
        except ValueError as error:
            raise _data_error(error) from None
        return [
            Problem(
                id=str(p.key),
                question=p.prompt,
                answer="",
                source="ifeval",
                metadata={
                    "instruction_id_list": list(p.instruction_id_list),
                    "kwargs": list(p.kwargs),
                },
            )
            for p in problems
        ]

    @staticmethod
    def _problem(problem: Problem) -> Any:
        ifeval = _reference("ifeval")

        meta = problem.metadata
        return ifeval.IFEvalProblem(
            key=int(problem.id),
            prompt=problem.question,
            instruction_id_list=tuple(meta["instruction_id_list"]),
            kwargs=tuple(dict(k) for k in meta["kwargs"]),
        )

    def prompt(self, problem: Problem) -> Prompt:
        ifeval = _reference("ifeval")

        return Prompt(messages=ifeval.ifeval_messages(self._problem(problem)))

    async def check(self, problem: Problem, response: Response) -> Verdict:
        ifeval = _reference("ifeval")

        try:
            verdict = await asyncio.to_thread(
                ifeval.score_ifeval, self._problem(problem), response.text
            )
        except ValueError as error:  # an instruction the registry does not know: the data's fault
            raise CheckFailed(f"ifeval {problem.id}: {error}") from None
        details = {"strict": list(verdict.strict), "loose": list(verdict.loose)}
        return Verdict(score=float(verdict.prompt_strict), details=details)

    def metrics(self, checked: Sequence[tuple[Problem, Verdict]]) -> dict[str, float]:
        ifeval = _reference("ifeval")

        verdicts = [
            ifeval.IFEvalVerdict(tuple(v.details["strict"]), tuple(v.details["loose"]))
            for _, v in checked
        ]
        return dict(ifeval.summarize_ifeval(verdicts))

    async def close(self) -> None:
        return None


class BFCLChecker:
    """BFCL v3's AST and relevance categories through bfcl-eval (`scorers.bfcl`)."""

    metric = "ast_overall"

    def load(self, path: Path | None) -> list[Problem]:
        bfcl = _reference("bfcl")

        problems: list[Problem] = []
        for category in bfcl.CATEGORIES:
            try:
                entries = bfcl.load_bfcl(category, path)
            except ValueError as error:
                if category in BFCL_REQUIRED or path is None:
                    raise _data_error(error) from None
                continue  # live (or Java, JavaScript) data not given: those categories not run
            problems += [
                Problem(
                    id=e.id,
                    question=str(e.question[0][-1].get("content", "")) if e.question[0] else "",
                    answer="",
                    source=f"bfcl/{category}",
                    metadata={
                        "category": category,
                        "question": e.question,
                        "function": e.function,
                        "ground_truth": e.ground_truth,
                    },
                )
                for e in entries
            ]
        return problems

    @staticmethod
    def _problem(problem: Problem) -> Any:
        bfcl = _reference("bfcl")

        meta = problem.metadata
        return bfcl.BFCLProblem(
            id=problem.id,
            category=meta["category"],
            question=meta["question"],
            function=meta["function"],
            ground_truth=meta["ground_truth"],
        )

    def prompt(self, problem: Problem) -> Prompt:
        bfcl = _reference("bfcl")

        messages, tools = bfcl.bfcl_messages(self._problem(problem))
        return Prompt(messages=messages, tools=tools)  # BFCL's documents, as its handler gives

    async def check(self, problem: Problem, response: Response) -> Verdict:
        bfcl = _reference("bfcl")

        written = _SPECIAL.sub("", response.raw)
        verdict = await asyncio.to_thread(bfcl.score_bfcl, self._problem(problem), written)
        details = {
            "category": problem.metadata["category"],
            "error_type": verdict.error_type,
            "errors": list(verdict.errors)[:3],
        }
        return Verdict(score=float(verdict.valid), details=details)

    def metrics(self, checked: Sequence[tuple[Problem, Verdict]]) -> dict[str, float]:
        bfcl = _reference("bfcl")

        by: dict[str, list[Any]] = defaultdict(list)
        for _, v in checked:
            by[v.details["category"]].append(bfcl.BFCLVerdict(valid=v.score > 0.5))
        out = dict(bfcl.summarize_bfcl(dict(by)))
        parts = [out[k] for k in ("non_live_ast", "live_ast") if k in out]
        ast = [out[c] for c in bfcl.AST_CATEGORIES if c in out]
        out["ast_overall"] = sum(parts) / len(parts) if parts else sum(ast) / max(len(ast), 1)
        return out

    async def close(self) -> None:
        return None


class ArenaChecker:
    """Arena-Hard: judged against its baseline (`scorers.arena`) by the judge the user names, win
    rates as arena-hard-auto's show_result (`scorers.arena_rates`). The style-controlled fit
    takes the run's model together with the judgments the data folder publishes for the same
    judge (`judge.published`), as if the run's were written to `model_judgment/<judge>/
    <model>.jsonl` beside them; the plain rate draws as show_result over the same files."""

    metric = "win_rate"

    def __init__(self, judge: JudgeConfig, *, seed: int = 0, model: str = "model") -> None:
        self.judge = judge
        self.seed = seed
        self.model = model  # the run's model, by name, among the published ones
        self._category = ""
        self._pool: list[Any] = []  # published battles of other models, in show_result's order
        self._client: Any = None
        self._gate = asyncio.Semaphore(judge.concurrency)

    def load(self, path: Path | None) -> list[Problem]:
        arena = _reference("arena")

        if path is None:
            raise BenchmarkError(f"arena_hard has no copy here: download {arena.ARENA_DOWNLOAD}")
        try:
            questions, baselines = arena.load_arena(path)
            categories = sorted({q.category for q in questions})
            if len(categories) > 1:
                raise ValueError(f"Arena-Hard runs one category at a time; {path} has {categories}")
            self._category = categories[0]
            published = self.judge.model if self.judge.published is None else self.judge.published
            if self.judge.published and not (path / "model_judgment" / published).is_dir():
                raise ValueError(
                    f"judge.published={published}: {path / 'model_judgment' / published} is not "
                    "a folder of published judgments"
                )
            if published:
                self._pool = arena.load_published(
                    path, published, category=self._category, exclude={self.model}
                )
        except ValueError as error:
            raise _data_error(error) from None
        return [
            Problem(
                id=q.uid,
                question=q.prompt,
                answer="",
                source="arena_hard",
                metadata={
                    "category": q.category,
                    "baseline": arena.answer_text(baselines[q.uid]),
                    "baseline_style": baselines[q.uid].get("metadata"),
                },
            )
            for q in questions
        ]

    def prompt(self, problem: Problem) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": problem.question}])

    async def check(self, problem: Problem, response: Response) -> Verdict:
        import httpx

        arena = _reference("arena")

        category = problem.metadata["category"]
        judge = arena.JudgeEndpoint(
            url=self.judge.url,
            model=self.judge.model,
            api_key=self.judge.api_key,
            max_tokens=self.judge.max_tokens or arena.JUDGE_MAX_TOKENS.get(category, 16000),
            timeout_s=self.judge.timeout_s,
        )
        question = arena.ArenaQuestion(problem.id, category, problem.question)
        if self._client is None:
            self._client = httpx.AsyncClient()
        async with self._gate:
            try:
                games = await arena.judge_games(
                    self._client, judge, question, response.text, problem.metadata["baseline"]
                )
            except RuntimeError as error:  # the judge did not answer: not the model's doing
                raise CheckFailed(str(error)) from None
        scores = arena.battle_scores(games)
        details: dict[str, Any] = {"verdicts": [g["score"] for g in games], "scores": scores}
        try:
            details["style"] = arena.style_metadata(response.text)
            details["baseline_style"] = problem.metadata.get(
                "baseline_style"
            ) or arena.style_metadata(problem.metadata["baseline"])
        except ValueError:  # tiktoken's encoding not available offline: no style control
            details["style"] = details["baseline_style"] = None
        score = sum(scores) / len(scores) if scores else 0.0
        return Verdict(score=score, details=details)

    def metrics(self, checked: Sequence[tuple[Problem, Verdict]]) -> dict[str, float]:
        arena = _reference("arena")
        rates = _reference("arena_rates")

        judged = [v for _, v in checked if v.details.get("scores")]
        if not judged:
            return {"win_rate": 0.0, "judged": 0.0}
        ours = [
            rates.Battle(
                self.model,
                tuple(v.details["scores"]),
                v.details.get("style"),
                v.details.get("baseline_style"),
            )
            for v in judged
        ]
        # show_result reads the judgment files by name: the run's as <model>.jsonl among them.
        key = f"{self.model}.jsonl"
        at = next((i for i, b in enumerate(self._pool) if f"{b.model}.jsonl" > key), None)
        at = len(self._pool) if at is None else at
        battles = [*self._pool[:at], *ours, *self._pool[at:]]
        scores: dict[str, list[float]] = defaultdict(list)
        for b in battles:
            scores[b.model].extend(b.scores)
        plain = rates.win_rates(scores, seed=self.seed)[self.model]
        out = {
            "win_rate": plain["score"],
            "win_rate_lower": plain["lower"],
            "win_rate_upper": plain["upper"],
            "judged": float(len(judged)),
            "models_fitted": float(len(scores)),
        }
        if all(b.style and b.baseline_style for b in battles):
            baseline = arena.BASELINES.get(self._category, "")
            try:
                controlled = rates.style_controlled_win_rates(
                    battles, baseline=baseline, seed=self.seed
                )[self.model]
            except ValueError:  # the run's model is the baseline itself: nothing to control
                return out
            out |= {
                "style_controlled": controlled["score"],
                "style_controlled_lower": controlled["lower"],
                "style_controlled_upper": controlled["upper"],
            }
        return out

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

"""Benchmarks sampled with the model's own chat template: one reply per sample, then its checker.

IFEval, BFCL and Arena-Hard are run as their authors run them (and as the paper does, 5.1):
each benchmark's default template (`Checker.prompt`: its messages, and its tools for function
calling) rendered by the model's chat template (`apply_chat_template(messages, tools=...,
add_generation_prompt=True)`), one greedy turn by default, no tool loop. The reply goes to the
checker as a `Response` (`reply_text`: reasoning blocks removed), and the verdict is recorded as
the agent loop's samples are (`samples.jsonl`), so a killed run resumes the same way.

A failure that is not the model's (the engine errors or aborts, the checker raises
`CheckFailed`) is not recorded; after `max_failures` of them the rest are cancelled, and a rerun
retries them. Each sample's seed derives from (run seed, problem id, sample index).
Not covered: multi-turn benchmarks (BFCL's multi-turn categories need executed tools).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from rstar2_curriculum import Problem
from rstar2_evaluator.record import SampleRecord
from rstar2_evaluator.scorers import Checker, CheckFailed, Response, Verdict, reply_text
from rstar2_rollout import Engine, SamplingParams, derive_seed

_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")


def stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a chat turn: the tokenizer's end-of-sequence and the usual turn ends."""
    found: set[int] = set()
    if isinstance(tokenizer.eos_token_id, int):
        found.add(tokenizer.eos_token_id)
    unknown = tokenizer.unk_token_id
    for token in _STOP_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id >= 0 and token_id != unknown:
            found.add(token_id)
    return tuple(sorted(found))


def prompt_ids(tokenizer: Any, checker: Checker, problem: Problem) -> list[int]:
    """The problem's default template, rendered by the model's chat template."""
    prompt = checker.prompt(problem)
    text = tokenizer.apply_chat_template(
        prompt.messages, tools=prompt.tools, add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def verdict_record(
    problem: Problem,
    index: int,
    raw: str,
    verdict: Verdict,
    finish_reason: str,
    tokens: int,
    seconds: float,
) -> SampleRecord:
    """One checked sample as a run records it (`score` and `details` are the verdict's)."""
    return SampleRecord(
        problem_id=problem.id,
        sample_index=index,
        reference=problem.answer,
        answer=verdict.answer,
        answer_key=verdict.answer,
        correct=verdict.score > 0.5,
        finish_reason=finish_reason,
        response_tokens=tokens,
        sampled_tokens=tokens,
        turns=1,
        seconds=round(seconds, 3),
        response=raw,
        score=verdict.score,
        details=verdict.details,
    )


async def sample_and_check(
    engine: Engine,
    tokenizer: Any,
    checker: Checker,
    todo: Sequence[tuple[Problem, int]],
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    context: int | None,
    seed: int,
    concurrency: int,
    max_failures: int,
    on_done: Callable[[SampleRecord], None],
) -> list[str]:
    """Sample one reply per (problem, sample index), check it, hand each record to `on_done`;
    return the failures (module docstring)."""
    stops = stop_ids(tokenizer)
    gate = asyncio.Semaphore(concurrency)
    failures: list[str] = []
    stopped = asyncio.Event()

    async def one(problem: Problem, index: int) -> None:
        async with gate:
            if stopped.is_set():
                return
            ids = prompt_ids(tokenizer, checker, problem)
            budget = max_tokens if context is None else min(max_tokens, context - len(ids))
            started = time.perf_counter()
            if budget > 0:
                params = SamplingParams(
                    max_tokens=budget,
                    temperature=temperature,
                    top_p=top_p,
                    seed=derive_seed(seed, problem.id, index),
                    stop_token_ids=stops,
                    logprobs=False,
                )
                gen = await engine.generate(ids, params, f"{problem.id}/{index}")
                if gen.finish_reason in ("error", "abort"):
                    fail(f"{problem.id}#{index}: {engine.name}: {gen.error or gen.finish_reason}")
                    return
                token_ids, cut = gen.token_ids, gen.finish_reason == "length"
            else:  # the prompt alone fills the context
                token_ids, cut = [], True
            raw = tokenizer.decode(token_ids, skip_special_tokens=False)
            reason = "max_length" if cut else "stop"
            response = Response(text=reply_text(raw), raw=raw, finish_reason=reason)
            try:
                verdict = await checker.check(problem, response)
            except CheckFailed as error:
                fail(f"{problem.id}#{index}: {error}")
                return
            seconds = time.perf_counter() - started
            on_done(verdict_record(problem, index, raw, verdict, reason, len(token_ids), seconds))

    def fail(line: str) -> None:
        failures.append(line)
        if len(failures) >= max_failures:
            stopped.set()

    await asyncio.gather(*(one(problem, index) for problem, index in todo))
    return failures

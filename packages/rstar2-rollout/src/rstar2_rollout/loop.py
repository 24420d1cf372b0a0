"""The agent loop: generate a turn, run its tool call in the sandbox, append the result, repeat.

`run_agent` produces one `Trajectory` for one problem; many run at once on one event loop (the
rollout service's scheduler places them, `collect` grades them). Everything is asyncio: while one
trajectory waits on its tool call (or on the engine), the others keep generating, and there is
no per-turn barrier between trajectories.

Token in, token out: the prompt is encoded once; each turn sends `prompt_ids + response_ids` to
the engine and appends exactly the ids it sampled (mask 1, with their logprobs); template pieces
and tool responses are encoded on their own and appended (mask 0). Earlier turns are never
re-tokenised, so the trainer sees the ids the policy sampled.

A turn ends with the model's stop token. Then:
- no `<tool_call>`: finish "answered" if the trajectory has a closed `<answer>` block, else
  "no_tool_call";
- calls: the first `max_tool_calls_per_turn` runnable ones go to the sandbox; a call that cannot
  run (malformed JSON, unknown tool, bad arguments, unclosed tag) or one over the per-turn limit
  gets an explanatory tool response and outcome parse_error; every call gets one
  `<tool_response>` block in one user turn;
- the turn hit the token budget (or the context limit): "max_length"; max turns: "max_turns";
- the engine interrupted the turn at a weight push (`Generation` "interrupted", vLLM's
  `at_push: abort`): its tokens so far are kept on the old version and the same turn goes on
  from there (prompt + response so far, the rest of the turn's budget, a seed of its own) on
  the new weights; one turn, one response, its tokens carrying two versions;
- the engine failed, the sandbox raised, or a call came back `sandbox_error` (the sandbox, not the
  model, failed): "error" (the message is kept in `error`; trainers drop such trajectories).

With `config.tool` False (the label check's plain mode) the system prompt has no tool schema
(`chat_format`), no call is run and the first turn ends the trajectory as if it had none; no
sandbox is needed (`sandbox=None`).

The budget counts response tokens; with `count_tool_tokens` (the paper's choice) template and
tool tokens count too and the response never exceeds it (a tool response that would overflow is
cut and the trajectory ends "max_length"). Not covered: choosing engines (the scheduler) and
grading answers (rstar2-verify).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from rstar2_rollout.chat import TOOL_NAME, ChatFormat, Tokenizer, system_prompt
from rstar2_rollout.config import RolloutConfig
from rstar2_rollout.engine import Engine, Generation, SamplingParams
from rstar2_rollout.toolcall import ToolCallRequest, parse_turn
from rstar2_rollout.trajectory import ToolCallRecord, Trajectory, outcome_of
from rstar2_sandbox import ExecutionRequest, ExecutionResult, ExecutionStatus, Sandbox


class ProblemLike(Protocol):
    """Declares what the loop needs of a problem: an id (the group) and the question text."""

    @property
    def id(self) -> str: ...

    @property
    def question(self) -> str: ...


@dataclass(frozen=True)
class RolloutTask:
    """Names one question for the agent loop to answer; `id` groups its samples.

    It carries no answer, because rollout does not grade: `collect` turns any `ProblemLike` (the
    curriculum's `Problem`, say) into one, and the rollout service receives these over the wire.
    """

    id: str
    question: str


def derive_seed(seed: int, *parts: object) -> int:
    """Derives a 31-bit seed from the run seed and (problem id, sample index, turn, ...)."""
    text = "/".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 33


def format_tool_result(result: ExecutionResult) -> str:
    """Formats the text the model reads for one executed call (the paper's response types)."""
    status = result.status
    if status in (ExecutionStatus.OK, ExecutionStatus.OUTPUT_TRUNCATED):
        text = result.stdout or result.result_repr
        if result.stderr:
            text = f"{text}\n{result.stderr}" if text else result.stderr
        if status == ExecutionStatus.OUTPUT_TRUNCATED:
            text += "\n[output truncated]"
        return text
    if status == ExecutionStatus.TIMEOUT:
        detail = f"timeout: {result.message or 'time limit exceeded'}"
    elif status == ExecutionStatus.MEMORY_EXCEEDED:
        detail = f"memory limit exceeded{': ' + result.message if result.message else ''}"
    elif status == ExecutionStatus.REJECTED:
        detail = f"rejected: {result.message}"
    else:
        detail = f"error message: {result.traceback or result.stderr or result.message}"
    prefix = f"{result.stdout}\n" if result.stdout else ""
    return f"{prefix}tool call failed\nreason:\n{detail}"


def truncate_middle(text: str, limit: int | None) -> str:
    """Keep the head and tail of `text` within `limit` characters (None: no limit)."""
    if limit is None or len(text) <= limit:
        return text
    marker = f"\n...[{len(text) - limit} characters omitted]...\n"
    keep = max(limit - len(marker), 0)
    head = keep - keep // 2
    return text[:head] + marker + text[len(text) - keep // 2 :]


def chat_format(tokenizer: Tokenizer | ChatFormat, config: RolloutConfig) -> ChatFormat:
    """The chat template of a rollout: the tool's schema in the system prompt when it is offered."""
    if isinstance(tokenizer, ChatFormat):
        return tokenizer
    if config.tool:
        return ChatFormat(tokenizer, system_prompt(style=config.system_prompt))
    return ChatFormat(tokenizer, system_prompt((), style=config.system_prompt))


async def run_agent(
    engine: Engine,
    sandbox: Sandbox | None,
    tokenizer: Tokenizer | ChatFormat,
    problem: ProblemLike,
    config: RolloutConfig,
    *,
    sample_index: int = 0,
    request_id: str = "",
) -> Trajectory:
    """Roll out one trajectory of `problem`; never raises for model, engine or tool failures."""
    fmt = chat_format(tokenizer, config)
    traj = Trajectory(group_id=problem.id, sample_index=sample_index)
    traj.prompt_ids = fmt.prompt_ids(problem.question)
    stop_ids = (fmt.im_end_id,)
    rid = request_id or f"{problem.id}/{sample_index}"

    def budget_left() -> int:
        used = len(traj.response_ids) if config.count_tool_tokens else traj.sampled_tokens
        left = config.max_response_tokens - used
        if config.max_context_tokens is not None:
            left = min(
                left, config.max_context_tokens - len(traj.prompt_ids) - len(traj.response_ids)
            )
        return left

    for turn in range(config.max_turns):
        max_tokens = budget_left()
        if config.max_tokens_per_turn is not None:
            max_tokens = min(max_tokens, config.max_tokens_per_turn)
        if max_tokens <= 0:
            traj.finish_reason = "max_length"
            break
        gen, turn_ids = await _generate_turn(engine, traj, config, max_tokens, stop_ids, turn, rid)
        traj.turns += 1
        if gen.finish_reason in ("error", "abort"):
            traj.finish_reason = "error"
            traj.error = gen.error or f"engine {engine.name}: request {gen.finish_reason}"
            break
        parsed = parse_turn(fmt.tokenizer.decode(turn_ids, skip_special_tokens=False))
        traj.answer_blocks += len(parsed.answers)
        if parsed.answers:
            traj.final_answer = parsed.answers[-1]
        if gen.finish_reason == "length":
            traj.finish_reason = "max_length"
            break
        if not parsed.calls or not config.tool:
            traj.finish_reason = "answered" if traj.answer_blocks else "no_tool_call"
            break
        if sandbox is None:
            traj.finish_reason, traj.error = "error", "a tool call, and no sandbox to run it"
            break
        try:
            outputs = await _run_calls(sandbox, traj, turn, parsed.calls, config, rid)
        except Exception as exc:
            traj.finish_reason, traj.error = "error", f"sandbox: {type(exc).__name__}: {exc}"
            break
        lost = [c for c in traj.tool_calls if c.status == ExecutionStatus.SANDBOX_ERROR]
        if lost:  # the sandbox failed, not the model: the trajectory is the system's failure
            traj.finish_reason, traj.error = "error", f"sandbox: {lost[-1].message}"
            break
        last_turn = turn + 1 == config.max_turns
        piece = fmt.after_assistant_ids() + fmt.tool_turn_ids(outputs)
        if not last_turn:
            piece += fmt.assistant_prefix_ids()
        if config.count_tool_tokens and len(piece) > budget_left():
            traj.append(piece[: max(budget_left(), 0)], sampled=False)
            traj.finish_reason = "max_length"
            break
        traj.append(piece, sampled=False)
    else:
        traj.finish_reason = "max_turns"
    return traj


async def _generate_turn(
    engine: Engine,
    traj: Trajectory,
    config: RolloutConfig,
    max_tokens: int,
    stop_ids: tuple[int, ...],
    turn: int,
    rid: str,
) -> tuple[Generation, list[int]]:
    """Sample one turn into `traj`: its last generation and every id it sampled. A generation
    "interrupted" at a weight push is kept (its tokens on the old version) and continued from
    where it stopped with the rest of the turn's `max_tokens`; no other outcome repeats."""
    turn_ids: list[int] = []
    part = 0
    while True:
        key = (turn,) if part == 0 else (turn, part)
        params = SamplingParams(
            max_tokens=max_tokens - len(turn_ids),
            temperature=config.temperature,
            top_p=config.top_p,
            seed=derive_seed(config.seed, traj.group_id, traj.sample_index, *key),
            stop_token_ids=stop_ids,
        )
        started = time.perf_counter()
        request = f"{rid}/{turn}" if part == 0 else f"{rid}/{turn}.{part}"
        try:
            gen = await engine.generate(traj.prompt_ids + traj.response_ids, params, request)
        except Exception as exc:
            gen = Generation([], finish_reason="error", error=f"{type(exc).__name__}: {exc}")
        finally:
            traj.timings.generate_s += time.perf_counter() - started
        traj.append(gen.token_ids, sampled=True, logprobs=gen.logprobs, version=gen.weights_version)
        turn_ids += gen.token_ids
        if gen.finish_reason != "interrupted":
            return gen, turn_ids
        if len(turn_ids) >= max_tokens:  # stopped on its last token: the budget is spent
            return replace(gen, finish_reason="length"), turn_ids
        part += 1


async def _run_calls(
    sandbox: Sandbox,
    traj: Trajectory,
    turn: int,
    calls: Sequence[ToolCallRequest],
    config: RolloutConfig,
    rid: str,
) -> list[str]:
    """Execute this turn's calls; record each; return one response text per call."""
    runnable = [c for c in calls if c.ok][: config.max_tool_calls_per_turn]
    requests = [
        ExecutionRequest(
            code=c.code, stdin=c.stdin, timeout_s=config.tool_timeout_s, request_id=f"{rid}/{turn}"
        )
        for c in runnable
    ]
    started = time.perf_counter()
    if len(requests) == 1:
        results = [await sandbox.execute(requests[0])]
    elif requests:
        results = await sandbox.execute_many(requests)
    else:
        results = []
    elapsed = time.perf_counter() - started
    traj.timings.tool_s += elapsed
    by_call = dict(zip((id(c) for c in runnable), results, strict=True))
    outputs: list[str] = []
    for call in calls:
        result = by_call.get(id(call))
        if result is not None:
            text = truncate_middle(format_tool_result(result), config.max_tool_response_chars)
            record = ToolCallRecord(
                turn=turn,
                name=call.name,
                code=call.code,
                stdin=call.stdin,
                outcome=outcome_of(result.status),
                status=result.status,
                message=result.message,
                response=text,
                wall_s=result.wall_s,
            )
        else:
            limit = config.max_tool_calls_per_turn
            reason = call.error or f"Not executed: at most {limit} tool call(s) per turn."
            text = truncate_middle(reason, config.max_tool_response_chars)
            record = ToolCallRecord(
                turn=turn,
                name=call.name or TOOL_NAME,
                code=call.code,
                stdin=call.stdin,
                outcome="parse_error",
                message=reason,
                response=text,
            )
        traj.record(record)
        outputs.append(text)
    return outputs

"""Conversions between rollout.v1 protobuf messages and the service's dataclasses.

Only this module, `server.py` and `client.py` touch generated classes. Enums map by name
(`FINISH_REASON_MAX_LENGTH` <-> "max_length"); an unknown or unspecified wire value decodes to
"error" so a newer server never crashes an older client. A problem's answer is not sent: the service
does not grade. Not carried: a tool call's sandbox status (its outcome is) and the reward.
"""

from __future__ import annotations

from rstar2_proto.rollout.v1 import rollout_pb2 as pb
from rstar2_rollout.engine import KVCapacity
from rstar2_rollout.loop import RolloutTask
from rstar2_rollout.scheduler import EngineStatus
from rstar2_rollout.service import RolloutResult, RolloutSampling
from rstar2_rollout.trajectory import (
    FinishReason,
    Timings,
    ToolCallRecord,
    ToolOutcome,
    Trajectory,
)

FINISH: dict[FinishReason, pb.FinishReason] = {
    "answered": pb.FINISH_REASON_ANSWERED,
    "no_tool_call": pb.FINISH_REASON_NO_TOOL_CALL,
    "max_turns": pb.FINISH_REASON_MAX_TURNS,
    "max_length": pb.FINISH_REASON_MAX_LENGTH,
    "error": pb.FINISH_REASON_ERROR,
}
OUTCOME: dict[ToolOutcome, pb.ToolOutcome] = {
    "ok": pb.TOOL_OUTCOME_OK,
    "error": pb.TOOL_OUTCOME_ERROR,
    "timeout": pb.TOOL_OUTCOME_TIMEOUT,
    "parse_error": pb.TOOL_OUTCOME_PARSE_ERROR,
}
_FINISH_BACK: dict[int, FinishReason] = {v: k for k, v in FINISH.items()}
_OUTCOME_BACK: dict[int, ToolOutcome] = {v: k for k, v in OUTCOME.items()}


def encode_request(
    problems: list[RolloutTask], sampling: RolloutSampling, request_id: str = ""
) -> pb.RolloutRequest:
    return pb.RolloutRequest(
        problems=[pb.Problem(id=p.id, question=p.question) for p in problems],
        sampling=pb.SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_response_tokens=sampling.max_response_tokens,
            max_turns=sampling.max_turns,
            seed=sampling.seed,
            n=sampling.n,
            count_tool_tokens=sampling.count_tool_tokens,
            max_tokens_per_turn=sampling.max_tokens_per_turn,
            max_context_tokens=sampling.max_context_tokens,
            max_tool_calls_per_turn=sampling.max_tool_calls_per_turn,
            max_tool_response_chars=sampling.max_tool_response_chars,
            tool_timeout_s=sampling.tool_timeout_s,
            system_prompt=sampling.system_prompt,
        ),
        request_id=request_id,
    )


def decode_request(msg: pb.RolloutRequest) -> tuple[list[RolloutTask], RolloutSampling]:
    s = msg.sampling
    sampling = RolloutSampling(
        n=s.n,
        temperature=s.temperature,
        top_p=s.top_p,
        max_response_tokens=s.max_response_tokens,
        max_turns=s.max_turns,
        seed=s.seed,
        count_tool_tokens=_optional(s, "count_tool_tokens"),
        max_tokens_per_turn=_optional(s, "max_tokens_per_turn"),
        max_context_tokens=_optional(s, "max_context_tokens"),
        max_tool_calls_per_turn=_optional(s, "max_tool_calls_per_turn"),
        max_tool_response_chars=_optional(s, "max_tool_response_chars"),
        tool_timeout_s=_optional(s, "tool_timeout_s"),
        system_prompt=s.system_prompt,
    )
    return [RolloutTask(p.id, p.question) for p in msg.problems], sampling


def _optional(msg: pb.SamplingParams, field: str):
    """The field's value when the sender set it, else None (the service's own setting)."""
    return getattr(msg, field) if msg.HasField(field) else None


def encode_result(r: RolloutResult) -> pb.Trajectory:
    t = r.trajectory
    return pb.Trajectory(
        problem_id=t.group_id,
        sample_index=t.sample_index,
        prompt_ids=t.prompt_ids,
        response_ids=t.response_ids,
        loss_mask=t.loss_mask,
        logprobs=t.logprobs,
        versions=t.versions,
        turns=t.turns,
        tool_calls=[
            pb.ToolCall(
                turn=c.turn,
                code=c.code,
                outcome=OUTCOME[c.outcome],
                latency_s=c.wall_s,
                name=c.name,
                stdin=c.stdin,
                message=c.message,
                response=c.response,
            )
            for c in t.tool_calls
        ],
        final_answer=t.final_answer or "",
        finish_reason=FINISH[t.finish_reason] if t.finish_reason else pb.FINISH_REASON_UNSPECIFIED,
        answer_blocks=t.answer_blocks,
        generate_s=t.timings.generate_s,
        tool_s=t.timings.tool_s,
        error=t.error,
        engine=r.engine,
        queued_s=r.queued_s,
    )


def decode_result(msg: pb.Trajectory) -> RolloutResult:
    t = Trajectory(
        group_id=msg.problem_id,
        sample_index=msg.sample_index,
        prompt_ids=list(msg.prompt_ids),
        response_ids=list(msg.response_ids),
        loss_mask=list(msg.loss_mask),
        logprobs=list(msg.logprobs),
        versions=_versions(msg),
        turns=msg.turns,
        answer_blocks=msg.answer_blocks,
        final_answer=msg.final_answer if msg.answer_blocks else None,
        finish_reason=_FINISH_BACK.get(msg.finish_reason, "error"),
        error=msg.error,
        timings=Timings(generate_s=msg.generate_s, tool_s=msg.tool_s),
    )
    for c in msg.tool_calls:
        t.record(
            ToolCallRecord(
                turn=c.turn,
                name=c.name,
                code=c.code,
                stdin=c.stdin,
                outcome=_OUTCOME_BACK.get(c.outcome, "error"),
                message=c.message,
                response=c.response,
                wall_s=c.latency_s,
            )
        )
    return RolloutResult(t, msg.engine, msg.queued_s)


def encode_info(version: str, policy: str, engines: list[EngineStatus]) -> pb.InfoResponse:
    return pb.InfoResponse(
        version=version,
        policy=policy,
        engines=[
            pb.EngineInfo(
                name=e.name,
                free_kv_tokens=e.capacity.free_tokens if e.capacity else 0,
                total_kv_tokens=e.capacity.total_tokens if e.capacity else 0,
                running=e.running,
                healthy=e.healthy,
                reserved_kv_tokens=e.reserved_tokens,
                dead_reason=e.dead_reason,
            )
            for e in engines
        ],
    )


def decode_info(msg: pb.InfoResponse) -> tuple[str, str, list[EngineStatus]]:
    engines = [
        EngineStatus(
            name=e.name,
            healthy=e.healthy,
            running=e.running,
            reserved_tokens=e.reserved_kv_tokens,
            capacity=KVCapacity(e.total_kv_tokens, e.free_kv_tokens) if e.total_kv_tokens else None,
            dead_reason=e.dead_reason,
        )
        for e in msg.engines
    ]
    return msg.version, msg.policy, engines


def _versions(msg: pb.Trajectory) -> list[int]:
    """The per-token weights versions, or all -1 (unknown) from a sender that sent none."""
    versions = list(msg.versions)
    return versions if len(versions) == len(msg.response_ids) else [-1] * len(msg.response_ids)

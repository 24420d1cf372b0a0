"""Conversions between the pydantic execution models and the sandbox.v1 protobuf messages.

Contract: lossless for every field both sides have; proto3's zero values mean "unset" (an empty
session id is no session, a zero timeout is the server default). Nothing else here.
"""

from __future__ import annotations

from rstar2_proto.sandbox.v1 import sandbox_pb2 as pb
from rstar2_sandbox.execution import ExecutionRequest, ExecutionResult, ExecutionStatus

_TO_PB = {
    ExecutionStatus.OK: pb.STATUS_OK,
    ExecutionStatus.ERROR: pb.STATUS_ERROR,
    ExecutionStatus.TIMEOUT: pb.STATUS_TIMEOUT,
    ExecutionStatus.MEMORY_EXCEEDED: pb.STATUS_MEMORY_EXCEEDED,
    ExecutionStatus.OUTPUT_TRUNCATED: pb.STATUS_OUTPUT_TRUNCATED,
    ExecutionStatus.REJECTED: pb.STATUS_REJECTED,
    ExecutionStatus.SANDBOX_ERROR: pb.STATUS_SANDBOX_ERROR,
}
_FROM_PB = {value: key for key, value in _TO_PB.items()}


def request_to_pb(request: ExecutionRequest) -> pb.ExecuteRequest:
    return pb.ExecuteRequest(
        code=request.code,
        stdin=request.stdin,
        timeout_s=request.timeout_s or 0.0,
        session_id=request.session_id or "",
        request_id=request.request_id,
    )


def request_from_pb(message: pb.ExecuteRequest) -> ExecutionRequest:
    """The request; a zero timeout is the default, a negative one is kept for validation."""
    return ExecutionRequest(
        code=message.code,
        stdin=message.stdin,
        timeout_s=message.timeout_s if message.timeout_s != 0 else None,
        session_id=message.session_id or None,
        request_id=message.request_id,
    )


def result_to_pb(result: ExecutionResult) -> pb.ExecuteResponse:
    return pb.ExecuteResponse(
        status=_TO_PB[result.status],
        stdout=result.stdout,
        stderr=result.stderr,
        traceback=result.traceback,
        result_repr=result.result_repr,
        exit_code=result.exit_code,
        wall_s=result.wall_s,
        cpu_s=result.cpu_s,
        request_id=result.request_id,
        message=result.message,
        queue_s=result.queue_s,
    )


def result_from_pb(message: pb.ExecuteResponse) -> ExecutionResult:
    return ExecutionResult(
        status=_FROM_PB.get(message.status, ExecutionStatus.REJECTED),
        stdout=message.stdout,
        stderr=message.stderr,
        traceback=message.traceback,
        result_repr=message.result_repr,
        exit_code=message.exit_code,
        wall_s=message.wall_s,
        cpu_s=message.cpu_s,
        queue_s=message.queue_s,
        request_id=message.request_id,
        message=message.message
        or ("" if message.status in _FROM_PB else f"unknown status {message.status}"),
    )

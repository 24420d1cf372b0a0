"""The execution contract: what a caller asks for, what comes back, and the `Sandbox` Protocol.

Every sandbox (the in-process `LocalSandbox`, the gRPC `SandboxClient`, the SandboxFusion HTTP
adapter) satisfies `Sandbox`, so a trainer swaps them by config. Outcomes are structured data:
callers count tool failures from `ExecutionResult.status`, never from words in the output.
This module holds no execution logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class ExecutionStatus(StrEnum):
    """How one execution ended."""

    OK = "ok"
    ERROR = "error"  # the code raised, or exited non-zero
    TIMEOUT = "timeout"  # the program used its own time (CPU, or asleep/blocked); killed
    MEMORY_EXCEEDED = "memory_exceeded"  # address-space limit reached
    OUTPUT_TRUNCATED = "output_truncated"  # ran, but stdout or stderr went over the cap
    REJECTED = "rejected"  # never ran: a bad request (or a cancelled call)
    SANDBOX_ERROR = "sandbox_error"  # the sandbox failed (lost, full, starved the call): retry


class ExecutionRequest(BaseModel):
    """One call of the tool: source code and its standard input."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(description="Python source to run.")
    stdin: str = Field(default="", description="Text fed to the program's standard input.")
    timeout_s: float | None = Field(
        default=None,
        description="Time limit from the child's start: its CPU time, and its wall time less "
        "what it waited for a CPU (a busy host never makes it a timeout); None: the default.",
    )
    session_id: str | None = Field(
        default=None, description="Run in this stateful session (globals persist)."
    )
    request_id: str = Field(default="", description="Echoed back in the result.")
    files: dict[str, bytes] = Field(
        default_factory=dict,
        description="Written under the call's working directory before it runs (one-shot calls;"
        " not carried over gRPC).",
    )
    fetch_files: tuple[str, ...] = Field(
        default=(), description="Read back from the working directory after the call ended."
    )


class ExecutionResult(BaseModel):
    """What one call produced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: ExecutionStatus
    stdout: str = ""
    stderr: str = ""
    traceback: str = Field(default="", description="Trimmed to the user's own frames.")
    result_repr: str = Field(
        default="", description="repr() of a trailing expression when nothing was printed."
    )
    exit_code: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    queue_s: float = Field(default=0.0, description="Time waiting for a worker before the start.")
    request_id: str = ""
    message: str = Field(default="", description="Why it was rejected, timed out, ...")
    files: dict[str, bytes] = Field(
        default_factory=dict, description="The fetch_files that existed (missing ones are absent)."
    )

    @property
    def failed(self) -> bool:
        """True for the outcomes a tool-error ratio counts: error, timeout, memory, rejected.

        A `sandbox_error` is not the code's failure and is not counted (see `sandbox_fault`)."""
        return self.status not in (
            ExecutionStatus.OK,
            ExecutionStatus.OUTPUT_TRUNCATED,
            ExecutionStatus.SANDBOX_ERROR,
        )

    @property
    def sandbox_fault(self) -> bool:
        """True when the sandbox, not the code, failed: the call may be retried elsewhere."""
        return self.status == ExecutionStatus.SANDBOX_ERROR


@runtime_checkable
class Sandbox(Protocol):
    """Anything that runs tool calls: local, remote over gRPC, or a third-party service."""

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run one call; never raises for the code's own failures (they are a status)."""
        raise NotImplementedError  # Protocol

    async def execute_many(self, requests: Sequence[ExecutionRequest]) -> list[ExecutionResult]:
        """Run many calls concurrently; results in request order."""
        raise NotImplementedError  # Protocol

    async def close(self) -> None:
        """Release workers, channels and sessions."""
        raise NotImplementedError  # Protocol

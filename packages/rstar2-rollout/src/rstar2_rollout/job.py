"""What the scheduler takes and hands back: a `Job`, its `JobResult`, an engine's `EngineStatus`.

Plain data, shared by the scheduler, the rollout service, the simulator and the trainer; the
scheduler's logic is in `scheduler.py`. `EngineDeadError` is what a job sees when its engine is
marked dead mid-turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rstar2_rollout.engine import Engine, KVCapacity

__all__ = ["EngineDeadError", "EngineStatus", "Job", "JobResult"]

T = TypeVar("T")


@dataclass(frozen=True)
class Job(Generic[T]):
    """One trajectory to run: `run(engine)` is called once with the engine of all its turns."""

    run: Callable[[Engine], Awaitable[T]]
    prompt_tokens: int
    max_response_tokens: int
    tag: Any = None  # handed back in the JobResult (e.g. the problem id and sample index)
    group: Any = None  # the problem it samples (siblings share it); None: unknown

    @property
    def reserve_tokens(self) -> int:
        """Worst-case KV tokens the job can hold: prompt plus the whole response budget."""
        return self.prompt_tokens + self.max_response_tokens


@dataclass(frozen=True)
class JobResult(Generic[T]):
    """What a job returned, or why it failed; times are the event loop's clock."""

    index: int
    tag: Any
    value: T | None
    error: str | None
    engine: str | None
    submitted_at: float
    started_at: float | None
    finished_at: float

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class EngineStatus:
    """One engine as the scheduler sees it."""

    name: str
    healthy: bool
    running: int
    reserved_tokens: int
    capacity: KVCapacity | None
    dead_reason: str = ""


class EngineDeadError(RuntimeError):
    """The engine a job runs on was marked dead."""

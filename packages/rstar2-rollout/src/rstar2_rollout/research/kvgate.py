"""The books of the scheduler's `kv_progress` policy on one engine: which turns it runs, how far
each has come, and whether another fits.

`TurnGate` keeps, for one engine, the turns admitted there (request id -> context, max tokens),
the jobs admitted whose first turn has not begun, and the turns waiting for room. It turns them
and the engine's `EngineProgress` into the inputs of `kvbound.peak_kv_tokens`:

- a turn the report shows decoding: a curve that ends when its `max_tokens` are spent;
- a turn not in the report yet (or a job that has not called generate, or the turn about to be
  admitted): it has not started, so it may start at any later step, growing a token a step;
- a turn the report showed before and no longer does: finished, if the engine preempted nothing
  since; otherwise (or when the engine cannot count preemptions) at its worst case throughout;
- every turn at its worst case when the engine reports no progress at all.

A report may be old (a Ray actor's answer): requests then look further from their end than they
are, which only makes the bound larger. The gate knows nothing of asyncio or of other engines;
the scheduler admits, waits and dispatches. Capacity comes in as arguments, because reading it can
find the engine dead, which is the scheduler's business.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import cast

from rstar2_rollout.engine import Engine, EngineProgress, ProgressEngine
from rstar2_rollout.research.config import KVProgressPolicy
from rstar2_rollout.research.kvbound import peak_kv_tokens


@dataclass(eq=False)
class _InEngine:
    """An admitted turn. `seen`: the engine's preemption count when the turn was first reported
    decoding (-1: the engine cannot count them; None: not reported yet)."""

    context: int
    max_tokens: int
    seen: int | None = None


@dataclass(eq=False)
class WaitingTurn:
    """A generation call waiting for room; `admitted` resolves once it is in the books."""

    request_id: str
    context: int
    max_tokens: int
    admitted: asyncio.Future[None]


class TurnGate:
    """kv_progress's books for one engine (see the module docstring)."""

    def __init__(self, engine: Engine, policy: KVProgressPolicy) -> None:
        self.policy = policy
        self._engine = cast(ProgressEngine, engine) if isinstance(engine, ProgressEngine) else None
        self._turns: dict[str, _InEngine] = {}
        self._held: dict[int, tuple[int, int]] = {}  # job index -> prompt, max response tokens
        self.waiting: deque[WaitingTurn] = deque()
        self._room: tuple[int, int] | None = None  # (max response tokens, room): a lower bound
        self.dirty = False  # something ended (or time passed) since waiting turns were looked at
        self._block = 1  # the engine's KV block size, from its last report
        self._max_running: int | None = None  # its max_num_seqs, from its last report

    # ---- what fits -------------------------------------------------------------------------

    def progress(self) -> EngineProgress | None:
        progress = self._engine.progress() if self._engine is not None else None
        if progress is not None:
            self._block, self._max_running = progress.block_tokens, progress.max_running
        return progress

    def plan(self, total: int) -> int:
        """KV tokens to plan with on an engine of `total`: less the headroom share."""
        return total - int(total * self.policy.headroom)

    def largest(self, total: int) -> int:
        """The largest context + max_tokens one turn can have: the plan, less the lag
        allowance and a partly filled block. An engine that reports no progress tells no block
        size: its blocks count as 1 token, and the lag allowance (`lag_steps` a turn, every turn
        at its worst case) covers a partly filled block of up to `lag_steps` + 1 tokens."""
        self.progress()
        return self.plan(total) - self.policy.lag_steps - (self._block - 1)

    def bound(
        self, new: tuple[int, int] | None = None, progress: EngineProgress | None = None
    ) -> int:
        """`peak_kv_tokens` of the books (and of `new`, about to be admitted), as of `progress`."""
        lag = self.policy.lag_steps
        block = progress.block_tokens if progress is not None else self._block
        top = lag + block - 1  # what a turn may grow past context + max_tokens
        running, pending, held = [], [*self._held.values()], 0
        if new is not None:
            pending.append(new)
        if progress is None:  # nothing tells how far a turn is: each at its worst case
            held = sum(t.context + t.max_tokens + top for t in self._turns.values())
            return peak_kv_tokens(running, pending, held, lag, block)
        generated, preemptions = progress.generated, progress.preemptions
        for request_id, turn in self._turns.items():
            done = generated.get(request_id)
            if done is not None:
                if turn.seen is None:
                    turn.seen = preemptions if preemptions is not None else -1
                running.append((turn.context + done, turn.max_tokens - done))
            elif turn.seen is None:  # not started as of the report
                pending.append((turn.context, turn.max_tokens))
            elif turn.seen == -1 or turn.seen != preemptions:
                # gone, and perhaps preempted: it may be recomputed at once, to its worst case
                held += turn.context + turn.max_tokens + top
            # else: reported before, gone, and nothing was preempted since: it has finished
        return peak_kv_tokens(running, pending, held, lag, block)

    def cached_room(self, max_response_tokens: int) -> int | None:
        """`room` as last computed, or None. Time only adds room (every running turn gets closer
        to its end), so a cached value stays a safe lower bound until something is admitted."""
        if self._room is None or self._room[0] != max_response_tokens:
            return None
        return self._room[1]

    def room(self, total: int, max_response_tokens: int) -> int:
        """The largest prompt a new job could bring now (computed afresh, then cached)."""
        bound = self.bound((0, max_response_tokens), self.progress())
        self._room = (max_response_tokens, self.plan(total) - bound)
        return self._room[1]

    def full(self) -> bool:
        """The engine decodes as many requests as it can at once (vLLM's max_num_seqs, as of its
        last report)."""
        most = self._max_running
        return most is not None and len(self._turns) + len(self._held) >= most

    def fits(self, context: int, max_tokens: int, total: int, free: int | None) -> bool:
        """Whether a turn can be admitted now; `free`: the engine's free KV tokens, if known."""
        progress = self.progress()
        if self.full():
            return False
        if self.bound((context, max_tokens), progress) > self.plan(total):
            return False
        return free is None or context <= free

    # ---- the books -------------------------------------------------------------------------

    def hold(self, job: int, prompt_tokens: int, max_response_tokens: int) -> None:
        """A job was admitted here: count it until its first turn begins."""
        self._held[job] = (prompt_tokens, max_response_tokens)
        self._room = None

    def first_turn(self, job: int, request_id: str, context: int, max_tokens: int) -> bool:
        """If `job` is held and the turn is within what it was admitted with, the turn takes
        its place (True); otherwise the hold is dropped and the turn must be admitted (False)."""
        held = self._held.pop(job, None)
        if held is None:
            return False
        if context <= held[0] and max_tokens <= held[1]:
            self._turns[request_id] = _InEngine(context, max_tokens)
            return True
        self.touch()
        return False

    def has(self, request_id: str) -> bool:
        """A turn with this request id is in the books or waiting."""
        return request_id in self._turns or any(t.request_id == request_id for t in self.waiting)

    def admit(self, request_id: str, context: int, max_tokens: int) -> None:
        self._turns[request_id] = _InEngine(context, max_tokens)
        self._room = None

    def leave(self, request_id: str) -> bool:
        """The turn is over; False if it was not in the books."""
        if self._turns.pop(request_id, None) is None:
            return False
        self.touch()
        return True

    def release(self, job: int) -> None:
        """The job ended before its first turn began."""
        if self._held.pop(job, None) is not None:
            self.touch()

    def touch(self) -> None:
        """Something ended, or time passed: the room and the waiting turns are worth a new look."""
        self._room = None
        self.dirty = True

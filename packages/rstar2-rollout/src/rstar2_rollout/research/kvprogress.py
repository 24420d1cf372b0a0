"""kv_progress as a `Admission`: the paper's promise turn by turn on the exact worst case.

Research code (not the default; see SCHEDULER.md "Results"): each engine's books are a
`kvgate.TurnGate`; a new job goes to the engine with the most room for its first turn at its
maximum length, and every later turn waits on its engine until `kvbound.peak_kv_tokens` of the
engine's turns plus this one fits. No preemption, ever. Built by `scheduler.make_admission` only
when `SchedulerConfig.policy.kind == "kv_progress"`.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from rstar2_rollout.admission import Admission, Entry, Pool, Slot
from rstar2_rollout.engine import Generation
from rstar2_rollout.job import EngineDeadError
from rstar2_rollout.research.config import KVProgressPolicy
from rstar2_rollout.research.kvgate import TurnGate, WaitingTurn


class KVProgress(Admission):
    """The paper's promise turn by turn on the exact worst case (`kvgate.TurnGate` per engine)."""

    def __init__(self, pool: Pool, policy: KVProgressPolicy) -> None:
        super().__init__(pool)
        self.policy = policy
        self.recheck_interval_s = policy.recheck_interval_s
        self.gates = {s.index: TurnGate(s.engine, policy) for s in pool.slots}

    def reserved(self, slot: Slot) -> int:
        gate = self.gates[slot.index]
        return gate.bound(None, gate.progress())

    def fits(self, reserve_tokens: int) -> bool:
        return any(
            s.alive
            and reserve_tokens <= self.gates[s.index].largest(self.pool.total_and_free(s)[0])
            for s in self.pool.slots
        )

    def too_large(self, entry: Entry) -> str:
        return (
            f"job needs {entry.job.reserve_tokens} KV tokens; no live engine can hold"
            " that many for one turn"
        )

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        """The engine with the most room for the job's first turn at its maximum length; engines
        whose own turns wait for room take no new job."""
        job = entry.job
        candidates = []
        for slot in list(self.alive()):
            gate = self.gates[slot.index]
            if gate.waiting or gate.full():
                continue
            room = gate.cached_room(job.max_response_tokens)
            if room is None:  # something changed here: read the engine again
                room = gate.room(self.pool.total_and_free(slot)[0], job.max_response_tokens)
            if room >= job.prompt_tokens:
                candidates.append((room, -slot.index, slot))
        for _, _, slot in sorted(candidates, key=lambda c: c[:2], reverse=True):
            cap = self.pool.capacity(slot)
            if slot.alive and (cap is None or job.prompt_tokens <= cap.free_tokens):
                return slot
        return "wait" if self.fits(job.reserve_tokens) else None

    def on_start(self, entry: Entry, slot: Slot) -> None:
        self.gates[slot.index].hold(
            entry.index, entry.job.prompt_tokens, entry.job.max_response_tokens
        )

    def on_finish(self, entry: Entry, slot: Slot) -> None:
        self.gates[slot.index].release(entry.index)

    async def enter_turn(
        self, slot: Slot, job: int, request_id: str, context: int, max_tokens: int
    ) -> str:
        gate = self.gates[slot.index]
        if gate.has(request_id):  # its books are by request id: a second one would hide the first
            return f"request id {request_id!r} is already running on engine {slot.engine.name}"
        if gate.first_turn(job, request_id, context, max_tokens):
            return ""  # admitted with its job
        total, free = self.pool.total_and_free(slot)
        if not slot.alive:  # its capacity probe just failed
            raise EngineDeadError(f"engine {slot.engine.name} is dead: {slot.dead_reason}")
        need, largest = context + max_tokens, gate.largest(total)
        if need > largest:
            return (
                f"turn needs {need} KV tokens (context {context} + max_tokens {max_tokens});"
                f" engine {slot.engine.name} can hold {largest} for one turn"
            )
        if not gate.waiting and gate.fits(context, max_tokens, total, free):
            gate.admit(request_id, context, max_tokens)
            return ""
        turn = WaitingTurn(
            request_id, context, max_tokens, asyncio.get_running_loop().create_future()
        )
        gate.waiting.append(turn)
        self.pool.schedule_recheck()
        try:
            await turn.admitted
        except asyncio.CancelledError:
            if turn in gate.waiting:
                gate.waiting.remove(turn)
                gate.touch()  # the turns behind it may fit now
                self.pool.dispatch()
            else:
                self.leave_turn(slot, job, request_id, None)
            raise
        return ""

    def leave_turn(self, slot: Slot, job: int, request_id: str, out: Generation | None) -> None:
        if self.gates[slot.index].leave(request_id):
            self.pool.dispatch()

    def before_dispatch(self) -> None:
        """Admit waiting turns, oldest first on each engine, where something changed."""
        for slot in list(self.alive()):
            gate = self.gates[slot.index]
            if not gate.dirty:
                continue
            gate.dirty = False
            total, free = self.pool.total_and_free(slot)
            while gate.waiting:
                turn = gate.waiting[0]
                if turn.admitted.done():  # its job was cancelled
                    gate.waiting.popleft()
                    continue
                if not gate.fits(turn.context, turn.max_tokens, total, free):
                    break
                gate.waiting.popleft()
                gate.admit(turn.request_id, turn.context, turn.max_tokens)
                turn.admitted.set_result(None)
        if any(self.gates[s.index].waiting for s in self.alive()):
            self.pool.schedule_recheck()

    def on_recheck(self) -> None:
        for gate in self.gates.values():  # the engines moved on: every bound may have fallen
            gate.touch()

"""Reproduces the dispatch of peer frameworks as `Admission` policies; the engine admits by itself.

None of these looks at the KV cache: a job is handed to an engine at once (or when a count cap
allows) and the engine queues, admits and preempts by itself, as it does under each framework.

- `StaticSlices` (verl v0.2 `DataProto.chunk`): engine e takes the e-th contiguous slice of the
  batch, so a problem's samples share an engine. A lone `submit` goes round robin.
- `RoundRobin` (AReaL without a cap, SkyRL's random spread): job i to engine i mod E.
- `PowerOfTwo` (sglang-router `power_of_two`): two engines drawn at random, the less loaded.
- `CacheAware` (sglang-router `cache_aware`): the engine whose radix tree already holds the
  job's prompt (its problem's siblings went there) unless the load is imbalanced, then the
  shortest queue; with no match, the engine with the smallest tree.
- `LeastTokens`: the engine with the fewest outstanding tokens (KV in use, by its report, plus
  the prompts of jobs handed to it that have not started).

Not covered: the routers' HTTP layer and their approximate string trees (a job's prompt is taken
to match fully where a sibling went, and a tree's size is the prompt tokens routed to it).
"""

from __future__ import annotations

import random
from typing import Any, Literal

from rstar2_rollout.admission import Admission, Entry, Pool, Slot
from rstar2_rollout.research.config import (
    CacheAwarePolicy,
    LeastTokensPolicy,
    PowerOfTwoPolicy,
)


class RoundRobin(Admission):
    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        alive = list(self.alive())
        return alive[entry.index % len(alive)] if alive else None


class StaticSlices(RoundRobin):
    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        if entry.batch is None:  # a lone submit: no batch to slice
            return super().place(entry)
        alive = list(self.alive())
        pos, size = entry.batch
        return alive[pos * len(alive) // size] if alive else None


class PowerOfTwo(Admission):
    def __init__(self, pool: Pool, policy: PowerOfTwoPolicy) -> None:
        super().__init__(pool)
        self._rng = random.Random(policy.seed)

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        alive = list(self.alive())
        if len(alive) < 2:
            return alive[0] if alive else None
        a, b = self._rng.sample(alive, 2)
        return min((a, b), key=lambda s: (len(s.running), s.index))


class CacheAware(Admission):
    def __init__(self, pool: Pool, policy: CacheAwarePolicy) -> None:
        super().__init__(pool)
        self.policy = policy
        self._groups: dict[int, set[Any]] = {s.index: set() for s in pool.slots}
        self._tree: dict[int, int] = {s.index: 0 for s in pool.slots}

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        alive = list(self.alive())
        if not alive:
            return None
        loads = [len(s.running) for s in alive]
        p = self.policy
        if max(loads) - min(loads) > p.balance_abs_threshold and max(loads) > (
            p.balance_rel_threshold * min(loads)
        ):
            slot = min(alive, key=lambda s: (len(s.running), s.index))
        else:
            group = entry.job.group
            hits = [s for s in alive if group is not None and group in self._groups[s.index]]
            if hits:  # the whole prompt matches there: rate 1.0 > cache_threshold
                slot = min(hits, key=lambda s: (len(s.running), s.index))
            else:
                slot = min(alive, key=lambda s: (self._tree[s.index], s.index))
        self._groups[slot.index].add(entry.job.group)
        self._tree[slot.index] += entry.job.prompt_tokens
        return slot


class LeastTokens(Admission):
    def __init__(self, pool: Pool, policy: LeastTokensPolicy) -> None:
        super().__init__(pool)
        self._pending: dict[int, dict[int, int]] = {s.index: {} for s in pool.slots}

    def _outstanding(self, slot: Slot) -> int:
        cap = self.pool.capacity(slot)
        used = cap.total_tokens - cap.free_tokens if cap is not None else 0
        return used + sum(self._pending[slot.index].values())

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        alive = list(self.alive())
        scored = [(self._outstanding(s), s.index, s) for s in alive]
        scored = [c for c in scored if c[2].alive]
        return min(scored, key=lambda c: c[:2])[2] if scored else None

    def on_start(self, entry: Entry, slot: Slot) -> None:
        self._pending[slot.index][entry.index] = entry.job.prompt_tokens

    async def enter_turn(
        self, slot: Slot, job: int, request_id: str, context: int, max_tokens: int
    ) -> str:
        self._pending[slot.index].pop(job, None)  # in the engine now: its report counts it
        return ""

    def on_finish(self, entry: Entry, slot: Slot) -> None:
        self._pending[slot.index].pop(entry.index, None)

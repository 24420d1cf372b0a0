"""The `forecast` policy: a work-conserving central queue, admission on a forecast of the KV each
engine's rollouts will hold, the engine's own preemption as the fallback.

Jobs wait in the scheduler's queue, not in an engine's, so none is committed to an engine that is
busy while another has room. A job starts on the engine running the fewest jobs, if fewer than
that engine's limit run there:

- **Forecast limit**: the engine's KV tokens x (1 - `headroom`) over the forecast mean context of
  a running job, `prompt + E[L^2] / (2 E[L])` (a job is running for as long as it is long and is
  halfway through on average). The moments of the response length L come from `lengths`, a
  Kaplan-Meier estimate over this batch's finished jobs (observed) and running jobs (their tokens
  so far, from the contexts their turns bring and the engine's progress report: censored), with
  the mass past the last observation at the budget; before anything is known, `prior_share` of
  the budget. Early in a step, when only short jobs have finished, it leans long.
- **Feedback**: while the engine's reported KV use and the running jobs' forecast use stay under
  `target_share`, the limit rises by what fits; when the engine preempts (its progress report
  counts preemptions) the limit drops to `backoff` x what runs there, then creeps back by one
  per `recheck_interval_s`.
- Turns are not gated: a short forecast costs a vLLM-V1 preemption (one request, its prefix
  cached), not a failure.
- `order: longest_expected` sorts the queue by the expected length of each problem's samples
  (finished and running siblings, `Job.group`), dealing samples one per problem in turn while
  nothing is known; measured slower than FIFO in the simulator, so off by default.

Not covered: aborting stragglers (RoC's oversampling could drop them; that changes which
trajectories train, so it is the trainer's call), moving a running job.
"""

from __future__ import annotations

import asyncio
from bisect import insort
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from rstar2_rollout.admission import Admission, Entry, Pool, Slot
from rstar2_rollout.engine import Generation, ProgressEngine
from rstar2_rollout.research.config import ForecastPolicy


@dataclass(eq=False)
class _Track:
    """A running job as the policy follows it."""

    prompt: int
    budget: int
    group: Any
    context: int  # prompt + tokens so far, as of its last turn's start or end
    turn: str | None = None  # request id of the turn it runs now
    turns: int = 0


class Forecast(Admission):
    """See the module docstring."""

    def __init__(self, pool: Pool, policy: ForecastPolicy) -> None:
        super().__init__(pool)
        self.policy = policy
        self.recheck_interval_s = policy.recheck_interval_s
        self._jobs: dict[int, dict[int, _Track]] = {s.index: {} for s in pool.slots}
        self._finished: list[int] = []  # response lengths of finished jobs, sorted
        self._group_done: dict[Any, list[int]] = {}
        self._group_rank: dict[Any, int] = {}  # samples of each group seen so far
        self._rank: dict[int, int] = {}  # job index -> its sample rank in its group
        self._sorted_at: float | None = None
        self._stats_at: float | None = None
        self._limits: dict[int, int] = {}
        self._limits_at: float | None = None
        self._preempted: dict[int, int | None] = {}
        self._ceiling: dict[int, int] = {}  # per engine: lowered when it preempts
        self._moments: tuple[float, float] | None = None  # E[L], E[L^2]
        self._prompt_sum, self._started, self._budget = 0, 0, 0

    # ---- forecasts -------------------------------------------------------------------------

    def mean_context(self, budget: int, prompt: float) -> float:
        """Forecast mean KV context of a running job: its prompt plus E[L^2] / (2 E[L]) (a job
        is running for as long as it is long, and is halfway through on average), with the
        moments of the length L from `lengths` (`prior_share` of the budget before any)."""
        if self._moments is None:
            return prompt + self.policy.prior_share * budget
        m1, m2 = self._moments
        return prompt + m2 / (2 * m1) if m1 > 0 else float(prompt)

    def _generated(self, slot: Slot) -> dict[str, int]:
        engine = slot.engine
        report = engine.progress() if isinstance(engine, ProgressEngine) else None
        return dict(report.generated) if report is not None else {}

    def limit(self, slot: Slot, total: int) -> int:
        """Jobs the engine can run at once with its KV cache about full: total x (1 - headroom)
        over the forecast mean context, within its max_running."""
        prompt = self._prompt_sum / self._started if self._started else 0.0
        budget = self._budget
        fit = int(total * (1 - self.policy.headroom) / max(1.0, self.mean_context(budget, prompt)))
        return max(1, min(fit, self._max_running(slot)))

    # ---- hooks -----------------------------------------------------------------------------

    def order(self, queue: deque[Entry]) -> None:
        if self.policy.order == "fifo":
            return
        now = asyncio.get_running_loop().time()
        if self._sorted_at is not None and now - self._sorted_at < self.policy.reorder_interval_s:
            return  # jobs submitted since wait at the end, in order, until the next sort
        self._sorted_at = now
        for e in queue:
            if e.index not in self._rank:
                g = e.job.group if e.job.group is not None else ("job", e.index)
                self._rank[e.index] = self._group_rank.get(g, 0)
                self._group_rank[g] = self._rank[e.index] + 1
        budget = self._budget or 1
        prior = self.policy.prior_share * budget
        seen: dict[Any, list[float]] = {}  # group -> what its started siblings tell
        for g, done in self._group_done.items():
            seen[g] = [float(x) for x in done]
        for slot in self.pool.slots:
            generated = self._generated(slot) if self._jobs[slot.index] else {}
            for t in self._jobs[slot.index].values():
                ctx = t.context + (generated.get(t.turn, 0) if t.turn is not None else 0)
                seen.setdefault(t.group, []).append(max(prior, ctx - t.prompt))
        expect = {g: sum(v) / len(v) for g, v in seen.items()}

        def key(e: Entry) -> tuple[float, int, int]:
            g = e.job.group
            return (-expect.get(g, prior), self._rank[e.index], e.index)

        ordered = sorted(queue, key=key)
        queue.clear()
        queue.extend(ordered)

    def place(self, entry: Entry) -> Slot | Literal["wait"] | None:
        """The engine running the fewest jobs, if that is below its limit."""
        self._budget = max(self._budget, entry.job.max_response_tokens)
        self._refresh()
        best = None
        for slot in list(self.alive()):
            n = len(self._jobs[slot.index])
            if best is not None and n >= len(self._jobs[best.index]):
                continue
            limit = self._limits.get(slot.index)
            if limit is None:
                limit = self._limits[slot.index] = self._limit_now(slot)
            if slot.alive and n < limit:
                best = slot
        if best is not None:
            return best
        return "wait" if any(True for _ in self.alive()) else None

    def _limit_now(self, slot: Slot) -> int:
        """The forecast limit, raised while the engine's KV cache has room and it preempted
        nothing since the last look, held at what runs there once it has preempted."""
        total, free = self.pool.total_and_free(slot)
        if total <= 0:  # the engine reports no KV capacity: only its (or the fallback) count
            return self._max_running(slot)
        forecast = self.limit(slot, total)
        engine = slot.engine
        report = engine.progress() if isinstance(engine, ProgressEngine) else None
        preempted = report.preemptions if report is not None else None
        seen = self._preempted.get(slot.index)
        self._preempted[slot.index] = preempted
        running = len(self._jobs[slot.index])
        most = self._max_running(slot)
        ceiling = self._ceiling.get(slot.index, most)
        if preempted is not None and seen is not None and preempted > seen:
            ceiling = max(1, int(running * self.policy.backoff))  # it overflowed: back off
        else:
            ceiling = min(most, ceiling + 1)  # and creep back up while it does not
        self._ceiling[slot.index] = ceiling
        if free is None:
            return min(ceiling, forecast)
        budget = self._budget or 1
        prompt = self._prompt_sum / self._started if self._started else 0.0
        mean = max(1.0, self.mean_context(budget, prompt))
        # what the running jobs hold now, or will on average, whichever is more
        planned = max(total - free, running * mean)
        more = int((total * self.policy.target_share - planned) / mean)
        return min(ceiling, max(forecast, running + more))

    def _refresh(self) -> None:
        """Re-read the engines every `recheck_interval_s`, re-estimate the length distribution
        every `reorder_interval_s`."""
        now = asyncio.get_running_loop().time()
        if self._limits_at is None or now - self._limits_at >= self.policy.recheck_interval_s:
            self._limits_at = now
            self._limits.clear()
        if self._stats_at is not None and now - self._stats_at < self.policy.reorder_interval_s:
            return
        self._stats_at = now
        censored = []
        for slot in self.pool.slots:
            generated = self._generated(slot) if self._jobs[slot.index] else {}
            for t in self._jobs[slot.index].values():
                ctx = t.context + (generated.get(t.turn, 0) if t.turn is not None else 0)
                censored.append(ctx - t.prompt)
        self._moments = lengths(self._finished, censored, self._budget)
        self._limits.clear()

    def _max_running(self, slot: Slot) -> int:
        engine = slot.engine
        report = engine.progress() if isinstance(engine, ProgressEngine) else None
        most = report.max_running if report is not None else None
        return most if most is not None else self.policy.max_running_fallback

    def on_start(self, entry: Entry, slot: Slot) -> None:
        job = entry.job
        group = job.group if job.group is not None else ("job", entry.index)
        self._jobs[slot.index][entry.index] = _Track(
            job.prompt_tokens, job.max_response_tokens, group, job.prompt_tokens
        )
        self._prompt_sum += job.prompt_tokens
        self._started += 1

    def on_finish(self, entry: Entry, slot: Slot) -> None:
        t = self._jobs[slot.index].pop(entry.index, None)
        self._rank.pop(entry.index, None)
        if t is None or t.turns == 0:
            return
        length = t.context - t.prompt
        insort(self._finished, length)
        insort(self._group_done.setdefault(t.group, []), length)

    async def enter_turn(
        self, slot: Slot, job: int, request_id: str, context: int, max_tokens: int
    ) -> str:
        t = self._jobs[slot.index].get(job)
        if t is not None:
            t.context, t.turn = context, request_id
            t.turns += 1
        return ""

    def leave_turn(self, slot: Slot, job: int, request_id: str, out: Generation | None) -> None:
        t = self._jobs[slot.index].get(job)
        if t is not None:
            t.turn = None
            if out is not None:
                t.context += len(out.token_ids)
        self.pool.dispatch()

    def on_recheck(self) -> None:
        self._limits_at = None


def lengths(finished: list[int], running: list[int], budget: int) -> tuple[float, float] | None:
    """E[L] and E[L^2] of the response length L by Kaplan-Meier: `finished` lengths are
    observed, `running` jobs are known only to be longer than their tokens so far (censored);
    the mass left past the last observation is put at the `budget` (the cap), so early on, when
    only short jobs have finished, the estimate leans long. None when nothing is known."""
    if not finished and not running:
        return None
    points = sorted([(x, 1) for x in finished] + [(x, 0) for x in running])
    at_risk, survive, m1, m2, i = len(points), 1.0, 0.0, 0.0, 0
    while i < len(points):
        x, events, leaving = points[i][0], 0, 0
        while i < len(points) and points[i][0] == x:
            events += points[i][1]
            leaving += 1
            i += 1
        if events:
            mass = survive * events / at_risk
            m1, m2, survive = m1 + mass * x, m2 + mass * x * x, survive - mass
        at_risk -= leaving
    return m1 + survive * budget, m2 + survive * budget * budget

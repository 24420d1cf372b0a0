"""Simulated inference engines on a virtual clock, for the rollout simulator (`simulate`).

`SimEngine` implements the `Engine` Protocol over the running event loop's clock: a continuous-
batching engine with a KV cache of `kv_tokens`. Each decode step every running request gains one
token; a step takes `base + per_request * running + per_kv_token * kv_in_use` seconds (decode
reads the weights once and every cached token once). New requests (and new turns) join when their
context fits; their uncached tokens are prefilled at `prefill_tokens_per_s`. A finished turn's
context stays in an LRU prefix cache keyed by the request id up to its last "/" (`job-7/turn-2`),
evicted as space is needed. When the running requests outgrow the cache the engine preempts half
of them, newest first, and recomputes them later, as SGLang does (rStar2-Agent paper §3.2). The
simulated model writes filler tokens: as many as its `script` says for the request id (the
workload draws every turn's length in advance) and then stops, as a model stops at its end token;
`params.max_tokens` when the script has no entry. So callers can ask for the whole remaining
budget, as the agent loop does, without the engine or a scheduler learning how long a turn is.

`EngineModel.qwen3_14b_mi300x(tp)` derives an engine's numbers (KV tokens, step costs, prefill
speed) from the paper's hardware for tensor-parallel degree 1 or more.

`VirtualClockLoop` is an asyncio loop whose clock jumps to the next timer instead of sleeping, so
a run over 16k trajectories and 64 engines takes seconds of simulated work, deterministically.
Not modelled: network time, sampling itself, speculative decoding, engine-side admission with a
decode reserve (SGLang's `new_token_ratio`).
"""

from __future__ import annotations

import asyncio
import selectors
from collections import OrderedDict, deque
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rstar2_rollout.engine import EngineProgress, Generation, KVCapacity, SamplingParams

R = TypeVar("R")


class _VirtualSelector(selectors.SelectSelector):
    """Polls real file descriptors without waiting, then advances the loop's virtual clock."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if events:
            return events
        if timeout is None:
            raise RuntimeError("simulation deadlocked: nothing scheduled and nothing ready")
        self._loop._now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: `asyncio.sleep(60)` returns at once, 60 s later."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self._now


def run_virtual(main: Coroutine[Any, Any, R]) -> R:
    """Run a coroutine to completion on a fresh `VirtualClockLoop`."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


# Qwen3-14B (the paper's model) on AMD MI300X (the paper's GPU), used by `EngineModel`.
_GPU_BYTES = 192e9
_MEMORY_FRACTION = 0.8  # SGLang mem_fraction_static in the paper's port (weights + KV cache)
_WEIGHT_BYTES = 29.5e9  # 14.8B parameters in bf16
_ACTIVATION_BYTES = 6e9  # per GPU: CUDA graphs, sampler and activation buffers
_KV_BYTES_PER_TOKEN = 2 * 40 * 8 * 128 * 2  # K and V, 40 layers, 8 KV heads of 128, bf16: 160 KiB
_WEIGHT_READ_BYTES_PER_S = 2.95e12  # effective HBM bandwidth reading weights (5.3 TB/s peak)
_KV_READ_BYTES_PER_S = 3.7e12  # effective HBM bandwidth reading the KV cache
_ALLREDUCE_S = 15e-6  # one small all-reduce between TP ranks; two per layer per step
_PREFILL_TOKENS_PER_S_PER_GPU = 15_000.0
_TP_EFFICIENCY = 0.85  # prefill scaling over TP ranks


@dataclass(frozen=True)
class EngineModel:
    """Speed and memory of one simulated engine (defaults: Qwen3-14B on one MI300X, TP=1)."""

    kv_tokens: int = 720_000
    base_step_s: float = 0.010
    per_request_step_s: float = 30e-6
    per_kv_token_step_s: float = 44e-9
    prefill_tokens_per_s: float = 15_000.0
    max_chunk_steps: int = 16  # new requests join at most this many steps late
    admit_watermark: float = 0.01  # keep this share of the cache free when admitting
    filler_token_id: int = 0

    @classmethod
    def qwen3_14b_mi300x(cls, tp: int = 1) -> EngineModel:
        """One engine of `tp` MI300X GPUs serving Qwen3-14B. Every rank holds 1/tp of the weights
        and 1/tp of each token's KV heads, so the cache holds `tp` times more tokens per GPU-byte
        and a decode step reads 1/tp of the bytes per rank, plus two all-reduces per layer.
        tp=1 gives the defaults: (0.8 x 192 GB - 29.5 GB - 6 GB) / 160 KiB = 720K tokens, 10 ms
        per step for the weights, 44 ns per cached token; tp=4 (the public port's setting):
        3.42M tokens, 3.7 ms, 11 ns."""
        if tp < 1 or 8 % tp:
            raise ValueError(f"tp must divide the 8 KV heads of Qwen3-14B, got {tp}")
        free = _GPU_BYTES * _MEMORY_FRACTION - _WEIGHT_BYTES / tp - _ACTIVATION_BYTES
        kv_per_rank = _KV_BYTES_PER_TOKEN / tp
        base = _WEIGHT_BYTES / tp / _WEIGHT_READ_BYTES_PER_S
        if tp > 1:
            base += 2 * 40 * _ALLREDUCE_S
        prefill = _PREFILL_TOKENS_PER_S_PER_GPU * tp * (_TP_EFFICIENCY if tp > 1 else 1.0)
        return cls(
            kv_tokens=int(round(free / kv_per_rank, -4)),
            base_step_s=round(base, 4),
            per_kv_token_step_s=round(kv_per_rank / _KV_READ_BYTES_PER_S, 9),
            prefill_tokens_per_s=prefill,
        )


@dataclass(eq=False)
class _Request:
    request_id: str
    session: str
    context: int
    remaining: int  # steps until the request stops: its scripted length, at most max_tokens
    generated: int
    future: asyncio.Future[int]
    preempted: bool = False


@dataclass
class EngineStats:
    busy_s: float = 0.0
    preemption_events: int = 0
    preempted_requests: int = 0
    prefill_tokens: int = 0
    recomputed_tokens: int = 0
    decoded_tokens: int = 0
    steps: int = 0
    peak_kv_tokens: int = 0  # the most KV the running requests ever held at once


class SimEngine:
    """A simulated continuous-batching engine (see the module docstring); an `Engine`."""

    def __init__(
        self, name: str, model: EngineModel | None = None, script: dict[str, int] | None = None
    ) -> None:
        self.name = name
        self.model = model or EngineModel()
        self.script = script if script is not None else {}  # request id -> tokens to write
        self.stats = EngineStats()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._used = 0
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure = ""

    def kv_capacity(self) -> KVCapacity:
        if self._failure:
            raise RuntimeError(f"engine {self.name} is down: {self._failure}")
        return KVCapacity(self.model.kv_tokens, self.model.kv_tokens - self._used)

    def progress(self) -> EngineProgress:
        """The running requests' generated tokens as of the last decode chunk (`ProgressEngine`)."""
        generated = {r.request_id: r.generated for r in self._running}
        return EngineProgress(
            generated, preemptions=self.stats.preempted_requests, step=self.stats.steps
        )

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if self._failure:
            return Generation([], finish_reason="error", error=self._failure)
        if len(prompt_ids) + params.max_tokens > self.model.kv_tokens:
            return Generation(
                [], finish_reason="error", error="prompt + max_tokens exceeds the KV cache"
            )
        loop = asyncio.get_running_loop()
        req = _Request(
            request_id,
            request_id.rpartition("/")[0] or request_id,
            len(prompt_ids),
            min(params.max_tokens, self.script.pop(request_id, params.max_tokens)),
            0,
            loop.create_future(),
        )
        self._waiting.append(req)
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve())
        assert self._wake is not None
        self._wake.set()
        try:
            n = await req.future
        except RuntimeError as exc:
            return Generation([], finish_reason="error", error=str(exc))
        ids = [self.model.filler_token_id] * n
        reason = "length" if n >= params.max_tokens else "stop"
        return Generation(ids, [0.0] * n if params.logprobs else [], finish_reason=reason)

    def fail(self, reason: str) -> None:
        """Simulate a crash: every pending and later call fails with `reason`."""
        self._failure = reason
        for req in [*self._waiting, *self._running]:
            if not req.future.done():
                req.future.set_exception(RuntimeError(reason))
        self._waiting.clear()
        self._running.clear()
        self._used = 0
        if self._task is not None:
            self._task.cancel()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self._cache.clear()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _serve(self) -> None:
        m, stats = self.model, self.stats
        assert self._wake is not None
        while True:
            prefill = self._admit()
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            b, used = len(self._running), self._used
            fit = (m.kv_tokens - used) // b
            if fit == 0:
                self._preempt()
                continue
            k = min(min(r.remaining for r in self._running), m.max_chunk_steps, fit)
            dt = prefill / m.prefill_tokens_per_s
            dt += k * (m.base_step_s + m.per_request_step_s * b + m.per_kv_token_step_s * used)
            dt += m.per_kv_token_step_s * b * k * (k - 1) / 2  # the cache grows during the chunk
            await asyncio.sleep(dt)
            stats.busy_s += dt
            stats.decoded_tokens += b * k
            stats.steps += k
            self._used += b * k
            stats.peak_kv_tokens = max(stats.peak_kv_tokens, self._used)
            still = []
            for r in self._running:
                r.remaining -= k
                r.context += k
                r.generated += k
                if r.remaining > 0:
                    still.append(r)
                    continue
                self._used -= r.context
                self._cache[r.session] = r.context
                self._cache.move_to_end(r.session)
                if not r.future.done():
                    r.future.set_result(r.generated)
            self._running = still
            self._trim_cache()

    def _admit(self) -> int:
        """Move waiting requests into the batch while they fit; return tokens to prefill."""
        m, prefill = self.model, 0
        limit = m.kv_tokens * (1 - m.admit_watermark)
        while self._waiting and self._used + self._waiting[0].context <= limit:
            r = self._waiting.popleft()
            if r.future.done():  # the caller went away
                continue
            hit = self._cache.pop(r.session, 0)
            hit = hit if hit <= r.context else 0
            prefill += r.context - hit
            if r.preempted:
                self.stats.recomputed_tokens += r.context - hit
            self._used += r.context
            self._running.append(r)
            self._trim_cache()
        self.stats.prefill_tokens += prefill
        return prefill

    def _preempt(self) -> None:
        """Out of KV: evict the newest half of the running requests to recompute them later."""
        keep = len(self._running) // 2
        evicted = self._running[keep:]
        self._running = self._running[:keep]
        for r in reversed(evicted):
            self._used -= r.context
            r.preempted = True
            self._waiting.appendleft(r)
        self.stats.preemption_events += 1
        self.stats.preempted_requests += len(evicted)

    def _trim_cache(self) -> None:
        room = self.model.kv_tokens - self._used
        total = sum(self._cache.values())
        while self._cache and total > room:
            total -= self._cache.popitem(last=False)[1]

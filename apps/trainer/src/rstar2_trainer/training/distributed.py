"""FSDP2 data-parallel training under torchrun: joining the world, sharding, one optimizer step.

Letters: B rows in a micro-batch, T padded response length.

Contract
- `init_distributed(config)` joins the world that torchrun describes (the launcher's `RANK`,
  `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; env:// rendezvous) or, started as a
  plain `python` process, makes a world of one in-process, so one code path runs both ways.
  Backend: gloo on CPU, nccl on CUDA (RCCL on ROCm, which torch also calls "nccl"/"cuda").
  On CUDA it turns on the caching allocator's expandable segments unless the user's
  `PYTORCH_CUDA_ALLOC_CONF` says otherwise (`allocator_settings`): on one H200 the default
  allocator reserved 21 GiB beyond the 80 GiB a 14B-width step allocated at 12K tokens, expandable
  segments 7 GiB (docs/RESULTS.md, "First GPU run"). vLLM's sleep-mode pool turns them off for
  its own allocations and back on after.
- `shard_model(model, config, world)` applies `fully_shard` to every transformer block (the
  classes a Hugging Face model names in `_no_split_modules`), then to the root. Parameters stay
  fp32 in their shards (the optimizer's master copy); forward/backward compute in `param_dtype`
  (bf16 on GPU) and gradients are reduced in `reduce_dtype` (fp32). Optional activation
  checkpointing recomputes each block in backward (the composable API: no module is wrapped, so
  parameter names and checkpoints are unchanged).
- `train_step(model, optimizer, rows, loss_fn, ...)` runs one optimizer step over this rank's rows
  in token-budgeted micro-batches, each one packed sequence (`batching.pack_batch`: the rows
  concatenated, attention within each row, no padding; at most `micro_batch_tokens` of the
  rows' own tokens), or, with `packed=False`, rows padded to the longest (`make_batch`: the
  reference path, at most rows x longest tokens); `row_logprobs` likewise. The number of loss
  tokens is all-reduced first and every micro-batch contributes sum(token loss * mask) / global
  tokens, so the loss and the gradient are exactly those of a single process taking the token
  mean over the whole batch, whatever the split across ranks and micro-batches. The gradients
  are freed (`zero_grad(set_to_none)`) right after the optimizer step. Any per-token loss works:
  the SFT cross-entropy is `-logp`, the RL policy loss is the clipped surrogate of `logp` and
  `values` such as advantages.
- A loss returns either the per-token loss [B, T] (masked and summed here) or, as a 0-dim tensor,
  the micro-batch's loss already summed over its loss tokens; optionally with metrics that are
  likewise sums over the micro-batch's loss tokens, which the step reports as global means per
  loss token, except a metric named `*_max`: the micro-batch's largest value, reported as the
  largest over micro-batches and ranks (all-reduced with MAX). `normalize_by="rows"` divides by the global number of rows instead of loss tokens
  (the sequence-level aggregations of rstar2_algos); `temperature` and `with_entropy` are passed
  to `response_logprobs` (the entropy reaches the loss as `MicroBatch.entropy`, detached unless
  the loss has a true `entropy_grad` attribute: an entropy bonus needs its gradient); `grouping`
  picks the micro-batches (shortest first by default; SFT's `longest_first_chunks`).
- Ranks may hold different numbers of micro-batches; the shorter ones run zero-weighted repeats so
  every rank joins every FSDP collective (no hang, no gradient).

- `load_sharded_model(model_dir, config, world)` builds the model on the meta device, shards it
  and fills each rank's shard from the folder's safetensors, so no process holds the whole model;
  `save_safetensors(model, out)` writes the weights back as such a folder's files, gathered
  parameter by parameter onto rank 0 and written bucket by bucket; `load_full_weights(model,
  path)` loads a driver's `model.pt`, read by rank 0 alone and broadcast.

Not covered: tensor or sequence parallelism, CPU offload, and checkpoints (see
`sharded_checkpoint`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch.distributed._composable.checkpoint_activation import checkpoint
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rstar2_trainer.training.batching import (
    Grouping,
    TokenBatch,
    make_batch,
    pack_batch,
    response_logprobs,
    token_budget_chunks,
)
from rstar2_trainer.training.batching import (  # SFT and the ranks import it from here
    longest_first_chunks as longest_first_chunks,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class DistributedConfig(BaseModel):
    """How the policy is sharded and stepped across data-parallel ranks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: cuda (nccl) when a GPU is visible, else cpu (gloo)."
    )
    param_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Compute dtype of forward/backward; auto: bf16 on GPU, fp32 on CPU.",
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="Dtype of the gradient reduce-scatter across ranks."
    )
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each transformer block in backward to save memory."
    )
    reshard_after_forward: bool = Field(
        default=True, description="Free gathered block parameters after forward (ZeRO-3)."
    )
    micro_batch_tokens: int = Field(
        default=16384,
        gt=0,
        description="Tokens per micro-batch: the rows' own, packed (a longer row alone).",
    )
    max_grad_norm: float | None = Field(
        default=1.0, gt=0, description="Clip the global gradient norm to this; None: no clipping."
    )


@dataclass(frozen=True)
class World:
    """This process's place in the data-parallel world."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh


EXPANDABLE_SEGMENTS = "expandable_segments:True"


def allocator_settings(environ: Mapping[str, str]) -> str | None:
    """The CUDA allocator settings to apply: expandable segments, unless the user set any."""
    return None if "PYTORCH_CUDA_ALLOC_CONF" in environ else EXPANDABLE_SEGMENTS


def init_distributed(config: DistributedConfig) -> World:
    """Join torchrun's world (or make a world of one) and build the 1-D data-parallel mesh."""
    wants_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("distributed.device=cuda but no GPU is visible; use cpu or auto")
    if wants_cuda and (settings := allocator_settings(os.environ)) is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = settings  # read at CUDA's first allocation
        if torch.cuda.is_initialized():  # too late for the variable: tell the allocator itself
            torch.cuda.memory._set_allocator_settings(settings)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # torchrun's protocol
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if launched else 0
    device = torch.device("cuda", local_rank) if wants_cuda else torch.device("cpu")
    if wants_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if wants_cuda else "gloo"
        if launched:
            dist.init_process_group(
                backend, init_method="env://", device_id=device if wants_cuda else None
            )
        else:
            store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
    world_size = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))
    return World(dist.get_rank(), world_size, local_rank, device, mesh)


def close_distributed() -> None:
    """Leave the world (no barrier: ranks may close one at a time, as `TrainGroup.close` does).

    With gloo, a process group that a sharded model still references keeps its worker threads
    after this; a process that ran FSDP2 on gloo should end with `os._exit` rather than Python's
    finalisation, during which such a thread can abort the process (see tests/_fsdp_worker.py).
    """
    if dist.is_initialized():
        dist.destroy_process_group()


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(
            f"{type(model).__name__} names no transformer blocks in _no_split_modules; "
            "shard_model needs a Hugging Face causal LM"
        )
    return blocks


def shard_model(model: torch.nn.Module, config: DistributedConfig, world: World) -> torch.nn.Module:
    """Shard `model` in place with FSDP2, block by block then the root; returns it."""
    param_dtype = config.param_dtype
    if param_dtype == "auto":
        param_dtype = "bfloat16" if world.device.type == "cuda" else "float32"
    policy = MixedPrecisionPolicy(
        param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[config.reduce_dtype]
    )
    for p in model.parameters():  # fp32 master weights; a frozen base (LoRA) keeps its dtype
        p.data = p.data.float() if p.requires_grad else p.data
    config_hf = getattr(model, "config", None)
    if config_hf is not None and hasattr(config_hf, "use_cache"):
        # Training never reads a KV cache, and a recomputed block would append to it twice.
        config_hf.use_cache = False
    for block in _blocks(model):
        if config.activation_checkpointing:
            checkpoint(block)
        fully_shard(
            block,
            mesh=world.mesh,
            mp_policy=policy,
            reshard_after_forward=config.reshard_after_forward,
        )
    # The root keeps its parameters (embeddings, final norm, head) gathered between forward and
    # backward: backward needs them first.
    fully_shard(model, mesh=world.mesh, mp_policy=policy, reshard_after_forward=False)
    return model  # now also an FSDPModule


def load_sharded_model(model_dir: str | Path, config: DistributedConfig, world: World) -> Any:
    """The model folder's causal LM, sharded, each rank reading only its own rows from disk.

    Built on the meta device (no memory), sharded with `shard_model`, materialised empty on the
    rank's device, then filled parameter by parameter from the folder's safetensors files: each
    rank reads its Shard(0) rows of each tensor (`safe_open(...).get_slice`), cast to fp32, so
    the peak host memory is about one shard plus one tensor's rows. Tied weights are one
    parameter (filled once, from whichever of its names the files hold); non-persistent buffers
    (the rotary `inv_freq`) are recomputed by transformers' own initialiser. Equal to
    `from_pretrained(model_dir, dtype=float32)` then `shard_model`, tensor for tensor.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    hf_config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model = shard_model(model, config, world)
    model.to_empty(device=world.device)
    _recompute_buffers(model)
    files = _tensor_files(model_dir)
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    persistent = set(model.state_dict())
    buffers = [(n, b) for n, b in model.named_buffers() if n in persistent]
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *buffers]:
            names = aliases.get(id(tensor), [name])
            found = next((n for n in names if n in files), None)
            if found is None:
                raise ValueError(f"{model_dir} holds no tensor {name!r} (its safetensors lack it)")
            _fill(tensor, files[found], found, world)
    model.eval()
    return model


def _tensor_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of `model_dir` that holds it."""
    from safetensors import safe_open

    paths = sorted(model_dir.glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights")
    out: dict[str, Path] = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            out.update(dict.fromkeys(f.keys(), path))
    return out


def _fill(tensor: torch.Tensor, path: Path, name: str, world: World) -> None:
    """This rank's part of `tensor` (a Shard(0) DTensor or a plain one) from file `path`."""
    from safetensors import safe_open

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    with safe_open(str(path), framework="pt") as f:
        part = f.get_slice(name)
        shape = tuple(part.get_shape())
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{path.name}: {name} is {list(shape)}, the model wants "
                             f"{list(tensor.shape)}")  # fmt: skip
        if isinstance(tensor, DTensor) and local.shape[0] < shape[0]:
            # FSDP2's Shard(0): torch.chunk rows, ceil(rows / world) each, the last ones shorter.
            start = world.rank * -(-shape[0] // world.world_size)
            rows = part[start : start + local.shape[0]] if local.shape[0] else None
        else:
            rows = part[:]
        if rows is not None:
            local.copy_(rows.to(local.dtype))


def _recompute_buffers(model: Any) -> None:
    """Non-persistent buffers (not in any file) from transformers' initialiser: `to_empty` left
    them uninitialised. Modules holding one are initialised afresh; the parameters among them
    are overwritten from the files right after."""
    persistent = set(model.state_dict())
    owners = {
        name.rpartition(".")[0] for name, _ in model.named_buffers() if name not in persistent
    }
    with torch.no_grad():
        for name in owners:
            model._init_weights(model.get_submodule(name))


@dataclass(frozen=True)
class Row:
    """One sequence to train on: a prompt, a response, its loss mask and per-token values."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    loss_mask: Sequence[int]  # 1 where the response token enters the loss (tool output: 0)
    values: Mapping[str, Sequence[float]] = field(default_factory=dict)  # e.g. advantages

    def __post_init__(self) -> None:
        if len(self.loss_mask) != len(self.response_ids):
            raise ValueError("loss_mask must have one entry per response token")
        for key, v in self.values.items():
            if len(v) != len(self.response_ids):
                raise ValueError(f"values[{key!r}] must have one entry per response token")


@dataclass
class MicroBatch:
    batch: TokenBatch
    values: dict[str, torch.Tensor]  # each [B, T], 0 on padding
    entropy: torch.Tensor | None = None  # [B, T] with train_step(with_entropy=True); see TokenLoss


LossOutput = torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]
# (logp [B, T], mb) -> per-token loss [B, T] or the summed loss [], optionally with metric sums
TokenLoss = Callable[[torch.Tensor, MicroBatch], LossOutput]


@dataclass(frozen=True)
class StepResult:
    loss: float  # token mean over every loss token of every rank
    tokens: int  # loss tokens across all ranks
    grad_norm: float  # global norm before clipping
    micro_batches: int  # on the busiest rank
    metrics: dict[str, float] = field(default_factory=dict)  # per global loss token; *_max: max


def make_micro_batch(
    rows: Sequence[Row], pad_id: int, device: torch.device, *, packed: bool = True
) -> MicroBatch:
    """The rows as one micro-batch on `device`: packed (`pack_batch`) or padded (`make_batch`)."""
    build = pack_batch if packed else make_batch
    batch = build(
        [r.prompt_ids for r in rows],
        [r.response_ids for r in rows],
        [r.loss_mask for r in rows],
        pad_id,
    )
    b, t = batch.response_ids.shape
    values: dict[str, torch.Tensor] = {}
    for key in rows[0].values if rows else ():
        v = torch.zeros((b, t), dtype=torch.float32)  # [B, T]
        for i, r in enumerate(rows):
            v[i, : len(r.values[key])] = torch.tensor(list(r.values[key]), dtype=torch.float32)
        values[key] = v.to(device)
    return MicroBatch(batch.to(device), values)


def partition_indices(rows: Sequence[Row], world_size: int) -> list[list[int]]:
    """Row indices per rank, longest first onto the rank with the fewest tokens so far."""
    if len(rows) < world_size:
        raise ValueError(f"{len(rows)} rows cannot give each of {world_size} ranks one")
    order = sorted(
        range(len(rows)), key=lambda i: -len(rows[i].prompt_ids) - len(rows[i].response_ids)
    )
    parts: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in order:
        r = min(range(world_size), key=lambda k: (load[k], len(parts[k])))
        parts[r].append(i)
        load[r] += len(rows[i].prompt_ids) + len(rows[i].response_ids)
    return [sorted(p) for p in parts]


def partition_rows(rows: Sequence[Row], world_size: int) -> list[list[Row]]:
    """Split rows over ranks (`partition_indices`)."""
    return [[rows[i] for i in p] for p in partition_indices(rows, world_size)]


def with_values(rows: Sequence[Row], key: str, values: Sequence[Sequence[float]]) -> list[Row]:
    """The rows with one more per-token value each (e.g. `old_logp`)."""
    return [
        Row(r.prompt_ids, r.response_ids, r.loss_mask, {**r.values, key: list(v)})
        for r, v in zip(rows, values, strict=True)
    ]


def _all_reduce(
    values: list[float], op: dist.ReduceOp.RedOpType, device: torch.device
) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=op)
    return t.tolist()


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[Row],
    loss_fn: TokenLoss,
    *,
    pad_id: int,
    micro_batch_tokens: int,
    max_grad_norm: float | None = None,
    device: torch.device | None = None,
    normalize_by: Literal["tokens", "rows"] = "tokens",
    temperature: float = 1.0,
    with_entropy: bool = False,
    grouping: Grouping = token_budget_chunks,
    packed: bool = True,
) -> StepResult:
    """One optimizer step on this rank's `rows`, the loss normalised across all ranks; each
    micro-batch packed (`packed=False`: padded, the reference path)."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if world_size > 1 and not isinstance(model, FSDPModule):
        raise ValueError("with more than one rank the model must be sharded (shard_model)")
    if not rows:
        raise ValueError("every rank needs at least one row (see partition_rows)")
    device = device or next(model.parameters()).device
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    chunks = [[rows[i] for i in c] for c in grouping(lengths, micro_batch_tokens, packed=packed)]
    local_tokens = float(sum(sum(r.loss_mask) for r in rows))
    total_tokens, total_rows = _all_reduce(
        [local_tokens, float(len(rows))], dist.ReduceOp.SUM, device
    )
    (steps,) = _all_reduce([float(len(chunks))], dist.ReduceOp.MAX, device)
    if total_tokens == 0:
        raise ValueError("the batch has no loss tokens on any rank")
    normalizer = total_tokens if normalize_by == "tokens" else total_rows
    # FSDP averages gradients over ranks; scaling by the world size turns that average into the
    # sum of every rank's share of the global mean.
    scale = world_size / normalizer
    model.train()
    optimizer.zero_grad(set_to_none=True)  # none left by the last step; a failed one may have
    loss_sum = 0.0
    metric_sums: dict[str, float] = {}
    metric_maxes: dict[str, float] = {}
    for k in range(int(steps)):
        weight = 1.0 if k < len(chunks) else 0.0  # zero-weighted repeat: join the collectives
        mb = make_micro_batch(chunks[min(k, len(chunks) - 1)], pad_id, device, packed=packed)
        logp, entropy = response_logprobs(
            model, mb.batch, with_entropy=with_entropy, temperature=temperature
        )  # [B, T]
        if entropy is not None and not getattr(loss_fn, "entropy_grad", False):
            entropy = entropy.detach()  # a metric: its backward is never built
        mb.entropy = entropy
        out = loss_fn(logp, mb)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        masked = loss if loss.ndim == 0 else (loss * mb.batch.response_mask).sum()
        (masked * (scale * weight)).backward()
        loss_sum += float(masked.detach()) * weight
        for key, value in metrics.items():
            if key.endswith("_max"):  # a largest value: the max over micro-batches
                if weight:
                    metric_maxes[key] = max(metric_maxes.get(key, -math.inf), float(value))
            else:
                metric_sums[key] = metric_sums.get(key, 0.0) + float(value) * weight
    norm = _clip_grad_norm(model, max_grad_norm)
    optimizer.step()
    # Gradients are freed as soon as they are applied: nothing is offloaded, pushed or rolled
    # out beside them (12 bytes a parameter of training state, not 16).
    optimizer.zero_grad(set_to_none=True)
    keys = sorted(metric_sums)  # every rank runs the same loss, so the same keys
    sums = _all_reduce([loss_sum, *(metric_sums[k] for k in keys)], dist.ReduceOp.SUM, device)
    top = sorted(metric_maxes)
    maxes = _all_reduce([metric_maxes[k] for k in top], dist.ReduceOp.MAX, device) if top else []
    return StepResult(
        loss=sums[0] / normalizer,
        tokens=int(total_tokens),
        grad_norm=norm,
        micro_batches=int(steps),
        metrics={
            **{k: v / total_tokens for k, v in zip(keys, sums[1:], strict=True)},
            **dict(zip(top, maxes, strict=True)),
        },
    )


@torch.no_grad()
def row_logprobs(
    model: torch.nn.Module,
    rows: Sequence[Row],
    *,
    pad_id: int,
    micro_batch_tokens: int,
    device: torch.device | None = None,
    temperature: float = 1.0,
    packed: bool = True,
) -> list[list[float]]:
    """This rank's rows' response-token logprobs under the current weights (collective).

    The "old" logprobs of a PPO-style update: the same micro-batches as `train_step`, and on
    more than one rank the same zero-weighted repeats, so every rank joins every all-gather.
    """
    if not rows:
        raise ValueError("every rank needs at least one row (see partition_rows)")
    device = device or next(model.parameters()).device
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    chunks = list(token_budget_chunks(lengths, micro_batch_tokens, packed=packed))
    (steps,) = _all_reduce([float(len(chunks))], dist.ReduceOp.MAX, device)
    was_training = model.training
    model.eval()
    out: list[list[float]] = [[] for _ in rows]
    for k in range(int(steps)):
        chunk = chunks[min(k, len(chunks) - 1)]
        mb = make_micro_batch([rows[i] for i in chunk], pad_id, device, packed=packed)
        logp, _ = response_logprobs(model, mb.batch, temperature=temperature)  # [B, T]
        if k < len(chunks):
            for j, i in enumerate(chunk):
                out[i] = logp[j, : len(rows[i].response_ids)].float().cpu().tolist()
    model.train(was_training)
    return out


def _clip_grad_norm(model: torch.nn.Module, max_norm: float | None) -> float:
    """The global gradient norm (over every rank's shards); grads scaled down to `max_norm`."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([g for p in params if (g := p.grad) is not None])
    if isinstance(norm, DTensor):  # a partial sum over shards: reduce it across ranks
        norm = norm.full_tensor()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)


def save_safetensors(model: torch.nn.Module, out: Path, *, bucket_bytes: int = 1 << 30) -> None:
    """The unsharded weights as a Hugging Face safetensors set in folder `out` (collective).

    Every rank joins the gather of one parameter at a time; rank 0 alone keeps it, on the CPU,
    and writes a file whenever the kept tensors reach `bucket_bytes`, so its extra memory is one
    bucket plus one tensor. One file is `model.safetensors`; several are
    `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`. Tied weights are
    written once (under the first name, as `save_pretrained` does); fp32, as trained."""
    from safetensors.torch import save_file

    rank = dist.get_rank() if dist.is_initialized() else 0
    persistent = set(model.state_dict())
    named = [
        *model.named_parameters(),
        *((n, b) for n, b in model.named_buffers() if n in persistent),
    ]
    written: list[tuple[Path, list[str]]] = []
    bucket: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal bucket, size
        if bucket:
            path = out / f".part-{len(written):05d}.safetensors"
            save_file(bucket, str(path), metadata={"format": "pt"})
            written.append((path, list(bucket)))
        bucket, size = {}, 0

    for name, tensor in named:
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if rank == 0:
            nbytes = full.numel() * full.element_size()
            if size and size + nbytes > bucket_bytes:
                flush()
            bucket[name] = full.detach().to("cpu", copy=True).contiguous()
            size += nbytes
            total += nbytes
        del full
    if rank != 0:
        return
    flush()
    if len(written) == 1:
        written[0][0].rename(out / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    for i, (path, names) in enumerate(written):
        final = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        path.rename(out / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def load_full_weights(model: torch.nn.Module, path: Path) -> None:
    """A full state dict saved with `torch.save` (a driver's `model.pt`) into the sharded
    `model`: rank 0 alone reads the file and broadcasts it, each rank keeping its shard
    (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank = dist.get_rank() if dist.is_initialized() else 0
    full = torch.load(path, map_location="cpu", weights_only=True) if rank == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The unsharded weights on CPU, on rank 0 only (other ranks get {}): for export and sync."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)

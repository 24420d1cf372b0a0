"""LoRA policies through PEFT: the base frozen in the training dtype, adapters trained in fp32.

Contract
- `apply_lora(model, settings, base_dtype=, base_path=)` wraps a causal LM with PEFT's LoRA
  (`model.lora`: rank, alpha, dropout, target modules; all linear layers of the blocks by
  default, not the head): the base's parameters frozen and cast to `base_dtype` (the training
  dtype: bf16 halves the base), the adapters in fp32, initialised by `init_adapter`. The
  driver's policy and the FSDP2 ranks (`load_sharded_lora_model`) build the same model.
- `init_adapter(model, seed)`: every lora_A from PEFT's own rule (Kaiming-uniform, a = sqrt(5))
  drawn from a generator seeded per tensor, every lora_B zero, so the adapted model starts equal
  to its base and every rank, whatever its shard, starts from the same adapter.
- `adapter_tensors(model, dtype)` yields the adapter as PEFT saves it (`saved_name`: the adapter
  name dropped), each tensor cast to `dtype` and, on FSDP2 ranks, all-gathered (every rank
  iterates together); `adapter_config(model)` is its `adapter_config.json`. `as_adapter` makes
  both the `rstar2_rollout.Adapter` a push sends.
- `merged_tensors(model, dtype)`: the base model's own names and full tensors with each
  adapter's update added (W + alpha/r B A, in fp32, then cast), for engines without LoRA
  (`model.lora.sync: merged`); a plain model's tensors pass through. On FSDP2 ranks it is the
  stream `gather.FullTensors` yields for a LoRA model (a merged sync over a weight channel or
  into a colocated engine), one merged tensor at a time.
- Checkpoints hold the trainable parameters only (`trainable_state`, `load_trainable_state`);
  the base is the model folder, unchanged.

Not covered: adapters on the embeddings or the head, DoRA, quantised bases (QLoRA).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from rstar2_rollout.adapter import Adapter

ADAPTER_NAME = "default"  # PEFT's name of the one adapter
_PREFIX = "base_model.model."  # PEFT's prefix of the wrapped model's names


def peft_config(settings: Any, base_path: str | Path | None = None) -> Any:
    """PEFT's `LoraConfig` for a `model.lora` section."""
    from peft import LoraConfig

    targets = settings.target_modules
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(base_path) if base_path is not None else None,
    )


def is_lora(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def saved_name(name: str) -> str:
    """A PEFT model's parameter name as `adapter_model.safetensors` spells it."""
    return name.replace(f".{ADAPTER_NAME}.", ".")


def base_name(name: str) -> str:
    """A wrapped base parameter's name in the base model's own state dict."""
    return name.removeprefix(_PREFIX).replace(".base_layer.", ".")


def apply_lora(
    model: torch.nn.Module,
    settings: Any,
    *,
    base_dtype: torch.dtype = torch.float32,
    base_path: str | Path | None = None,
) -> torch.nn.Module:
    """`model` as a PEFT LoRA model (module docstring); frozen base in `base_dtype`."""
    from peft import get_peft_model

    for p in model.parameters():  # parameters only: buffers (RoPE's inv_freq) stay as built
        p.requires_grad_(False)
        p.data = p.data.to(base_dtype)
    wrapped = get_peft_model(model, peft_config(settings, base_path))  # type: ignore[arg-type]
    for name, p in wrapped.named_parameters():
        if is_lora(name):
            p.data = p.data.float()
    if not any(p.device.type == "meta" for p in wrapped.parameters()):
        init_adapter(wrapped, settings.seed)
    return wrapped


@torch.no_grad()
def init_adapter(model: torch.nn.Module, seed: int) -> None:
    """lora_A Kaiming-uniform from a generator seeded per tensor, lora_B zero (module docstring);
    on FSDP2 ranks each rank writes its Shard(0) rows of the same full tensor."""
    index = 0
    for name, p in model.named_parameters():
        if not is_lora(name):
            continue
        full = torch.zeros(p.shape, dtype=torch.float32)
        if ".lora_A." in name:
            generator = torch.Generator().manual_seed(seed * 100_003 + index)
            bound = 1 / math.sqrt(p.shape[1])  # kaiming_uniform_(a=sqrt(5)): sqrt(6/((1+5) fan_in))
            full.uniform_(-bound, bound, generator=generator)
        index += 1
        if isinstance(p, DTensor):
            local = p.to_local()
            rows = local.shape[0]
            rank = p.device_mesh.get_local_rank()
            start = rank * -(-full.shape[0] // p.device_mesh.size())
            local.copy_(full[start : start + rows].to(local.dtype))
        else:
            p.copy_(full.to(p.dtype))


def _full(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`p` whole in `dtype`: a DTensor's shard cast first, then all-gathered (collective)."""
    value = p.detach()
    if isinstance(value, DTensor):
        return value.to(dtype).full_tensor()  # type: ignore[union-attr]
    return value.to(dtype)


def adapter_tensors(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, Any]]:
    """The adapter's tensors, PEFT-named, whole, in `dtype` (collective on FSDP2 ranks)."""
    for name, p in model.named_parameters():
        if is_lora(name):
            yield saved_name(name), _full(p, dtype)


def adapter_config(model: Any, base_path: str | Path | None = None) -> dict[str, Any]:
    """The adapter's `adapter_config.json` (target modules resolved to names, sorted)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    for key, value in list(config.items()):
        if isinstance(value, set):
            config[key] = sorted(value)
        elif hasattr(value, "value"):  # an enum (peft_type, task_type)
            config[key] = value.value
    if base_path is not None:
        config["base_model_name_or_path"] = str(base_path)
    return config


def as_adapter(
    model: Any, dtype: torch.dtype = torch.float32, base_path: str | Path | None = None
) -> Adapter:
    """The `Adapter` a push sends (every rank gathers; only rank 0's is whole)."""
    return Adapter(list(adapter_tensors(model, dtype)), adapter_config(model, base_path))


def adapter_bytes(model: torch.nn.Module, dtype_bytes: int) -> int:
    """The adapter's size at `dtype_bytes` a parameter (what an adapter push moves)."""
    count = sum(p.numel() for name, p in model.named_parameters() if is_lora(name))
    return count * dtype_bytes


@torch.no_grad()
def merged_tensors(
    model: Any, dtype: torch.dtype, counts: dict[str, int] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's tensors with each adapter's update merged (module docstring), one at a
    time. Collective on FSDP2 ranks (every rank iterates together); each tensor is gathered in
    the least it needs: a frozen weight without an adapter cast to `dtype` first, an adapted one
    in its own dtype (the frozen base's: bf16 on GPUs), A and B in fp32. `counts`, when given,
    adds up `gathered_bytes` and `gathers`. A tied alias (a tied head) follows its first name
    with the same tensor, gathered once."""
    named = dict(model.named_parameters())
    persistent = set(model.state_dict())
    scaling: dict[str, float] = {}
    for module_name, module in model.named_modules():
        s = getattr(module, "scaling", None)
        if isinstance(s, dict) and ADAPTER_NAME in s:
            scaling[module_name] = float(s[ADAPTER_NAME])
    counts = {} if counts is None else counts

    def gather(p: torch.Tensor, to: torch.dtype) -> torch.Tensor:
        full = _full(p, to)
        counts["gathered_bytes"] = (
            counts.get("gathered_bytes", 0) + full.numel() * full.element_size()
        )
        counts["gathers"] = counts.get("gathers", 0) + 1
        return full

    groups: dict[int, list[tuple[str, torch.Tensor]]] = {}  # one tensor's names, in order
    for name, p in [
        *model.named_parameters(remove_duplicate=False),
        *((n, b) for n, b in model.named_buffers() if n in persistent),
    ]:
        if not is_lora(name):
            groups.setdefault(id(p), []).append((name, p))
    for names in groups.values():
        name, p = names[0]
        owner = name.removesuffix(".base_layer.weight")
        if owner != name and owner in scaling:
            a = gather(named[f"{owner}.lora_A.{ADAPTER_NAME}.weight"], torch.float32)
            b = gather(named[f"{owner}.lora_B.{ADAPTER_NAME}.weight"], torch.float32)
            base = gather(p, p.dtype)
            full = (base.float() + scaling[owner] * (b @ a)).to(dtype)
            del a, b, base
        else:
            full = gather(p, dtype)
        for alias, _ in names:
            yield base_name(alias), full
        del full


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters (the adapters), by the model's own names: a checkpoint's."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """`trainable_state`'s tensors back into `model`; ValueError naming what does not match."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    if set(state) != set(params) or any(tuple(state[n].shape) != shapes[n] for n in shapes):
        missing = sorted(set(params) - set(state))[:2]
        extra = sorted(set(state) - set(params))[:2]
        raise ValueError(
            f"the checkpoint's adapter does not fit this LoRA policy (missing {missing}, "
            f"unexpected {extra}): another rank or target_modules"
        )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name].to(p.device, p.dtype))


class TrainableState:
    """What `checkpoint.save_checkpoint` calls `state_dict()` on for a LoRA policy."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.model)


def load_sharded_lora_model(model_dir: str | Path, config: Any, world: Any, settings: Any) -> Any:
    """`distributed.load_sharded_model` for a LoRA policy: built on the meta device, wrapped
    with `apply_lora` (the base in `config.param_dtype`: bf16 on GPUs), sharded with FSDP2
    (`MixedPrecisionPolicy` casts the fp32 adapters to the compute dtype, reduces their
    gradients in fp32), the base's shards filled from the folder's safetensors and the adapters
    initialised by `init_adapter` (the same on every rank)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rstar2_trainer.training.distributed import (
        _DTYPES,
        _fill,
        _recompute_buffers,
        _tensor_files,
        shard_model,
    )

    model_dir = Path(model_dir)
    dtype = config.param_dtype
    if dtype == "auto":
        dtype = "bfloat16" if world.device.type == "cuda" else "float32"
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(model_dir), dtype=torch.float32
        )
        model = apply_lora(base, settings, base_dtype=_DTYPES[dtype], base_path=model_dir)
    model = shard_model(model, config, world)
    model.to_empty(device=world.device)
    _recompute_buffers(model)
    files = _tensor_files(model_dir)
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(base_name(name))
    persistent = set(model.state_dict())
    buffers = [(n, b) for n, b in model.named_buffers() if n in persistent]
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *buffers]:
            if is_lora(name):
                continue
            names = aliases.get(id(tensor), [base_name(name)])
            found = next((n for n in names if n in files), None)
            if found is None:
                raise ValueError(f"{model_dir} holds no tensor {base_name(name)!r}")
            _fill(tensor, files[found], found, world)
    init_adapter(model, settings.seed)
    model.eval()
    return model

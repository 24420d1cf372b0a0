"""Attention restricted to each row of a packed micro-batch, as transformers' attention function.

Letters: M tokens of a pack (its rows concatenated), R rows, Hq query heads, Hkv key/value heads,
D head size, L_r the length of row r.

Contract
- `use_packed_attention(model)` makes a Hugging Face causal LM that uses `sdpa` attention use
  `PACKED` ("rstar2_packed") instead, once and for good: transformers then calls
  `packed_attention` in every attention layer and `packed_mask` to build its masks. A forward
  given `cu_seq_lens_q` (int32 [R + 1], the row boundaries in the pack, as transformers'
  `FlashAttentionKwargs` name them), `max_length_q` (the longest row) and, optionally,
  `row_bounds` (the same boundaries as Python ints, so slicing rows never waits for the device)
  attends within each row, causally; any other forward is exactly `sdpa` (the padded batches'
  4-D masks, generation).
  Parameter names, the config file a model saves and every other behaviour are unchanged.
- A pack never has an M x M mask: `packed_mask` returns None for a full forward without a
  padding mask (where `sdpa` would build a [1, 1, M, M] block-diagonal mask from position ids
  that restart), and the rows are attended to one of two ways (`attention_kernel`):
  `varlen`: torch's `varlen_attn` (Flash Attention over the whole pack in one call) on CUDA in
  bf16/fp16 when the installed torch's `varlen_attn` takes the model's heads and scale
  (grouped-query heads need its `enable_gqa`, torch >= 2.12); `rows`: one
  `scaled_dot_product_attention(is_causal=True)` per row everywhere else (CPU, ROCm, fp32,
  older torch), which runs a fused kernel without a mask where the backend has one (CPU:
  flash attention for CPU, with grouped-query heads) and at worst keeps one row's L_r x L_r.
  Both are exact: the result equals `sdpa` on each row alone up to float reassociation.
- Keys and values are never repeated to the query heads (`enable_gqa`), unlike `sdpa` with a
  mask, which copies them (`repeat_kv`).

Not covered: sliding-window or chunked attention, masks with overlays (image-token blocks),
attention dropout on the `varlen` kernel (the `rows` kernel applies it), KV caches on a pack
(training forwards only). `use_packed_attention` refuses a model whose attention is not `sdpa`
or that has sliding-window layers.
"""

from __future__ import annotations

import inspect
import itertools
from functools import cache
from typing import Any, Literal

import torch
import torch.nn.functional as F

PACKED = "rstar2_packed"
Kernel = Literal["varlen", "rows"]


@cache
def _varlen_parameters() -> frozenset[str] | None:
    """The keyword parameters of this torch's `varlen_attn`, or None when it has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return frozenset(inspect.signature(varlen_attn).parameters)


def attention_kernel(
    query: torch.Tensor, kv_heads: int, scaling: float | None, dropout: float = 0.0
) -> Kernel:
    """The kernel a pack's attention runs on (see the module docstring); query [1, Hq, M, D]."""
    params = _varlen_parameters()
    heads, head_dim = query.shape[1], query.shape[-1]
    usable = (
        params is not None
        and query.is_cuda
        and torch.version.hip is None
        and query.dtype in (torch.bfloat16, torch.float16)
        and head_dim <= 256
        and dropout == 0.0
        and (heads == kv_heads or "enable_gqa" in params)
        and (scaling is None or "scale" in params or abs(scaling - head_dim**-0.5) < 1e-12)
    )
    return "varlen" if usable else "rows"


def _rows(q, k, v, bounds: list[int], scaling, dropout) -> torch.Tensor:  # -> [M, Hq, D]
    gqa = q.shape[1] != k.shape[1]
    out = []
    for s, e in itertools.pairwise(bounds):
        if e > s:  # one row: [1, H, L_r, D]
            o = F.scaled_dot_product_attention(
                q[:, :, s:e],
                k[:, :, s:e],
                v[:, :, s:e],
                dropout_p=dropout,
                is_causal=True,
                scale=scaling,
                enable_gqa=gqa,
            )
            out.append(o[0])  # [Hq, L_r, D]
    return torch.cat(out, dim=1).transpose(0, 1)  # [M, Hq, D]


def _varlen(q, k, v, cu: torch.Tensor, longest: int, scaling) -> torch.Tensor:  # -> [M, Hq, D]
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_parameters() or frozenset()
    kwargs: dict[str, Any] = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # causal
    else:
        kwargs["is_causal"] = True
    if "scale" in params:
        kwargs["scale"] = scaling
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    # [1, H, M, D] -> [M, H, D]: the projections' own layout, so no copy in practice.
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))
    cu = cu.to(device=q.device, dtype=torch.int32)
    out = varlen_attn(q, k, v, cu, cu, longest, longest, **kwargs)
    return out  # pyright: ignore[reportReturnType]


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, M, D]
    key: torch.Tensor,  # [B, Hkv, M, D]
    value: torch.Tensor,  # [B, Hkv, M, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # [B, M, Hq, D]
    """transformers' attention function under `PACKED`: per row of a pack, else `sdpa`."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if kwargs.get("sliding_window") is not None or query.shape[0] != 1:
        raise ValueError("a packed forward takes one sequence of rows and no sliding window")
    longest = kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max())
    if attention_kernel(query, key.shape[1], scaling, dropout) == "varlen":
        out = _varlen(query, key, value, cu, longest, scaling)
    else:
        bounds = list(kwargs.get("row_bounds") or cu.tolist())  # Python ints: no device sync
        out = _rows(query, key, value, bounds, scaling, dropout)
    return out.unsqueeze(0), None


def packed_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' mask function under `PACKED` (called with keywords): None for a full
    forward without a padding mask (a pack, or one causal sequence: `packed_attention` needs no
    mask for either), otherwise `sdpa`'s mask. A full forward is one whose queries are all of
    its keys (q_length == kv_length, no key offset); older transformers name the queries by
    `cache_position` instead of `q_length`."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    q_length = kwargs.get("q_length")
    if q_length is None and (positions := kwargs.get("cache_position")) is not None:
        q_length = positions.shape[0]
    kv_offset = kwargs.get("kv_offset", 0)
    whole = (
        kwargs.get("attention_mask") is None
        and kwargs.get("local_size") is None
        and q_length is not None
        and q_length == kwargs.get("kv_length")
        and isinstance(kv_offset, int)
        and kv_offset == 0
    )
    return None if whole else ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](**kwargs)


@cache
def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, packed_mask)


def use_packed_attention(model: torch.nn.Module) -> None:
    """Switch `model` (a transformers causal LM on `sdpa`) to `PACKED`; a no-op when it is on
    it already. Raises ValueError, in one line, for a model this does not cover."""
    _register()
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == PACKED:
        return
    if current != "sdpa":
        raise ValueError(
            f"packed rows need a model on sdpa attention; {type(model).__name__} uses {current!r}"
        )
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(config, "use_sliding_window", False):
        raise ValueError(f"packed rows do not cover sliding-window layers ({sorted(layer_types)})")
    config._attn_implementation = PACKED  # pyright: ignore[reportOptionalMemberAccess]

"""The output projection fused with log-softmax, in token chunks: logprobs without [N, V] tensors.

Letters: N scored tokens, H hidden size, V vocabulary, C tokens per chunk.

Contract
- `head_logprobs(hidden, weight, bias, targets, temperature=, chunk_tokens=, with_entropy=)`
  returns, for each of the N hidden states, the fp32 logprob of its target token under
  softmax((hidden @ weight.T + bias) / temperature) and the entropy of that distribution, both
  [N], both differentiable (exact gradients for hidden, weight and bias). With
  `with_entropy=False` the entropy is None and costs nothing in either pass.
- For backward it keeps only `hidden`, `weight` (the head's parameter, alive anyway), `targets`
  and two fp32 numbers a token (logsumexp, E_p[logits]): 4 + 4 + 8 bytes a token beside the hidden
  state, where a plain `log_softmax` keeps about 4 tensors of N x V (8.2 x V bytes a token with
  the entropy on, measured at V=151,936). Backward recomputes each chunk's logits.
- Transient memory: one chunk at a time, C x V x (2 + 4 + 4) bytes (bf16 logits, fp32 logits,
  fp32 probabilities); `CHUNK_TOKENS` = 1,024 tokens is 1.56 GB at V=151,936. Backward adds an
  fp32 [V, H] gradient accumulator when the head is not fp32 (the per-chunk products are summed
  in fp32, so the gradient matches one unchunked matmul).
- The matmul runs in `hidden`'s dtype (cast `weight` first, as autocast would); logits are
  upcast to fp32 before the temperature and the softmax, and autocast is off inside.

Not covered: vocabulary-parallel heads (a sharded V), fused kernels (plain torch ops).
"""

from __future__ import annotations

import torch

CHUNK_TOKENS = 1024


def _logits(
    hidden: torch.Tensor,  # [C, H]
    weight: torch.Tensor,  # [V, H]
    bias: torch.Tensor | None,  # [V]
    temperature: float,
) -> torch.Tensor:  # [C, V] fp32
    x = hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)  # [C, V]
    z = x.to(torch.promote_types(x.dtype, torch.float32))  # a fresh tensor either way
    return z.div_(temperature) if temperature != 1.0 else z


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,  # [N, H]
        weight: torch.Tensor,  # [V, H]
        bias: torch.Tensor | None,  # [V]
        targets: torch.Tensor,  # [N]
        temperature: float,
        chunk: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        logp = torch.empty(n, dtype=dtype, device=hidden.device)  # [N]
        lse = torch.empty_like(logp)  # [N]
        mean_z = torch.empty_like(logp) if with_entropy else None  # [N]
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                z = _logits(hidden[s:e], weight, bias, temperature)  # [C, V]
                lse_c = torch.logsumexp(z, dim=-1)  # [C]
                lse[s:e] = lse_c
                logp[s:e] = z.gather(1, targets[s:e, None]).squeeze(1) - lse_c
                if mean_z is not None:
                    p = (z - lse_c[:, None]).exp_()  # [C, V]
                    mean_z[s:e] = p.mul_(z).sum(-1)  # E_p[z]
        if mean_z is None:  # no entropy asked: a constant, so backward never gets its gradient
            ent = torch.zeros_like(logp)
            ctx.mark_non_differentiable(ent)
        else:
            ent = lse - mean_z  # H = lse - E_p[z]
        ctx.save_for_backward(hidden, weight, bias, targets, lse, mean_z)
        ctx.temperature = temperature
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):  # [N], [N]
        hidden, weight, bias, targets, lse, mean_z = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None, None
        n, t = hidden.shape[0], ctx.temperature
        grad_h = torch.empty_like(hidden) if need_h else None  # [N, H]
        grad_w = (
            torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        )  # [V, H]
        grad_b = (
            torch.zeros(weight.shape[0], dtype=lse.dtype, device=weight.device)
            if need_b and bias is not None
            else None
        )  # [V]
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, ctx.chunk):
                e = min(n, s + ctx.chunk)
                h = hidden[s:e]  # [C, H]
                z = _logits(h, weight, bias, t)  # [C, V]
                p = (z - lse[s:e, None]).exp()  # [C, V]
                # d logp_y / dz = onehot_y - p;  dH / dz = -p (log p + H) = -p (z - E_p[z])
                if g_ent is not None:
                    assert mean_z is not None  # an entropy without one is non-differentiable
                    grad = z.sub_(mean_z[s:e, None]).mul_(p)
                    grad.mul_(-g_ent[s:e, None])
                    if g_logp is not None:
                        grad.sub_(p.mul_(g_logp[s:e, None]))
                else:
                    assert g_logp is not None
                    del z
                    grad = p.mul_(-g_logp[s:e, None])
                if g_logp is not None:
                    grad.scatter_add_(1, targets[s:e, None], g_logp[s:e, None])
                if t != 1.0:
                    grad.div_(t)
                if grad_b is not None:
                    grad_b += grad.sum(0)
                gx = grad.to(hidden.dtype)  # [C, V]
                if grad_h is not None:
                    grad_h[s:e] = gx @ weight
                if grad_w is not None:
                    grad_w += gx.T @ h
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),  # pyright: ignore[reportOptionalMemberAccess]
            None,
            None,
            None,
            None,
        )


def head_logprobs(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    bias: torch.Tensor | None,  # [V]
    targets: torch.Tensor,  # [N]
    *,
    temperature: float = 1.0,
    chunk_tokens: int = CHUNK_TOKENS,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # logp [N], entropy [N], fp32
    """Target logprobs and entropies of `(hidden @ weight.T + bias) / temperature`, chunked;
    without `with_entropy` the entropy is None and neither pass spends a [C, V] op on it."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):  # the dtype autocast would give the matmul
        dtype = torch.get_autocast_dtype(device_type)
        hidden = hidden.to(dtype)
        weight = weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    elif weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
        bias = bias.to(hidden.dtype) if bias is not None else None
    out = _HeadLogprobs.apply(
        hidden, weight, bias, targets, float(temperature), chunk_tokens, with_entropy
    )
    logp, ent = out  # pyright: ignore[reportGeneralTypeIssues]
    return logp, (ent if with_entropy else None)

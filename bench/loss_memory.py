"""Benchmark: bytes kept for backward per loss token by `response_logprobs`, at a real vocabulary.

A small Qwen3-shaped model (hidden 64, 2 layers, untied head) is built on the spot with the given
vocabulary. Saved bytes are what autograd keeps for backward during the forward of
`response_logprobs(model, batch, with_entropy=True)` (the entropy on, as the RL update computes
it), counted with `torch.autograd.graph.saved_tensors_hooks`: each saved tensor's storage once (by
data_ptr), parameters excluded, divided by the number of loss tokens. The model is bf16.
The old formula (a [B, P, V] logits tensor and an fp32 log-softmax over every scored token) is
measured the same way as the baseline, on `--baseline-tokens` tokens (bytes per token do not
depend on the count). `max_rel_diff` is the largest relative difference (||a - b|| / ||b||, 2-norms)
of the loss and of every parameter gradient against the old formula, in fp32, on
`--check-tokens` tokens, with temperature 0.7 and an entropy bonus in the loss.

    uv run python bench/loss_memory.py --vocab 151936 --tokens 2048 --json OUT
        [--baseline-tokens 512] [--check-tokens 256] [--chunk-tokens 1024]

JSON: {"saved_bytes_per_token", "vocab", "max_rel_diff", "saved_bytes_per_vocab",
"baseline_saved_bytes_per_token", "baseline_saved_bytes_per_vocab", "tokens", ...}.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_trainer.training.batching import TokenBatch, make_batch, response_logprobs
from rstar2_trainer.training.head_logprobs import CHUNK_TOKENS

BOUND_PER_VOCAB = 2.0  # the bound: saved bytes per loss token <= 2 x V


def reference_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    with_entropy: bool = True,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [B, T], [B, T]
    """The formula `response_logprobs` used before the chunked head."""
    b, t = batch.response_ids.shape
    offsets = batch.response_start[:, None] - 1 + torch.arange(t)[None, :]  # [B, T]
    offsets = offsets.clamp(min=0, max=batch.input_ids.shape[1] - 1)
    keep = batch.response_mask > 0  # [B, T]
    rows = torch.arange(b)[:, None].expand(b, t)[keep]  # [N]
    cols = offsets[keep]  # [N]
    positions = torch.unique(cols)  # [P]
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=positions
    ).logits  # [B, P, V]
    picked_logits = logits[rows, torch.searchsorted(positions, cols)]  # [N, V]
    if temperature != 1.0:
        picked_logits = picked_logits / temperature
    logp_all = torch.log_softmax(picked_logits.float(), dim=-1)  # [N, V]
    picked = logp_all.gather(1, batch.response_ids[keep][:, None]).squeeze(1)  # [N]
    logp = torch.zeros((b, t)).masked_scatter(keep, picked)
    entropy = None
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)  # [N]
        entropy = torch.zeros((b, t)).masked_scatter(keep, ent)
    return logp, entropy


def build_model(vocab: int, dtype: torch.dtype) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    model.to(dtype)  # pyright: ignore[reportArgumentType]
    return model


def build_batch(vocab: int, tokens: int, seed: int = 0) -> TokenBatch:
    """Rows of 8 prompt tokens and up to 512 response tokens, `tokens` loss tokens in all."""
    g = torch.Generator().manual_seed(seed)
    sizes = [512] * (tokens // 512) + ([tokens % 512] if tokens % 512 else [])
    prompts = [torch.randint(0, vocab, (8,), generator=g).tolist() for _ in sizes]
    responses = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in sizes]
    return make_batch(prompts, responses, [[1] * n for n in sizes], pad_id=0)


def saved_bytes(model: torch.nn.Module, fn, batch: TokenBatch, **kw) -> int:
    """Bytes autograd keeps for backward in `fn(model, batch, **kw)`: storages once, no params."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(model, batch, **kw)
    del out
    return sum(seen.values())


def max_rel_diff(vocab: int, tokens: int, chunk_tokens: int) -> float:
    """Largest relative difference of the loss and every gradient against the old formula.

    2-norms, not max |a - b| / max |b|: at V=151,936 the embedding gradient's largest entry
    differs by ~1e-5 of the largest one in fp32 (sums over V in another order), 1e-6 elsewhere.
    """
    model = build_model(vocab, torch.float32)
    batch = build_batch(vocab, tokens, seed=1)
    weights = torch.linspace(-1.0, 2.0, batch.response_ids.numel()).reshape(
        batch.response_ids.shape
    )  # [B, T]

    def loss_and_grads(fn, **kw) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logp, entropy = fn(model, batch, with_entropy=True, temperature=0.7, **kw)
        assert entropy is not None
        loss = (logp * weights).sum() - 0.3 * (entropy * batch.response_mask).sum()
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ref = loss_and_grads(reference_logprobs)
    new = loss_and_grads(response_logprobs, chunk_tokens=chunk_tokens)
    if len(ref) != len(new):
        raise SystemExit("the two formulas gave gradients to different parameters")
    return max(
        float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))
        for a, b in zip(new, ref, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--tokens", type=int, default=2048, help="loss tokens, chunked path")
    parser.add_argument("--baseline-tokens", type=int, default=512, help="loss tokens, old path")
    parser.add_argument("--check-tokens", type=int, default=256, help="loss tokens, fp32 check")
    parser.add_argument("--chunk-tokens", type=int, default=CHUNK_TOKENS)
    parser.add_argument("--json", type=Path, default=Path("bench/results/loss_memory.json"))
    args = parser.parse_args(argv)
    for name in ("vocab", "tokens", "baseline_tokens", "check_tokens", "chunk_tokens"):
        if getattr(args, name) <= 0:
            print(f"--{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    torch.set_grad_enabled(True)
    model = build_model(args.vocab, torch.bfloat16)
    t0 = time.perf_counter()
    new = saved_bytes(
        model,
        response_logprobs,
        build_batch(args.vocab, args.tokens),
        with_entropy=True,
        chunk_tokens=args.chunk_tokens,
    )
    new_s = time.perf_counter() - t0
    old = saved_bytes(model, reference_logprobs, build_batch(args.vocab, args.baseline_tokens))
    del model
    diff = max_rel_diff(
        args.vocab, args.check_tokens, min(args.chunk_tokens, args.check_tokens // 3 or 1)
    )
    per_token = new / args.tokens
    old_per_token = old / args.baseline_tokens
    result = {
        "saved_bytes_per_token": per_token,
        "vocab": args.vocab,
        "max_rel_diff": diff,
        "saved_bytes_per_vocab": per_token / args.vocab,
        "baseline_saved_bytes_per_token": old_per_token,
        "baseline_saved_bytes_per_vocab": old_per_token / args.vocab,
        "bound_per_vocab": BOUND_PER_VOCAB,
        "tokens": args.tokens,
        "baseline_tokens": args.baseline_tokens,
        "check_tokens": args.check_tokens,
        "chunk_tokens": args.chunk_tokens,
        "forward_s": new_s,
        "model": "Qwen3 hidden 64, 2 layers, bf16, untied head",
        "machine": platform.machine(),
        "torch": torch.__version__,
    }
    print(f"{'path':<22}{'tokens':>8}{'saved B/token':>16}{'x vocab':>10}")
    print(
        f"{'chunked (now)':<22}{args.tokens:>8}{per_token:>16,.0f}{per_token / args.vocab:>10.3f}"
    )
    print(
        f"{'log_softmax (before)':<22}{args.baseline_tokens:>8}{old_per_token:>16,.0f}"
        f"{old_per_token / args.vocab:>10.3f}"
    )
    print(
        f"max relative difference of loss and gradients (fp32, {args.check_tokens} tokens): {diff:.2e}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0 if per_token <= BOUND_PER_VOCAB * args.vocab else 1


if __name__ == "__main__":
    raise SystemExit(main())

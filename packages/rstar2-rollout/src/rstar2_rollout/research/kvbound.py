"""The most KV cache an engine's requests can ever need from now on, given how far each has come.

A continuous-batching engine without speculative decoding gives every request it is decoding
exactly one token per step, and a request is gone once its `max_tokens` are spent. So a request
with `context` tokens in the cache and at most `remaining` tokens to go holds `context + s` tokens
s steps from now while `s <= remaining`, and nothing after. The KV the engine's requests can need
at step s is the sum of those still there, and `peak_kv_tokens` is its maximum over every future
step: the exact worst case if every request runs to its budget. It is never above the sum of
`context + remaining` (what a scheduler that ignores progress reserves), and well below it when
some requests are close to their end, because they leave before the others reach their peak.

- `running`: requests past their prefill, as `(context, remaining)` pairs.
- `pending`: requests admitted (or about to be) that have not started, as `(context,
  max_tokens)`. When they will start is unknown, so each may be there at any later step, but it
  cannot have grown by more than one token per step from now: `min(context + s, context +
  max_tokens)`.
- `held`: tokens held at every future step (e.g. a request that may be recomputed at once).
- `lag`: a request may fall up to this many steps behind the others (the engine skips it in a
  step), so every curve is taken to go on growing for `lag` more steps: at most `lag` tokens too
  many per request, never too few.
- `block`: the cache is allocated in blocks of this many tokens, so each request may waste
  `block - 1`.

Steps are the engine's, not seconds: the bound holds however fast the steps run. Not covered:
speculative decoding (several tokens per step), and memory the engine gives to anyone else.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate


def peak_kv_tokens(
    running: Iterable[tuple[int, int]],
    pending: Iterable[tuple[int, int]] = (),
    held: int = 0,
    lag: int = 0,
    block: int = 1,
) -> int:
    """Maximum, over every future step, of the KV tokens the requests can hold (module doc)."""
    pad = block - 1
    tokens: dict[int, int] = {0: 0}  # last step a running request may be there -> tokens now
    counts: dict[int, int] = {0: 0}  # ... -> how many running requests
    for ctx, rem in running:
        end = (rem if rem > 0 else 0) + lag
        tokens[end] = tokens.get(end, 0) + ctx + pad
        counts[end] = counts.get(end, 0) + 1
    # pending requests by the step they stop growing, with running sums of context and top
    waits = sorted((max(0, m) + lag, ctx + pad) for ctx, m in pending)
    full = [grows for grows, _ in waits]
    ctx_sum = [0, *accumulate(ctx for _, ctx in waits)]
    top_sum = [0, *accumulate(ctx + grows for grows, ctx in waits)]

    def waiting(s: int) -> int:
        k = bisect_right(full, s)  # these have reached their top by step s
        return top_sum[k] + ctx_sum[-1] - ctx_sum[k] + (len(waits) - k) * s

    # Between two consecutive ends of running requests nobody leaves and everyone grows, so the
    # maximum is at an end, or after the last end (pending ones at their top): sweep the ends from
    # the last one back to now, adding each running request as s falls to its end.
    peak, here, count = held + top_sum[-1], 0, 0
    for s in sorted(tokens, reverse=True):
        here += tokens[s]
        count += counts[s]
        peak = max(peak, held + here + count * s + waiting(s))
    return peak

"""Rows into tensors, packed or padded, and the per-token logprobs of a causal LM on them.

Letters: B rows, M tokens of a pack (the rows concatenated), L padded row length, T padded
response length, V vocabulary.
A row is `prompt_ids + response_ids`; only response positions are scored, and of those only the
ones whose loss mask is 1 enter a loss. Two layouts of the same rows (`TokenBatch`):
- packed (`pack_batch`, what training runs): the rows one after another in a single sequence
  [1, M], position ids restarting at 0 on each row, the row boundaries as `cu_seqlens`; the model
  attends within each row (`attention.use_packed_attention`: varlen Flash Attention on CUDA, one
  causal SDPA per row elsewhere), so no compute goes to padding and no M x M mask exists;
- padded (`make_batch`): each row right-padded to the longest, [B, L], with a [B, L] attention
  mask that transformers turns into a [B, 1, L, L] mask for SDPA: the reference the packed path
  is tested against, and what bench/padding.py and the GPU check compare it with.
Either way the response side is [B, T] (ids, loss mask, and the logprobs returned), so the
losses see the same tensors. The output head and the log-softmax run chunked
(`head_logprobs`): autograd keeps no [tokens, V] tensor, 16 bytes a scored token beside its
hidden state (bench/loss_memory.py: 0.045 x V a loss token at V=151,936, against 8.04 x V before).

Micro-batches (`token_budget_chunks`, `longest_first_chunks`) hold at most `max_tokens`
tokens: the rows' own tokens when packed, rows x the longest row when padded; a row longer than
the budget is a micro-batch alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Protocol

import torch

from rstar2_trainer.training.attention import use_packed_attention
from rstar2_trainer.training.head_logprobs import CHUNK_TOKENS, head_logprobs


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [1, M] packed, [B, L] padded
    attention_mask: torch.Tensor | None  # [B, L] padded; None packed
    response_start: torch.Tensor  # [B] index of the first response token within each row
    response_mask: torch.Tensor  # [B, T] loss mask of the response, 0 on padding
    response_ids: torch.Tensor  # [B, T]
    position_ids: torch.Tensor | None = None  # [1, M] packed: 0.. on each row
    cu_seqlens: torch.Tensor | None = None  # [B + 1] int32 packed: row boundaries in the pack
    longest: int = 0  # packed: the longest row's tokens

    def to(self, device: torch.device) -> TokenBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(
            self,
            **{f.name: move(getattr(self, f.name)) for f in fields(self) if f.name != "longest"},
        )


def _responses(
    responses: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:  # ids [B, T], loss mask [B, T]
    t = max(1, max((len(r) for r in responses), default=0))
    ids = torch.full((len(responses), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(responses), t), dtype=torch.float32)
    for i, (resp, m) in enumerate(zip(responses, masks, strict=True)):
        if resp:
            ids[i, : len(resp)] = torch.tensor(list(resp))
            mask[i, : len(m)] = torch.tensor(list(m), dtype=torch.float32)
    return ids, mask


def make_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    masks: Sequence[Sequence[int]],
    pad_id: int,
) -> TokenBatch:
    """Right-pad prompt+response rows to the longest; responses are gathered into [B, T]."""
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
    response_ids, response_mask = _responses(responses, masks, pad_id)
    start = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return TokenBatch(input_ids, attention, start, response_mask, response_ids)


def pack_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    masks: Sequence[Sequence[int]],
    pad_id: int,
) -> TokenBatch:
    """The prompt+response rows concatenated into one sequence [1, M], no padding; position ids
    restart on each row and `cu_seqlens` marks the boundaries. `pad_id` pads only [B, T]."""
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    lengths = [len(r) for r in rows]
    input_ids = torch.tensor([[t for r in rows for t in r]], dtype=torch.long)  # [1, M]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None, :]  # [1, M]
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    response_ids, response_mask = _responses(responses, masks, pad_id)
    start = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return TokenBatch(
        input_ids, None, start, response_mask, response_ids, position_ids, cu, max(lengths)
    )


def response_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of every response token under `model` ([B, T]), and its entropy when asked.

    A packed batch runs the model once over its one sequence, each row attending only to
    itself (`attention.use_packed_attention`, switched on here the first time); a padded batch
    runs it over [B, L] with the attention mask. Both give the same logprobs up to float
    reassociation.

    `temperature` divides the logits first, so the distribution scored is the one the sampler
    drew from: RL optimises the tempered policy the rollouts came from (as verl does).

    Only positions under the response mask are scored (0 elsewhere): the model runs over the
    whole sequence, but its output projection runs only on the positions some row scores
    (`logits_to_keep`), and the softmax only where a loss is taken. For a long shared prompt
    that is a large share of a small model's cost.

    The output projection and the log-softmax are one chunked autograd function
    (`head_logprobs`): no [tokens, V] tensor is kept for backward (16 bytes a token beside the
    hidden state, not ~8 x V), and each chunk of `chunk_tokens` costs chunk x V x 10 bytes while
    it runs. The entropy is differentiable (an entropy bonus gets its exact gradient); detach it
    where it is only a metric, it then costs nothing in backward. Without `with_entropy` it is
    not computed at all (SFT, the old logprobs): on a small model, where the head is most of the
    work, the entropy's [C, V] terms in both passes were a large share of a step.

    The root module is always called, so wrappers that hook its forward (FSDP2: the root's
    hooks unshard the head and embeddings) see every call: for that call the head instance's
    `forward` is replaced by one that returns the scored tokens' (logp, entropy) as `.logits`
    ([N, 2], or [N, 1] without the entropy); parameter names are unchanged, so checkpoints stay valid.
    """
    b, t = batch.response_ids.shape
    device = batch.input_ids.device
    # The token at position j of a row is predicted by the output at j - 1; a pack's row r
    # starts at cu_seqlens[r] of its one sequence, a padded row at 0 of its own.
    offsets = batch.response_start[:, None] - 1 + torch.arange(t, device=device)[None, :]  # [B, T]
    offsets = offsets.clamp(min=0)
    if batch.cu_seqlens is not None:
        offsets = offsets + batch.cu_seqlens[:-1, None].to(device=device, dtype=torch.long)
        sequence = torch.zeros(b, dtype=torch.long, device=device)  # [B] every row in the pack
    else:
        sequence = torch.arange(b, device=device)  # [B]
    offsets = offsets.clamp(max=batch.input_ids.shape[1] - 1)
    keep = batch.response_mask > 0  # [B, T]
    rows = sequence[:, None].expand(b, t)[keep]  # [N] the sequence each scored token is in
    cols = offsets[keep]  # [N]
    targets = batch.response_ids[keep]  # [N]
    positions = torch.unique(cols)  # [P], sorted
    at = torch.searchsorted(positions, cols)  # [N] index into P
    head = model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(model).__name__}'s output head is not an nn.Linear")

    def scored(input: torch.Tensor) -> torch.Tensor:  # [B or 1, P, H] -> [N, 2] or [N, 1]
        logp, ent = head_logprobs(
            input[rows, at],  # [N, H]
            head.weight,
            head.bias,
            targets,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
            with_entropy=with_entropy,
        )
        # A new tensor either way: FSDP2 warns when a module returns a view.
        return torch.stack([logp] if ent is None else [logp, ent], dim=-1)

    if batch.cu_seqlens is not None:
        use_packed_attention(model)
        cu = batch.cu_seqlens.to(device)
        inputs = {
            "position_ids": batch.position_ids,
            "use_cache": False,
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": batch.longest,
            "max_length_k": batch.longest,
            "row_bounds": tuple(batch.cu_seqlens.tolist()),  # the rows kernel slices with them
        }
    else:
        inputs = {"attention_mask": batch.attention_mask}
    previous = head.__dict__.get("forward")
    head.forward = scored
    try:
        out = model(input_ids=batch.input_ids, logits_to_keep=positions, **inputs).logits  # [N, 2]
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous
    picked = out[:, 0]  # [N]
    logp = torch.zeros((b, t), dtype=picked.dtype, device=device).masked_scatter(keep, picked)
    entropy = None
    if with_entropy:
        ent = out[:, 1]  # [N]
        entropy = torch.zeros((b, t), dtype=ent.dtype, device=device).masked_scatter(keep, ent)
    return logp, entropy


class Grouping(Protocol):
    """(row lengths, max tokens, packed) -> row indices per micro-batch."""

    def __call__(
        self, lengths: Sequence[int], max_tokens: int, *, packed: bool = True
    ) -> Iterable[list[int]]: ...


def _tokens(longest: int, total: int, rows: int, packed: bool) -> int:
    """A micro-batch's tokens: its rows' own when packed, rows x the longest when padded."""
    return total if packed else longest * rows


def token_budget_chunks(
    lengths: Sequence[int], max_tokens: int, *, packed: bool = True
) -> Iterator[list[int]]:
    """Row indices shortest first, each micro-batch filled while it stays within `max_tokens`
    (`_tokens`): the RL step's grouping."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunk: list[int] = []
    longest = total = 0
    for i in order:
        wider = max(longest, lengths[i])
        if chunk and _tokens(wider, total + lengths[i], len(chunk) + 1, packed) > max_tokens:
            yield chunk
            chunk, longest, total = [], 0, 0
        chunk.append(i)
        longest, total = max(longest, lengths[i]), total + lengths[i]
    if chunk:
        yield chunk


def longest_first_chunks(
    lengths: Sequence[int], max_tokens: int, *, packed: bool = True
) -> list[list[int]]:
    """Row indices longest first, each into the first micro-batch it fits (`_tokens` within
    `max_tokens`; a longer row alone): SFT's grouping. Padded, only the last micro-batch takes
    rows (its first row the widest), as SFT's numbers were measured with."""
    out: list[list[int]] = []
    sizes: list[tuple[int, int]] = []  # (longest, total) per micro-batch
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        candidates = range(len(out)) if packed else range(max(0, len(out) - 1), len(out))
        for k in candidates:
            longest, total = sizes[k]
            if _tokens(longest, total + lengths[i], len(out[k]) + 1, packed) <= max_tokens:
                out[k].append(i)
                sizes[k] = (longest, total + lengths[i])
                break
        else:
            out.append([i])
            sizes.append((lengths[i], lengths[i]))
    return out

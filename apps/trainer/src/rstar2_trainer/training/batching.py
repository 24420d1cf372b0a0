"""Padding sequences into tensors and computing per-token logprobs of a causal LM.

Letters: B sequences, L padded sequence length, T padded response length, V vocabulary.
A sequence is `prompt_ids + response_ids`; only response positions are scored, and of those only
the ones whose loss mask is 1 enter a loss. The output head and the log-softmax run chunked
(`head_logprobs`): autograd keeps no [tokens, V] tensor, 16 bytes a scored token beside its
hidden state (bench/loss_memory.py: 0.045 x V a loss token at V=151,936, against 8.04 x V before).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from rstar2_trainer.training.head_logprobs import CHUNK_TOKENS, head_logprobs


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    response_start: torch.Tensor  # [B] index of the first response token in each row
    response_mask: torch.Tensor  # [B, T] loss mask of the response, 0 on padding
    response_ids: torch.Tensor  # [B, T]


def make_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    masks: Sequence[Sequence[int]],
    pad_id: int,
) -> TokenBatch:
    """Right-pad prompt+response rows; responses are also gathered into [B, T] tensors."""
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    length = max(len(r) for r in rows)
    t = max(1, max(len(r) for r in responses))
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    response_ids = torch.full((b, t), pad_id, dtype=torch.long)
    response_mask = torch.zeros((b, t), dtype=torch.float32)
    for i, (row, resp, mask) in enumerate(zip(rows, responses, masks, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        if resp:
            response_ids[i, : len(resp)] = torch.tensor(list(resp))
            response_mask[i, : len(mask)] = torch.tensor(list(mask), dtype=torch.float32)
    start = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return TokenBatch(input_ids, attention, start, response_mask, response_ids)


def response_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of every response token under `model` ([B, T]), and its entropy when asked.

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
    # The token at position j is predicted by the output at j - 1.
    offsets = batch.response_start[:, None] - 1 + torch.arange(t, device=device)[None, :]  # [B, T]
    offsets = offsets.clamp(min=0, max=batch.input_ids.shape[1] - 1)
    keep = batch.response_mask > 0  # [B, T]
    rows = torch.arange(b, device=device)[:, None].expand(b, t)[keep]  # [N]
    cols = offsets[keep]  # [N]
    targets = batch.response_ids[keep]  # [N]
    positions = torch.unique(cols)  # [P], sorted
    at = torch.searchsorted(positions, cols)  # [N] index into P
    head = model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(model).__name__}'s output head is not an nn.Linear")

    def scored(input: torch.Tensor) -> torch.Tensor:  # [B, P, H] -> [N, 2] or [N, 1]
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

    previous = head.__dict__.get("forward")
    head.forward = scored
    try:
        out = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=positions
        ).logits  # [N, 2]
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


def token_budget_chunks(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Group row indices into micro-batches whose padded size stays under `max_tokens`."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunk: list[int] = []
    longest = 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if chunk and longest_if * (len(chunk) + 1) > max_tokens:
            yield chunk
            chunk, longest_if = [], lengths[i]
        chunk.append(i)
        longest = longest_if
    if chunk:
        yield chunk

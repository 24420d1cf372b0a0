"""The program test_distributed.py launches under torchrun (or plain python, a world of one).

It trains a tiny random Qwen3 with FSDP2 on fixed rows split unevenly over the ranks and writes,
on rank 0, each step's loss, grad norm and full weights to --out. The test compares them with
`reference_step`, a plain single-process step over the whole batch that shares no code with
`train_step`'s micro-batching or normalisation, on padded rows where `train_step` packs them.

  torchrun --nproc-per-node 2 _fsdp_worker.py train --out DIR [--activation-checkpointing]
  python _fsdp_worker.py resume --checkpoint DIR/ckpt/step_000001 --out DIR2
  torchrun --nproc-per-node 2 _fsdp_worker.py checkpoint --model-dir M --checkpoint ROOT --out DIR
      (a model folder trained one step, saved as the trainer's workers save it: step 1 under
      ROOT, and its full weights as DIR/trained.pt)
  torchrun --nproc-per-node 2 _fsdp_worker.py load --model-dir M --out DIR
      (M loaded shard by shard on the meta device: its full weights as DIR/loaded.pt, the
      logits of `probe_ids()` as DIR/logits.pt, the weights written back by rank 0 as
      safetensors into DIR/export in buckets of 4 KB, and, after loading M/model.pt (rank 0
      reads it, all get their shards), the full weights as DIR/from_pt.pt)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_trainer.rundir.sharded_checkpoint import load_sharded, save_sharded
from rstar2_trainer.training.distributed import (
    DistributedConfig,
    MicroBatch,
    Row,
    close_distributed,
    full_state_dict,
    init_distributed,
    load_full_weights,
    load_sharded_model,
    make_micro_batch,
    save_safetensors,
    shard_model,
    train_step,
)

VOCAB, PAD, SEED = 96, 0, 1234
LR, MAX_GRAD_NORM, MICRO_BATCH_TOKENS = 1e-3, 0.5, 48


def build_model() -> torch.nn.Module:
    torch.manual_seed(SEED)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).float()


def probe_ids() -> torch.Tensor:
    return torch.tensor([[5, 17, 33, 2, 90, 41, 7, 64], [1, 2, 3, 4, 5, 6, 7, 8]])  # [2, 8]


def build_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def rows_for_step(step: int) -> list[Row]:
    """Eight rows of very different lengths; tool-output stretches masked out of the loss."""
    rng = random.Random(SEED * 100 + step)
    rows = []
    for i in range(8):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))]
        n = 3 + (i * 7 + step * 5) % 19
        response = [rng.randrange(1, VOCAB) for _ in range(n)]
        mask = [0 if 2 <= j < 2 + i % 4 else 1 for j in range(n)]
        advantages = [(-1.0) ** i * (0.5 + 0.1 * i)] * n
        old_logp = [-4.6 + 0.3 * rng.random() for _ in range(n)]
        rows.append(Row(prompt, response, mask, {"advantages": advantages, "old_logp": old_logp}))
    return rows


def rank_rows(rows: list[Row], rank: int, world_size: int) -> list[Row]:
    """A deliberately uneven split: rank 0 takes five rows, rank 1 three."""
    if world_size == 1:
        return rows
    assert world_size == 2
    return rows[:5] if rank == 0 else rows[5:]


def policy_loss(logp: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """The clipped surrogate (0.2 / 0.28), per token: the shape of the RL loss."""
    ratio = torch.exp(logp - mb.values["old_logp"])  # [B, T]
    adv = mb.values["advantages"]  # [B, T]
    return -torch.minimum(ratio * adv, ratio.clamp(1 - 0.2, 1 + 0.28) * adv)  # [B, T]


def reference_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rows: list[Row]
) -> tuple[float, float]:
    """One plain step: the whole batch at once, rows padded (`train_step` packs them), token
    mean, clip, AdamW. (loss, grad norm)."""
    from rstar2_trainer.training.batching import response_logprobs

    mb = make_micro_batch(rows, PAD, torch.device("cpu"), packed=False)
    logp, _ = response_logprobs(model, mb.batch)
    mask = mb.batch.response_mask
    loss = (policy_loss(logp, mb) * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    return float(loss.detach()), float(norm)


def _step(model, optimizer, step: int, rank: int, world_size: int) -> dict:
    rows = rank_rows(rows_for_step(step), rank, world_size)
    result = train_step(
        model,
        optimizer,
        rows,
        policy_loss,
        pad_id=PAD,
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        max_grad_norm=MAX_GRAD_NORM,
    )
    return {
        "loss": result.loss,
        "grad_norm": result.grad_norm,
        "micro_batches": result.micro_batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "resume", "checkpoint", "load"])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--activation-checkpointing", action="store_true")
    args = parser.parse_args()
    config = DistributedConfig(device="cpu", activation_checkpointing=args.activation_checkpointing)
    world = init_distributed(config)
    rank, ws = world.rank, world.world_size
    record: dict = {"world_size": ws, "steps": {}}

    def snapshot(name: str, model: torch.nn.Module, metrics: dict) -> None:
        weights = full_state_dict(model)
        if rank == 0:
            torch.save(weights, args.out / f"{name}.pt")
            record["steps"][name] = metrics

    if args.mode == "load":
        model = load_sharded_model(args.model_dir, config, world)
        with torch.no_grad():
            logits = model(probe_ids()).logits
        weights = full_state_dict(model)
        if rank == 0:
            torch.save(weights, args.out / "loaded.pt")
            torch.save(logits, args.out / "logits.pt")
            (args.out / "export").mkdir()
        torch.distributed.barrier()
        save_safetensors(model, args.out / "export", bucket_bytes=4096)
        load_full_weights(model, args.model_dir / "model.pt")
        weights = full_state_dict(model)
        if rank == 0:
            torch.save(weights, args.out / "from_pt.pt")
        close_distributed()
        return
    if args.mode == "checkpoint":
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
        model = shard_model(loaded, config, world)
        optimizer = build_optimizer(model)
        _step(model, optimizer, 1, rank, ws)
        assert args.checkpoint is not None
        save_sharded(args.checkpoint, 1, model=model, optimizer=optimizer, keep=3)
        weights = full_state_dict(model)
        if rank == 0:
            torch.save(weights, args.out / "trained.pt")
        close_distributed()
        return
    model = shard_model(build_model(), config, world)
    optimizer = build_optimizer(model)
    if args.mode == "train":
        snapshot("step1", model, _step(model, optimizer, 1, rank, ws))
        save_sharded(args.out / "ckpt", 1, model=model, optimizer=optimizer, state={"seen": 8})
        snapshot("step2", model, _step(model, optimizer, 2, rank, ws))
        # Resume at the same world size into a fresh model and optimizer.
        model = shard_model(build_model(), config, world)
        optimizer = build_optimizer(model)
        load_sharded(args.out / "ckpt" / "step_000001", model=model, optimizer=optimizer)
        snapshot("resumed_step2", model, _step(model, optimizer, 2, rank, ws))
    else:
        assert args.checkpoint is not None
        state = load_sharded(args.checkpoint, model=model, optimizer=optimizer)
        record["state"] = state
        snapshot("resumed_step2", model, _step(model, optimizer, 2, rank, ws))
    if rank == 0:
        (args.out / "record.json").write_text(json.dumps(record, indent=2))
    close_distributed()


if __name__ == "__main__":
    main()
    # Leave without Python's finalisation. The sharded model keeps the gloo process group alive
    # past destroy_process_group, so its worker threads may still be dropping the last reference
    # to an all-gather's tensors; once finalisation has begun, such a thread cannot take the GIL,
    # Python 3.11 unwinds it by force and the process aborts ("terminate called without an
    # active exception", seen under load in CI and reproduced here with a core dump).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

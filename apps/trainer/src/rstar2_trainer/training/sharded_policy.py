"""The RL policy trained on FSDP2 ranks: the loop's handle with `cluster.train_workers`.

With `cluster.train_workers: N` (N > 0) the placement starts N FSDP2 ranks
(`train_workers.TrainGroup`; Ray actors, colocated with the engines or on GPUs of their own)
and the policy update of every RL step runs on them instead of in the driver:

    driver: kept trajectories + advantages -> rows ---> rank 0 .. N-1 (rows split by tokens)
            lr, the algorithm's loss, temperature        train_step: forward, backward, AdamW
                                                         on the sharded parameters and state

- `ShardedPolicy(group, config, model_dir)` is a `policy.Policy`: `update(...)` runs
  `distributed.train_step` on the ranks, the step the driver's `DriverPolicy` runs as a world of
  one: the same loss (`RLTokenLoss`), the same global normalisation, the same metrics (loss,
  grad_norm, clip fractions, entropy, ...); `optim.mini_batches` x `optim.epochs` give one rank
  step per mini-batch and epoch; the old logprobs are computed on the ranks first
  (`distributed.row_logprobs`), as the driver does.
- `weights()` is the rank group: what the placement's weight mover pushes from
  (placement/weights.py). The policy chooses no transport and moves no training state: the
  mover puts the engines to sleep and the state on the devices before the loop calls any of
  the methods below, each of which runs collectives on the ranks.
- `sft(examples, ...)` runs non-reasoning SFT on the ranks: `sft.sft_loop`, the driver's loop,
  each step a `train_step` over the ranks.
- `load_weights(checkpoint)` (`--init-from`) loads a checkpoint's weights into the ranks from its
  files (the workers' shards, or a driver's `model.pt` read by rank 0 and broadcast).
- Checkpoints: `save(checkpoints, step, state)` writes the ranks' sharded model and optimizer to
  `checkpoints/workers/step_NNNNNN/` (DCP, loads at any world size), before the driver writes its
  own checkpoint (curriculum, RNG, step; no model) so the driver's `latest` never points at a step
  the workers lack; `restore(checkpoint)` loads that step into the ranks.
- `export(out, tokenizer, ...)` writes the policy folder: safetensors from rank 0, gathered
  parameter by parameter and written bucket by bucket; the config copied from the model folder.

The driver holds no model: the ranks load the model folder (meta-device init, shard by shard),
the engines load it themselves, and nothing travels until the first push.

A LoRA policy (`model.lora`) lives on the ranks the same way (`lora.load_sharded_lora_model`);
its checkpoints hold the adapters and their optimizer state (the sharded checkpoint skips frozen
parameters), `export` writes the PEFT adapter folder from rank 0's gathered adapter, and
`load_weights` leaves it alone (its base is the origin's weights already, origin.py).

Not covered: a batch with fewer kept trajectories than ranks (an error that says what to
change).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import SFTConfig, TrainerConfig
from rstar2_trainer.rundir.checkpoint import (
    TRAIN_WORKERS_DIR,
    Checkpoint,
    save_adapter_policy,
    save_checkpoint,
    write_policy,
)
from rstar2_trainer.training.distributed import (
    DistributedConfig,
    Row,
    StepResult,
    longest_first_chunks,
)
from rstar2_trainer.training.sft import (
    MAX_GRAD_NORM,
    Example,
    OnStep,
    SFTResult,
    sft_loop,
    sft_loss,
)
from rstar2_trainer.training.train_workers import TrainGroup
from rstar2_trainer.training.update import RLTokenLoss, merge_steps, mini_batches, policy_rows


class ShardedPolicy:
    """The driver's handle on the policy that lives, sharded, on the training ranks."""

    def __init__(
        self, group: TrainGroup, config: TrainerConfig, model_dir: Path, *, pad_id: int
    ) -> None:
        assert config.cluster is not None
        self.group = group
        self.model_dir = model_dir
        self.config = config
        self.cluster = config.cluster
        self.pad_id = pad_id
        self.loss = RLTokenLoss(config.algo)

    async def update(
        self,
        kept: Sequence[Trajectory],
        advantages: torch.Tensor,  # [K]
        *,
        lr: float,
        temperature: float,
    ) -> dict[str, float]:
        """One rank step per mini-batch and epoch; the metrics `DriverPolicy.update` gives."""
        o = self.config.optim
        rows = policy_rows(kept, advantages)
        parts = mini_batches(rows, o.mini_batches)
        if min(len(p) for p in parts) < len(self.group.actors):
            raise ValueError(
                f"{len(kept)} kept trajectories in {len(parts)} mini-batches cannot give each of "
                f"{len(self.group.actors)} training workers one; lower cluster.train_workers or "
                "optim.mini_batches, or raise curriculum.batch_size"
            )
        if o.mini_batches * o.epochs > 1:
            rows = await self.group.with_old_logprobs(
                rows,
                pad_id=self.pad_id,
                micro_batch_tokens=o.micro_batch_tokens,
                temperature=temperature,
            )
            parts = mini_batches(rows, o.mini_batches)
        steps = []
        for _ in range(o.epochs):
            for part in parts:
                steps.append(
                    await self.group.step(
                        part,
                        self.loss,
                        lr=lr,
                        pad_id=self.pad_id,
                        micro_batch_tokens=o.micro_batch_tokens,
                        max_grad_norm=o.grad_clip,
                        normalize_by=self.loss.normalize_by,
                        temperature=temperature,
                        with_entropy=True,
                    )
                )
        return merge_steps(steps)

    def weights(self) -> TrainGroup:
        """The ranks that hold the weights, sharded: what the placement's mover pushes from."""
        return self.group

    async def sft(
        self, examples: Sequence[Example], sft: SFTConfig, *, seed: int, on_step: OnStep
    ) -> SFTResult:
        """SFT on the ranks: `sft.sft_loop`, each step a `train_step` over the ranks with
        `sft_loss`. The ranks' optimizer is SFT's during it and a fresh RL one after."""
        await self.group.reset_optimizer(lr=sft.lr, weight_decay=0.0, betas=(0.9, 0.999))

        async def step(rows: list[Row], lr: float) -> StepResult:
            return await self.group.step(
                rows,
                sft_loss,
                lr=lr,
                pad_id=self.pad_id,
                micro_batch_tokens=sft.micro_batch_tokens,
                max_grad_norm=MAX_GRAD_NORM,
                normalize_by="tokens",
                grouping=longest_first_chunks,
            )

        result = await sft_loop(
            step,
            examples,
            epochs=sft.epochs,
            batch_size=sft.batch_size,
            lr=sft.lr,
            warmup_ratio=sft.warmup_ratio,
            seed=seed,
            min_size=len(self.group.actors),
            on_step=on_step,
        )
        await self.group.reset_optimizer()
        return result

    async def load_weights(self, checkpoint: Path) -> None:
        """Checkpoint folder `checkpoint`'s weights into the ranks, read there: the workers'
        shards of that step, or the driver's `model.pt`. The caller put the state on the devices
        first (the mover's `sleep`: colocated ranks offload it before their engines start)."""
        if getattr(self.config.model, "lora", None) is not None:
            return  # the base folder holds the origin's weights; fresh adapters
        shards = checkpoint.parent / TRAIN_WORKERS_DIR / checkpoint.name
        if (shards / ".metadata").is_file():
            await self.group.load_weights(shards)
        else:
            await self.group.load_weights(checkpoint / "model.pt")

    async def reset_optimizer(self) -> None:
        await self.group.reset_optimizer()

    async def save(self, checkpoints: Path, step: int, state: dict[str, Any]) -> None:
        """The ranks' sharded checkpoint, then the driver's (no model.pt)."""
        # One more than the driver keeps: a run killed between the two saves resumes from the
        # driver's previous step, which must still be on disk.
        keep = self.config.run.keep_checkpoints + 1
        await self.group.save(checkpoints / TRAIN_WORKERS_DIR, step, keep=keep)
        save_checkpoint(
            checkpoints,
            step,
            model=None,
            optimizer=None,
            state=state,
            keep=self.config.run.keep_checkpoints,
        )

    async def restore(self, checkpoint: Checkpoint) -> None:
        step = checkpoint.step
        path = checkpoint.path.parent / TRAIN_WORKERS_DIR / f"step_{step:06d}"
        if not (path / ".metadata").is_file():
            raise FileNotFoundError(
                f"{path} is missing: the checkpoint of step {step} was written without training "
                "workers; resume with cluster.train_workers=0"
            )
        await self.group.load(path)

    async def export(self, out: Path, tokenizer: Any, *, system_prompt: str, step: int) -> Path:
        """The policy folder, its weights written by rank 0 (`TrainGroup.export`), its config
        copied from the model folder; a LoRA policy's adapter folder (rank 0's gathered adapter)."""
        if getattr(self.config.model, "lora", None) is not None:
            adapter = await self.group.adapter("float32")
            return save_adapter_policy(
                adapter, tokenizer, out, system_prompt=system_prompt, step=step
            )
        return await write_policy(
            lambda tmp: self.group.export(tmp),
            self.model_dir,
            tokenizer,
            out,
            system_prompt=system_prompt,
            step=step,
        )


def distributed_config(config: TrainerConfig) -> DistributedConfig:
    """How the ranks shard and step, from the cluster, train and optim sections."""
    cluster = config.cluster
    assert cluster is not None
    return DistributedConfig(
        device="cuda" if cluster.gpus_per_train_worker else "cpu",
        param_dtype=config.train.dtype,
        activation_checkpointing=cluster.activation_checkpointing,
        micro_batch_tokens=config.optim.micro_batch_tokens,
        max_grad_norm=config.optim.grad_clip,
    )


@contextlib.asynccontextmanager
async def open_sharded_policy(
    config: TrainerConfig, model_dir: Path, *, pad_id: int, group: TrainGroup | None
) -> AsyncIterator[ShardedPolicy | None]:
    """The policy on the ranks the placement started (`group`), or None when the driver
    trains (`cluster.train_workers` 0). The placement closes the ranks."""
    cluster = config.cluster
    if cluster is None or cluster.train_workers == 0:
        yield None
        return
    if group is None:
        raise ValueError(
            f"cluster.train_workers is {cluster.train_workers} but the placement started no ranks"
        )
    yield ShardedPolicy(group, config, model_dir, pad_id=pad_id)

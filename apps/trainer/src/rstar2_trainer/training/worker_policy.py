"""The RL policy trained on FSDP2 workers: the loop's handle with `cluster.train_workers`.

With `cluster.train_workers: N` (N > 0) the policy update of every RL step runs on N FSDP2 ranks,
one Ray actor each (`train_workers.TrainGroup`), instead of in the driver:

    driver: kept trajectories + advantages -> rows ---> rank 0 .. N-1 (rows split by tokens)
            lr, the algorithm's loss, temperature        train_step: forward, backward, AdamW
                                                         on the sharded parameters and state
    engines <-- weight channel <-- rank 0               (gloo / NCCL broadcast of bf16
                                                         buckets; the driver never holds them)

- `open_worker_policy(config, model_dir)` yields None when `train_workers` is 0 (the driver
  trains as before), else a `WorkerPolicy` whose ranks loaded the model folder; it closes them
  on exit.
- It is a `policy.Policy`: `update(...)` runs `distributed.train_step` on the ranks, the step
  the driver's `DriverPolicy` runs as a world of one: the same loss (`WorkerPolicyLoss`), the
  same global normalisation, the same metrics (loss, grad_norm, clip fractions, entropy, ...);
  `optim.mini_batches` x `optim.epochs` give one rank step per mini-batch and epoch; the old
  logprobs are computed on the ranks first (`distributed.row_logprobs`), as the driver does.
- `sync(parts)` sends the weights to the engines and returns the `time_sync_s` metrics: split,
  every rank gathers and rank 0 broadcasts `cluster.bucket_bytes` buckets in the engines' dtype
  over a weight channel the engine actors join (`Engines.push_channel`; a dead engine is
  dropped, the step goes on); colocated, each rank pushes into its own engine.
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
the engines load it themselves, and nothing travels until the first `sync`.

Not covered: training ranks on GPUs held by colocated engines (the config refuses `colocate`
with `train_workers`), a batch with fewer kept trajectories than ranks (an
error that says what to change).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import SFTConfig, TrainerConfig
from rstar2_trainer.placement.colocated import ColocatedGroup
from rstar2_trainer.rundir.checkpoint import Checkpoint, save_checkpoint, write_policy
from rstar2_trainer.sft import MAX_GRAD_NORM, Example, OnStep, SFTResult, sft_loop, sft_loss
from rstar2_trainer.training.distributed import (
    DistributedConfig,
    Row,
    StepResult,
    longest_first_chunks,
)
from rstar2_trainer.training.train_workers import TrainGroup, TrainWorker
from rstar2_trainer.training.update import WorkerPolicyLoss, merge_steps, mini_batches, policy_rows

G = TypeVar("G", bound=TrainGroup)

WORKERS_DIR = "workers"  # the ranks' sharded checkpoints, under the run's checkpoints/


class WorkerPolicy:
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
        self.loss = WorkerPolicyLoss(config.algo)

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
        onloaded = await self._onload()
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
        return {**merge_steps(steps), **onloaded}

    async def sync(self, parts: Any) -> dict[str, float]:
        """The ranks' weights into every engine; `time_sync_s` and its parts.

        Colocated, each rank pushes into its own engine (wake its weights, push, offload the
        training state, wake its KV cache); split, rank 0's weights go to every engine."""
        if not isinstance(self.group, ColocatedGroup):
            pushed = await parts.engines.push_channel(
                self.group, bucket_bytes=self.cluster.bucket_bytes
            )
            return pushed.as_metrics()
        engines = parts.engines
        start = time.perf_counter()
        wake_s = await engines.wake(["weights"])
        pushed = await self.group.push(self.cluster.bucket_bytes)
        metrics = {
            "time_sync_load_s": pushed["seconds"],
            "sync_bytes": pushed["bytes_moved"],
            "sync_buckets": pushed["buckets"],
        }
        if self.cluster.offloads:
            moved = await self.group.offload()
            metrics.update(time_offload_s=moved["seconds"], offload_bytes=moved["bytes"])
        wake_s += await engines.wake(["kv_cache"])
        metrics.update(time_wake_s=wake_s, time_sync_s=time.perf_counter() - start)
        return metrics

    async def _onload(self) -> dict[str, float]:
        """Colocated with offload: the training state back on the devices before a step."""
        if not (isinstance(self.group, ColocatedGroup) and self.cluster.offloads):
            return {}
        moved = await self.group.onload()
        return {"time_onload_s": moved["seconds"], "onload_bytes": moved["bytes"]}

    async def sft(
        self, examples: Sequence[Example], sft: SFTConfig, *, seed: int, on_step: OnStep
    ) -> SFTResult:
        """SFT on the ranks: `sft.sft_loop`, each step a `train_step` over the ranks with
        `sft_loss`. The ranks' optimizer is SFT's during it and a fresh RL one after.
        Colocated, the caller put the engines to sleep; the training state comes back first."""
        await self._onload()
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
        shards of that step, or the driver's `model.pt`. Colocated with offload the state
        comes back on the devices first (the ranks offload it before their engines start)."""
        await self._onload()
        shards = checkpoint.parent / WORKERS_DIR / checkpoint.name
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
        await self.group.save(checkpoints / WORKERS_DIR, step, keep=keep)
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
        path = checkpoint.path.parent / WORKERS_DIR / f"step_{step:06d}"
        if not (path / ".metadata").is_file():
            raise FileNotFoundError(
                f"{path} is missing: the checkpoint of step {step} was written without training "
                "workers; resume with cluster.train_workers=0"
            )
        await self._onload()  # offloaded before the engines started
        await self.group.load(path)

    async def export(self, out: Path, tokenizer: Any, *, system_prompt: str, step: int) -> Path:
        """The policy folder, its weights written by rank 0 (`TrainGroup.export`), its config
        copied from the model folder."""
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


async def start_train_group(
    config: TrainerConfig,
    model_dir: Path,
    *,
    group_class: type[G] = TrainGroup,
    actor_class: type = TrainWorker,
) -> G:
    """`cluster.train_workers` ranks of `actor_class` on the model folder, set up from the
    cluster, train and optim sections (colocated placement passes its own classes)."""
    cluster = config.cluster
    assert cluster is not None
    return await group_class.start(
        cluster.train_workers,
        model_dir,
        distributed_config(config),
        lr=config.optim.lr,
        betas=config.optim.betas,
        weight_decay=config.optim.weight_decay,
        gpus_per_worker=cluster.gpus_per_train_worker,
        cpus_per_worker=cluster.cpus_per_train_worker,
        threads=cluster.train_threads,
        timeout_s=cluster.start_timeout_s,
        actor_class=actor_class,
    )


@contextlib.asynccontextmanager
async def open_worker_policy(
    config: TrainerConfig, model_dir: Path, *, pad_id: int, group: TrainGroup | None = None
) -> AsyncIterator[WorkerPolicy | None]:
    """Start `cluster.train_workers` ranks on the model folder (None when 0); close them after.
    With `group` (colocated placement started the ranks with their engines) use it as it is:
    its owner closes it."""
    from rstar2_trainer.placement.cluster import ClusterError

    cluster = config.cluster
    if cluster is None or cluster.train_workers == 0:
        yield None
        return
    if group is not None:
        yield WorkerPolicy(group, config, model_dir, pad_id=pad_id)
        return
    try:
        group = await start_train_group(config, model_dir)
    except TimeoutError:
        raise ClusterError(
            f"{cluster.train_workers} training workers of {cluster.gpus_per_train_worker} GPU "
            f"and {cluster.cpus_per_train_worker} CPU were not placed in "
            f"{cluster.start_timeout_s:.0f} s; check `ray status` for free resources"
        ) from None
    try:
        yield WorkerPolicy(group, config, model_dir, pad_id=pad_id)
    finally:
        await group.close()

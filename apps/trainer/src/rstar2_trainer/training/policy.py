"""The policy being trained, behind one interface: in the driver, or on FSDP2 training ranks.

    Policy.update(kept, advantages, lr, temperature)  one RL update (mini-batches x epochs)
    Policy.sync(parts)                                 the weights into the rollout engines
    Policy.sft(examples, sft, seed, on_step)           non-reasoning SFT (before RL)
    Policy.load_from(model)                            the driver's weights in
    Policy.save(checkpoints, step, state)              the run's checkpoint of this step
    Policy.restore(checkpoint)                         back to a checkpoint
    Policy.reset_optimizer()                           a fresh optimizer (a stage switch)
    Policy.export_into(model)                          the trained weights into the driver's model

`open_policy` chooses the implementation once: `DriverPolicy` (the model and AdamW in this
process) or `worker_policy.WorkerPolicy` (`cluster.train_workers` ranks). Both run the same
training step, `distributed.train_step`, with the same loss (`update.WorkerPolicyLoss`): the
driver is a world of one, so there is one micro-batching implementation.

An update is PPO-style: the kept batch is cut into `optim.mini_batches` contiguous mini-batches
and passed over `optim.epochs` times, one optimizer step per mini-batch. With more than one step
the "old" logprobs are computed once before the first step with the policy that rolled out (the
synced weights), so the importance ratio moves and Clip-Higher and the dual clip act; with one
step (the default, as in the public port) the old logprobs are the step's own, detached (ratio 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import SFTConfig, TrainerConfig
from rstar2_trainer.rundir.checkpoint import Checkpoint, save_checkpoint
from rstar2_trainer.sft import Example, OnStep, SFTResult, train_sft
from rstar2_trainer.training.distributed import Row, row_logprobs, train_step, with_values
from rstar2_trainer.training.precision import Precision
from rstar2_trainer.training.update import (
    WorkerPolicyLoss,
    make_optimizer,
    merge_steps,
    mini_batches,
    policy_rows,
)


class Policy(Protocol):
    """The trained policy (see the module docstring)."""

    async def update(
        self, kept: Sequence[Trajectory], advantages: torch.Tensor, *, lr: float, temperature: float
    ) -> dict[str, float]: ...

    async def sync(self, parts: Any) -> dict[str, float]: ...

    async def sft(
        self, examples: Sequence[Example], sft: SFTConfig, *, seed: int, on_step: OnStep
    ) -> SFTResult: ...

    async def load_from(self, model: torch.nn.Module) -> None: ...

    async def save(self, checkpoints: Path, step: int, state: dict[str, Any]) -> None: ...

    async def restore(self, checkpoint: Checkpoint) -> None: ...

    async def reset_optimizer(self) -> None: ...

    async def export_into(self, model: torch.nn.Module) -> None: ...


class DriverPolicy:
    """The policy and its AdamW in this process, stepped by `train_step` as a world of one."""

    def __init__(
        self, model: torch.nn.Module, config: TrainerConfig, precision: Precision, *, pad_id: int
    ) -> None:
        self.model = model
        self.config = config
        self.precision = precision
        self.pad_id = pad_id
        self.loss = WorkerPolicyLoss(config.algo)
        self.optimizer = self._new_optimizer()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        o = self.config.optim
        return make_optimizer(self.model, o.lr, o.betas, o.weight_decay)

    async def update(
        self, kept: Sequence[Trajectory], advantages: torch.Tensor, *, lr: float, temperature: float
    ) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        o = self.config.optim
        rows = policy_rows(kept, advantages)
        if o.mini_batches * o.epochs > 1:
            rows = self._with_old_logprobs(rows, temperature)
        steps = []
        for _ in range(o.epochs):
            for part in mini_batches(rows, o.mini_batches):
                with self.precision.autocast():
                    steps.append(
                        train_step(
                            self.model,
                            self.optimizer,
                            part,
                            self.loss,
                            pad_id=self.pad_id,
                            micro_batch_tokens=o.micro_batch_tokens,
                            max_grad_norm=o.grad_clip,
                            device=self.precision.device,
                            normalize_by=self.loss.normalize_by,
                            temperature=temperature,
                            with_entropy=True,
                        )
                    )
        self.model.eval()
        return merge_steps(steps)

    def _with_old_logprobs(self, rows: list[Row], temperature: float) -> list[Row]:
        """Each row with `values["old_logp"]`: the current (rollout) policy's token logprobs."""
        with self.precision.autocast():
            logps = row_logprobs(
                self.model,
                rows,
                pad_id=self.pad_id,
                micro_batch_tokens=self.config.optim.micro_batch_tokens,
                device=self.precision.device,
                temperature=temperature,
            )
        return with_values(rows, "old_logp", logps)

    async def sync(self, parts: Any) -> dict[str, float]:
        if parts.remote is not None:
            return {"time_sync_s": await parts.remote.push_weights(self.model.state_dict().items())}
        return (await parts.engines.push(self.model.state_dict().items())).as_metrics()

    async def load_from(self, model: torch.nn.Module) -> None:
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    async def save(self, checkpoints: Path, step: int, state: dict[str, Any]) -> None:
        save_checkpoint(
            checkpoints,
            step,
            model=self.model,
            optimizer=self.optimizer,
            state=state,
            keep=self.config.run.keep_checkpoints,
        )

    async def restore(self, checkpoint: Checkpoint) -> None:
        if checkpoint.model is None:
            raise FileNotFoundError(
                f"{checkpoint.path} holds no model.pt: it was written with training workers; "
                "resume with the run's cluster.train_workers"
            )
        self.model.load_state_dict(checkpoint.model)
        if checkpoint.optimizer is not None:
            self.optimizer.load_state_dict(checkpoint.optimizer)

    async def reset_optimizer(self) -> None:
        self.optimizer = self._new_optimizer()

    async def sft(
        self, examples: Sequence[Example], sft: SFTConfig, *, seed: int, on_step: OnStep
    ) -> SFTResult:
        """SFT of the driver's model, with an optimizer of its own (the RL one is untouched)."""
        return train_sft(
            self.model,
            examples,
            epochs=sft.epochs,
            batch_size=sft.batch_size,
            lr=sft.lr,
            warmup_ratio=sft.warmup_ratio,
            seed=seed,
            micro_batch_tokens=sft.micro_batch_tokens,
            on_step=on_step,
            precision=self.precision,
        )

    async def export_into(self, model: torch.nn.Module) -> None:
        if model is not self.model:  # the driver's own model is the policy: nothing to copy
            model.load_state_dict(self.model.state_dict())


@contextlib.asynccontextmanager
async def open_policy(
    config: TrainerConfig,
    model: torch.nn.Module,
    model_dir: Path,
    precision: Precision,
    *,
    pad_id: int,
    group: Any = None,
) -> AsyncIterator[Policy]:
    """The run's policy: on `cluster.train_workers` FSDP2 ranks (`group` when colocated
    placement already started them), or in the driver."""
    from rstar2_trainer.training.worker_policy import open_worker_policy

    async with open_worker_policy(config, model_dir, pad_id=pad_id, group=group) as workers:
        yield (
            workers
            if workers is not None
            else DriverPolicy(model, config, precision, pad_id=pad_id)
        )

"""The policy being trained, behind one interface: in the driver, or on FSDP2 training ranks.

    Policy.update(kept, advantages, lr, temperature)  one RL update (mini-batches x epochs)
    Policy.weights()                                   what a push sends (see below)
    Policy.sft(examples, sft, seed, on_step)           non-reasoning SFT (before RL)
    Policy.load_weights(checkpoint)                    a checkpoint folder's weights (init-from)
    Policy.save(checkpoints, step, state)              the run's checkpoint of this step
    Policy.restore(checkpoint)                         back to a checkpoint
    Policy.reset_optimizer()                           a fresh optimizer (a stage switch)
    Policy.export(out, tokenizer, system_prompt, step) the policy folder (safetensors, tokenizer)

`open_policy` chooses the implementation once: `DriverPolicy` (the model and AdamW in this
process) or `sharded_policy.ShardedPolicy` (`cluster.train_workers` ranks; then the driver holds no
model at all). Both run the same training step, `distributed.train_step`, with the same loss
(`update.RLTokenLoss`, built once per policy), and SFT runs through that step too
(`sft.sft_loop` with `sft.sft_loss`): the driver is a world of one, so there is one
micro-batching implementation and one SFT loop.

The policy owns the weights from the start: it and the engines both load the model folder, so
nothing is pushed before the first update unless SFT or `--init-from` changed the weights (the
caller then pushes). A policy chooses no transport: `weights()` exposes what a push reads, the
driver's `(name, tensor)` pairs (fp32 master weights, `state_dict` order) or the
`train_workers.TrainGroup` of the ranks that hold them sharded, and the placement's weight
mover (placement/weights.py) sleeps the engines, moves the training state and pushes. Every
method below that runs collectives on ranks expects the mover to have put the state on the
devices first (the loop calls `mover.sleep()` before it).

A LoRA policy (`model.lora`, training/lora.py) is the same policy over a PEFT model: the base
frozen in the training dtype, the adapters and their AdamW in fp32. `weights()` is then the
adapter (an `rstar2_rollout.Adapter`, `model.lora.sync: adapter`) or the merged weights
(`merged`); checkpoints hold the adapters and their optimizer state (the base is the model
folder); the policy folder is a PEFT adapter folder (`save_adapter_policy`). `load_weights`
(`--init-from`) leaves a LoRA policy alone: the origin's weights are its base folder already
(origin.py), and its adapters start afresh.

An update is PPO-style: the kept batch is cut into `optim.mini_batches` contiguous mini-batches
and passed over `optim.epochs` times, one optimizer step per mini-batch. With more than one step
the "old" logprobs are computed once before the first step with the policy that rolled out (the
synced weights), so the importance ratio moves and Clip-Higher and the dual clip act; with one
step (the default, as in the public port) the old logprobs are the step's own, detached (ratio 1).

Off the event loop (`off_loop`, chosen at construction: the trainer sets it whenever steps
overlap, `async.max_staleness >= 1`, with partial rollouts or one-step-off):
`DriverPolicy.update` runs its torch work on a worker thread (`asyncio.to_thread`), so the
rollout pool's tasks (turns, tool calls, grading) go on while the driver trains. Nothing else
touches the model meanwhile: the engines load their own copy from the model folder (none holds
the policy's tensors), a push reads the weights only after the update returned, and SFT,
checkpoints and evaluations run with the pool paused or idle. The update draws nothing from
torch's global generator unless the model has dropout (the transformers engine seeds that
generator per request, so dropout would perturb concurrent sampling). Without
`off_loop` the update runs in the loop (a synchronous run). A
`ShardedPolicy` awaits its ranks, so its loop is free either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import SFTConfig, TrainerConfig
from rstar2_trainer.rundir.checkpoint import (
    Checkpoint,
    save_adapter_policy,
    save_checkpoint,
    save_policy,
)
from rstar2_trainer.training import lora
from rstar2_trainer.training.distributed import Row, row_logprobs, train_step, with_values
from rstar2_trainer.training.precision import Precision
from rstar2_trainer.training.sft import Example, OnStep, SFTResult, driver_sft_step, sft_loop
from rstar2_trainer.training.update import (
    RLTokenLoss,
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

    def weights(self) -> Any: ...

    async def sft(
        self, examples: Sequence[Example], sft: SFTConfig, *, seed: int, on_step: OnStep
    ) -> SFTResult: ...

    async def load_weights(self, checkpoint: Path) -> None: ...

    async def save(self, checkpoints: Path, step: int, state: dict[str, Any]) -> None: ...

    async def restore(self, checkpoint: Checkpoint) -> None: ...

    async def reset_optimizer(self) -> None: ...

    async def export(self, out: Path, tokenizer: Any, *, system_prompt: str, step: int) -> Path: ...


class DriverPolicy:
    """The policy and its AdamW in this process, stepped by `train_step` as a world of one."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig,
        precision: Precision,
        *,
        pad_id: int,
        off_loop: bool = False,
    ) -> None:
        self.model = model
        self.lora = getattr(config.model, "lora", None)  # LoRA settings; None: full weights
        self.model_dir: Path | None = None  # the base folder a LoRA adapter names
        self.off_loop = off_loop  # update on a worker thread, the event loop free meanwhile
        self.config = config
        self.precision = precision
        self.pad_id = pad_id
        self.loss = RLTokenLoss(config.algo)
        self.optimizer = self._new_optimizer()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        o = self.config.optim
        return make_optimizer(self.model, o.lr, o.betas, o.weight_decay)

    async def update(
        self, kept: Sequence[Trajectory], advantages: torch.Tensor, *, lr: float, temperature: float
    ) -> dict[str, float]:
        if self.off_loop:
            return await asyncio.to_thread(self._update, kept, advantages, lr, temperature)
        return self._update(kept, advantages, lr, temperature)

    def _update(
        self, kept: Sequence[Trajectory], advantages: torch.Tensor, lr: float, temperature: float
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

    def weights(self) -> Any:
        """The fp32 master weights as `(name, tensor)` pairs, read when a push iterates them;
        a LoRA policy's adapter (`Adapter`, fp32) or its merged weights."""
        if self.lora is None:
            return self.model.state_dict().items()
        if self.lora.sync == "merged":
            return lora.merged_tensors(self.model, torch.float32)
        return lora.as_adapter(self.model, torch.float32, self.model_dir)

    async def load_weights(self, checkpoint: Path) -> None:
        from rstar2_trainer.rundir.kept import load_weights

        if self.lora is None:  # a LoRA policy's base is the origin's weights (module docstring)
            load_weights(checkpoint, self.model)

    async def save(self, checkpoints: Path, step: int, state: dict[str, Any]) -> None:
        save_checkpoint(
            checkpoints,
            step,
            model=self.model if self.lora is None else lora.TrainableState(self.model),  # type: ignore[arg-type]
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
        if self.lora is None:
            self.model.load_state_dict(checkpoint.model)
        else:
            lora.load_trainable_state(self.model, checkpoint.model)
        if checkpoint.optimizer is not None:
            self.optimizer.load_state_dict(checkpoint.optimizer)

    async def reset_optimizer(self) -> None:
        self.optimizer = self._new_optimizer()

    async def sft(
        self, examples: Sequence[Example], sft: SFTConfig, *, seed: int, on_step: OnStep
    ) -> SFTResult:
        """SFT of the driver's model (`sft.sft_loop` through `train_step`), with an optimizer of
        its own (the RL one is untouched)."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=sft.lr, weight_decay=0.0)
        step = driver_sft_step(
            self.model, optimizer, sft.micro_batch_tokens, self.precision, pad_id=self.pad_id
        )
        result = await sft_loop(
            step,
            examples,
            epochs=sft.epochs,
            batch_size=sft.batch_size,
            lr=sft.lr,
            warmup_ratio=sft.warmup_ratio,
            seed=seed,
            on_step=on_step,
        )
        self.model.eval()
        return result

    async def export(self, out: Path, tokenizer: Any, *, system_prompt: str, step: int) -> Path:
        if self.lora is not None:  # the adapter folder; its base is the model folder
            adapter = lora.as_adapter(self.model, torch.float32, self.model_dir)
            return save_adapter_policy(
                adapter, tokenizer, out, system_prompt=system_prompt, step=step
            )
        return save_policy(self.model, tokenizer, out, system_prompt=system_prompt, step=step)


@contextlib.asynccontextmanager
async def open_policy(
    config: TrainerConfig,
    model: torch.nn.Module | None,
    model_dir: Path,
    precision: Precision,
    *,
    pad_id: int,
    group: Any = None,
) -> AsyncIterator[Policy]:
    """The run's policy: on the `cluster.train_workers` FSDP2 ranks the placement started
    (`group`; `model` None: the driver loads none), or in the driver (`model`, moved to
    `precision.device`)."""
    from rstar2_trainer.training.sharded_policy import open_sharded_policy

    async with open_sharded_policy(config, model_dir, pad_id=pad_id, group=group) as workers:
        if workers is not None:
            yield workers
            return
        if model is None:
            raise ValueError("the driver trains (cluster.train_workers 0) but loaded no model")
        settings = getattr(config.model, "lora", None)
        if settings is not None:  # the base frozen in the training dtype, fp32 adapters
            model = lora.apply_lora(
                model, settings, base_dtype=precision.dtype, base_path=model_dir
            )
        model.to(precision.device)  # fp32 master weights, on the training device
        off_loop = config.async_.max_staleness > 0  # the pool generates while the driver trains
        policy = DriverPolicy(model, config, precision, pad_id=pad_id, off_loop=off_loop)
        policy.model_dir = model_dir
        yield policy

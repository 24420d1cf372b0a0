"""FSDP2 training workers as Ray actors: one rank per actor, torch.distributed between them.

`TrainGroup.start(world_size, model_dir, config)` places `world_size` `TrainWorker` actors (one
GPU each on GPU nodes, or CPU with gloo), gives them torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT of a free port on rank 0's node) and has each join the
world with `distributed.init_distributed`, build the model on the meta device, shard it and fill
each rank's shard from `model_dir`'s safetensors tensor by tensor
(`distributed.load_sharded_model`: no rank ever holds the whole model) and make its AdamW over
the shards.

- `step(rows, loss_fn, ...)` splits the rows over the ranks by token count
  (`partition_rows`) and runs `distributed.train_step` on every rank at once; the loss and the
  gradient are those of one process over the whole batch (see distributed.py). `loss_fn` is
  any per-token loss; Ray pickles it to the workers.
- `open_channel(receivers, timeout_s)` / `send_weights(dtype, bucket_bytes)`: the split-placement
  weight sync. Rank 0 hosts a TCPStore on a free port of its node and returns its address; the
  engine actors join that group (`EngineActor.receive_weights`, ranks 1..E) while every rank
  iterates `colocated.FullTensors` (one all-gather per tensor, state_dict order, cast to the
  engines' dtype) and rank 0 alone broadcasts the tensors in buckets
  (`rstar2_rollout.weight_channel.WeightSender`: gloo on CPU ranks, NCCL on CUDA ranks). The
  model crosses once, in the engines' dtype; no fp32 host copy, no Ray object. A fresh group is
  built for every sync (so a dropped engine is simply left out of the next one); a failed send
  (an engine died mid-sync, or the group timed out) is reported, never raised, after rank 0 has
  drained its gathers so the other ranks are not left waiting. `Engines.push_channel` drives it.
- `load_weights(path)` puts a checkpoint's weights into every rank's shards (a workers' DCP
  folder, or a driver's `model.pt` read by rank 0 and broadcast); `export(out)` writes the full
  weights as safetensors, gathered parameter by parameter onto rank 0 and written bucket by
  bucket; `load_state(named_tensors)` puts given full weights into the shards. `save(root,
  step)` / `load(path)` are the sharded checkpoint (`sharded_checkpoint`) of the model and
  optimizer, written by all ranks together; `reset_optimizer()` starts AdamW afresh (a stage
  switch).

Each actor sees only its own GPU (Ray sets CUDA_VISIBLE_DEVICES per actor), so its LOCAL_RANK is
0. Not covered: learning-rate schedules (the caller sets `lr` per step), sharing GPUs with
colocated engines (the workers need GPUs of their own), per-rank RNG state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from rstar2_trainer.sft import sft_loss as sft_loss  # the loss SFT steps send to the ranks
from rstar2_trainer.training.distributed import DistributedConfig, Row, StepResult, TokenLoss


class TrainWorker:
    """One data-parallel rank (a Ray actor)."""

    def __init__(self, rank: int, world_size: int, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.model: Any = None
        self.optimizer: Any = None
        self.world: Any = None
        self.optim_args: dict[str, Any] = {}
        self._sender: Any = None  # rank 0's weight channel between open_channel and send

    def rendezvous(self) -> str:
        """host:port for MASTER_ADDR/MASTER_PORT (a free port on this node)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"

    def setup(
        self,
        master: str,
        model_dir: str,
        config: DistributedConfig,
        lr: float,
        betas: tuple,
        weight_decay: float = 0.0,
    ) -> None:
        """Join the world, load and shard the model, make the optimizer (collective)."""
        from rstar2_trainer.placement.devices import actor_device_index
        from rstar2_trainer.training.distributed import init_distributed, load_sharded_model

        host, port = master.rsplit(":", 1)
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(actor_device_index()),  # 0 unless Ray was told not to hide GPUs
            MASTER_ADDR=host,
            MASTER_PORT=port,
        )
        self.world = init_distributed(config)
        self.model = load_sharded_model(model_dir, config, self.world)
        self.optim_args = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay}
        self.reset_optimizer()

    def reset_optimizer(self, overrides: dict[str, Any] | None = None) -> None:
        """A fresh AdamW: the RL settings, or those with `overrides` (SFT's lr and decay)."""
        import torch

        args = {**self.optim_args, **(overrides or {})}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), **args)

    def step(
        self,
        rows: Sequence[Row],
        loss_fn: TokenLoss,
        lr: float,
        pad_id: int,
        micro_batch_tokens: int,
        max_grad_norm: float | None,
        options: dict[str, Any] | None = None,
    ) -> StepResult:
        from rstar2_trainer.training.distributed import train_step

        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        return train_step(
            self.model,
            self.optimizer,
            rows,
            loss_fn,
            pad_id=pad_id,
            micro_batch_tokens=micro_batch_tokens,
            max_grad_norm=max_grad_norm,
            device=self.world.device,
            **(options or {}),
        )

    def logprobs(
        self, rows: Sequence[Row], pad_id: int, micro_batch_tokens: int, temperature: float
    ) -> list[list[float]]:
        """This rank's rows' response logprobs under the current weights (collective)."""
        from rstar2_trainer.training.distributed import row_logprobs

        return row_logprobs(
            self.model,
            rows,
            pad_id=pad_id,
            micro_batch_tokens=micro_batch_tokens,
            device=self.world.device,
            temperature=temperature,
        )

    def full_state(self) -> list[tuple[str, Any]]:
        """The unsharded weights (collective); rank 0 returns them, the others []. For checks
        and tests: the engines get their weights from `send_weights`."""
        from rstar2_trainer.training.distributed import full_state_dict

        return list(full_state_dict(self.model).items())

    def open_channel(self, receivers: int, timeout_s: float) -> dict[str, str]:
        """Rank 0: a weight-channel store on a free port of this node, for `receivers` engines;
        its address and backend (nccl on a CUDA rank, else gloo)."""
        import ray

        from rstar2_rollout.weight_channel import WeightSender

        device = self.world.device
        backend = "nccl" if device.type == "cuda" else "gloo"
        host = ray.util.get_node_ip_address()
        self._sender = WeightSender(receivers, host, 0, backend, str(device), timeout_s)
        return {"address": self._sender.address, "backend": backend}

    def send_weights(self, dtype: str, bucket_bytes: int) -> dict[str, Any]:
        """One sync (collective over the ranks): every rank gathers each full tensor in `dtype`,
        rank 0 sends them in buckets to the receivers of its `open_channel`. Rank 0's report:
        bytes, buckets, seconds (connect_s: building the group), and `error` when the send failed
        (the gathers are finished all the same)."""
        import torch

        from rstar2_trainer.placement.colocated import FullTensors

        start = time.perf_counter()
        stream = iter(FullTensors(self.model, dtype))
        sender, self._sender = self._sender, None
        report: dict[str, Any] = {"bytes_moved": 0.0, "buckets": 0.0, "connect_s": 0.0}
        if self.rank == 0 and sender is not None:
            try:
                sender.connect()
                report["connect_s"] = time.perf_counter() - start
                sent = sender.send(stream, getattr(torch, dtype), bucket_bytes)
                report.update(bytes_moved=float(sent.bytes_moved), buckets=float(sent.buckets))
            except Exception as exc:  # a receiver died or the group timed out
                report["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            finally:
                sender.close()
        for _ in stream:  # the other ranks' all-gathers wait for rank 0's
            pass
        report["seconds"] = time.perf_counter() - start
        return report

    def load_state(self, named_tensors: list[tuple[str, Any]]) -> None:
        """Full weights (every rank gets the same) into this rank's shards (collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, dict(named_tensors), options=options)

    def load_weights(self, path: str) -> None:
        """Weights only, from a workers' sharded checkpoint folder or a driver's `model.pt`
        (read by rank 0 and broadcast into every rank's shards) (collective)."""
        from rstar2_trainer.rundir.sharded_checkpoint import load_sharded
        from rstar2_trainer.training.distributed import load_full_weights

        if Path(path).is_dir():
            load_sharded(Path(path), model=self.model, optimizer=None)
        else:
            load_full_weights(self.model, Path(path))

    def export(self, out: str, bucket_bytes: int) -> None:
        """The weights as safetensors in `out`, written by rank 0 (collective)."""
        from rstar2_trainer.training.distributed import save_safetensors

        save_safetensors(self.model, Path(out), bucket_bytes=bucket_bytes)

    def save(self, root: str, step: int, keep: int) -> str:
        from rstar2_trainer.rundir.sharded_checkpoint import save_sharded

        path = save_sharded(Path(root), step, model=self.model, optimizer=self.optimizer, keep=keep)
        return str(path)

    def load(self, path: str) -> dict[str, Any]:
        from rstar2_trainer.rundir.sharded_checkpoint import load_sharded

        return load_sharded(Path(path), model=self.model, optimizer=self.optimizer)

    def close(self) -> None:
        from rstar2_trainer.training.distributed import close_distributed

        close_distributed()


class TrainGroup:
    """The driver's handle on the training workers."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self.placement_group: Any = None  # released by close()

    @classmethod
    async def start(
        cls,
        world_size: int,
        model_dir: Path,
        config: DistributedConfig,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        gpus_per_worker: float = 0,
        cpus_per_worker: float = 1,
        threads: int = 1,
        timeout_s: float | None = None,
        actor_class: type = TrainWorker,
    ) -> Self:
        """Place the ranks, one placement-group bundle each (packed node by node, rank order),
        and set them up; TimeoutError when they are not up in `timeout_s`."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rstar2_trainer.placement.devices import placement_group_strategy, rank_bundles

        bundles = rank_bundles(world_size, int(gpus_per_worker), cpus_per_worker)
        pg = placement_group(bundles, strategy=placement_group_strategy)
        try:
            await asyncio.wait_for(pg.ready(), timeout_s)
        except BaseException:
            remove_placement_group(pg)
            raise
        actors = [
            ray.remote(actor_class)
            .options(
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=rank
                ),
            )
            .remote(rank, world_size, threads)
            for rank in range(world_size)
        ]
        group = cls(actors)
        group.placement_group = pg
        try:
            master = await asyncio.wait_for(actors[0].rendezvous.remote(), timeout_s)
            setups = [
                a.setup.remote(master, str(model_dir), config, lr, betas, weight_decay)
                for a in actors
            ]
            await asyncio.wait_for(asyncio.gather(*setups), timeout_s)
        except BaseException:
            await group.close()
            raise
        return group

    async def step(
        self,
        rows: Sequence[Row],
        loss_fn: TokenLoss,
        *,
        lr: float,
        pad_id: int,
        micro_batch_tokens: int,
        max_grad_norm: float | None = None,
        **options: Any,
    ) -> StepResult:
        """One optimizer step over all rows, split across the ranks; rank 0's result.

        `options` go to `distributed.train_step` (normalize_by, temperature, with_entropy)."""
        from rstar2_trainer.training.distributed import partition_rows

        shards = partition_rows(rows, len(self.actors))
        calls = [
            a.step.remote(shard, loss_fn, lr, pad_id, micro_batch_tokens, max_grad_norm, options)
            for a, shard in zip(self.actors, shards, strict=True)
        ]
        return (await asyncio.gather(*calls))[0]

    async def with_old_logprobs(
        self, rows: Sequence[Row], *, pad_id: int, micro_batch_tokens: int, temperature: float
    ) -> list[Row]:
        """The rows, in their order, each with `values["old_logp"]` computed on the ranks."""
        from rstar2_trainer.training.distributed import partition_indices, with_values

        parts = partition_indices(rows, len(self.actors))
        calls = [
            a.logprobs.remote([rows[i] for i in part], pad_id, micro_batch_tokens, temperature)
            for a, part in zip(self.actors, parts, strict=True)
        ]
        logps: list[list[float]] = [[] for _ in rows]
        for part, got in zip(parts, await asyncio.gather(*calls), strict=True):
            for i, logp in zip(part, got, strict=True):
                logps[i] = logp
        return with_values(rows, "old_logp", logps)

    async def load_state(self, named_tensors: Any) -> None:
        """Full weights into every rank's shards (one object-store copy for all ranks)."""
        import ray

        ref = ray.put(list(named_tensors))
        await asyncio.gather(*(a.load_state.remote(ref) for a in self.actors))

    async def reset_optimizer(self, **overrides: Any) -> None:
        await asyncio.gather(*(a.reset_optimizer.remote(overrides) for a in self.actors))

    async def save(self, root: Path, step: int, *, keep: int) -> Path:
        """A sharded checkpoint of model and optimizer, `root/step_NNNNNN/`, all ranks at once."""
        paths = await asyncio.gather(*(a.save.remote(str(root), step, keep) for a in self.actors))
        return Path(paths[0])

    async def load(self, path: Path) -> dict[str, Any]:
        """Load a sharded checkpoint (saved at any world size) into every rank; its state."""
        states = await asyncio.gather(*(a.load.remote(str(path)) for a in self.actors))
        return states[0]

    async def load_weights(self, path: Path) -> None:
        """Weights (a workers' checkpoint folder, or a driver's `model.pt`) into every rank."""
        await asyncio.gather(*(a.load_weights.remote(str(path)) for a in self.actors))

    async def export(self, out: Path, *, bucket_bytes: int = 1 << 30) -> None:
        """The full weights as safetensors files in `out` (rank 0 writes; no driver copy)."""
        await asyncio.gather(*(a.export.remote(str(out), bucket_bytes) for a in self.actors))

    async def full_state(self) -> list[tuple[str, Any]]:
        """The full weights, fetched into this process (for checks; every rank gathers)."""
        states = await asyncio.gather(*(a.full_state.remote() for a in self.actors))
        return states[0]

    async def open_channel(self, receivers: int, timeout_s: float) -> dict[str, str]:
        """Rank 0's weight-channel address and backend for `receivers` engines."""
        return await self.actors[0].open_channel.remote(receivers, timeout_s)

    async def send_weights(self, dtype: str, bucket_bytes: int) -> dict[str, Any]:
        """Every rank gathers, rank 0 sends (`TrainWorker.send_weights`); rank 0's report."""
        calls = [a.send_weights.remote(dtype, bucket_bytes) for a in self.actors]
        return (await asyncio.gather(*calls))[0]

    async def close(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # a dead worker is killed below all the same
                await actor.close.remote()
            ray.kill(actor)
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.placement_group)
            self.placement_group = None

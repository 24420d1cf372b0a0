"""FSDP2 training ranks: one `TrainWorker` per process, and `TrainGroup`, the driver's handle.

A `TrainWorker` is one data-parallel rank: `setup` gives it torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and has it join the world with
`distributed.init_distributed` (or, with no master, make a world of one in its process), build
the model on the meta device, shard it and fill its shard from the model folder's safetensors
tensor by tensor (`distributed.load_sharded_model`: no rank ever holds the whole model), and make
its AdamW over the shards. The placement starts the workers (Ray actors, `placement/ranks.py`,
or one in this process, `TrainGroup.in_process`) and hands the loop a `TrainGroup`.

- `step(rows, loss_fn, ...)` splits the rows over the ranks by token count (`partition_rows`)
  and runs `distributed.train_step` on every rank at once; the loss and the gradient are those of
  one process over the whole batch (see distributed.py). `loss_fn` is any per-token loss.
- Where the state lives (`offload.Residency`): `offload(part)` puts "optimizer" or "parameters"
  (None: both) in host memory, `onload()` brings all back. Every collective (step, logprobs,
  full_state, save, load, load_weights, load_state, export, send_weights, a colocated push)
  first checks that what it reads is on the rank's device and refuses in one line otherwise:
  NCCL runs collectives on device tensors only. The placement's mover onloads before them.
- `open_channel(receivers, timeout_s)` / `send_weights(dtype, bucket_bytes)` /
  `close_channel()`: the split-placement weight sync. Rank 0 hosts a TCPStore on a free port
  of its node; the engine actors join that group (ranks 1..E) and every sync is one
  `send_weights` on every rank: each gathers every tensor cast to the engines' dtype
  (`gather.FullTensors`), rank 0 broadcasts them in buckets
  (`rstar2_rollout.weight_channel.WeightSender`: gloo on CPU ranks, NCCL on CUDA ranks). The
  group is built at the first sync after `open_channel` and kept for the next ones; a failed
  send (an engine died mid-sync, the group timed out) closes it and is reported, never raised,
  after rank 0 has drained its gathers so the other ranks are not left waiting.
- LoRA (`setup(..., lora=settings)`): the rank loads a LoRA policy
  (`lora.load_sharded_lora_model`: the base frozen in the compute dtype, fp32 adapters);
  `adapter(dtype)` gathers the adapter (collective; rank 0 returns the `Adapter`), and
  `TrainGroup.adapter_sync` tells the movers to push it instead of the weights.
- `load_weights(path)` puts a checkpoint's weights into every rank's shards (a workers' DCP
  folder, or a driver's `model.pt` read by rank 0 and broadcast); `export(out)` writes the full
  weights as safetensors, gathered parameter by parameter onto rank 0 and written bucket by
  bucket; `load_state(named_tensors)` puts given full weights into the shards. `save(root,
  step)` / `load(path)` are the sharded checkpoint (`sharded_checkpoint`) of the model and
  optimizer, written by all ranks together; `reset_optimizer()` starts AdamW afresh.

`TrainGroup` calls every rank at once and waits for all; when one rank's process is gone (a Ray
actor error) it stops waiting at once and raises `RankError` naming that rank, instead of
leaving the driver in a collective the survivors can never finish.

Not covered: learning-rate schedules (the caller sets `lr` per step), per-rank RNG state,
replacing a lost rank (the run stops; `--resume` restarts it from its last checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rstar2_trainer.training.distributed import DistributedConfig, Row, StepResult, TokenLoss
from rstar2_trainer.training.offload import PARTS, Part, Residency
from rstar2_trainer.training.sft import sft_loss as sft_loss  # the loss SFT steps send to the ranks

CLOSE_TIMEOUT_S = 10.0  # a rank stuck in a collective with a lost peer is killed after this


class RankError(RuntimeError):
    """A training rank's process is gone: the run cannot step without it."""


class TrainWorker:
    """One data-parallel rank (a Ray actor, or a world of one in this process)."""

    def __init__(self, rank: int, world_size: int, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.model: Any = None
        self.optimizer: Any = None
        self.world: Any = None
        self.residency: Any = None
        self.optim_args: dict[str, Any] = {}
        self.lora: Any = None  # LoRA settings (model.lora); None: full weights
        self.model_dir = ""
        self._sender: Any = None  # rank 0's weight channel, kept from sync to sync
        self._connected = False

    def rendezvous(self) -> str:
        """host:port for MASTER_ADDR/MASTER_PORT (a free port on this node)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"

    def setup(
        self,
        master: str | None,
        model_dir: str,
        config: DistributedConfig,
        lr: float,
        betas: tuple,
        weight_decay: float = 0.0,
        device_index: Callable[[], int] | None = None,
        lora: Any = None,
    ) -> str:
        """Join the world (`master` None: a world of one here), load and shard the model, make
        the optimizer (collective). `device_index()` (run here) is LOCAL_RANK, the device among
        those this process sees (the placement's rule; 0 without one). Returns the host name."""
        from rstar2_trainer.training.distributed import init_distributed, load_sharded_model

        if master is not None:
            host, port = master.rsplit(":", 1)
            os.environ.update(
                RANK=str(self.rank),
                WORLD_SIZE=str(self.world_size),
                LOCAL_RANK=str(device_index() if device_index is not None else 0),
                MASTER_ADDR=host,
                MASTER_PORT=port,
            )
        self.world = init_distributed(config)
        self.lora, self.model_dir = lora, model_dir
        if lora is not None:  # the base frozen in the compute dtype, fp32 adapters
            from rstar2_trainer.training.lora import load_sharded_lora_model

            self.model = load_sharded_lora_model(model_dir, config, self.world, lora)
        else:
            self.model = load_sharded_model(model_dir, config, self.world)
        self.residency = Residency(self.world.device)
        self.optim_args = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay}
        self.reset_optimizer()
        return socket.gethostname()

    def reset_optimizer(self, overrides: dict[str, Any] | None = None) -> None:
        """A fresh AdamW: the RL settings, or those with `overrides` (SFT's lr and decay)."""
        import torch

        args = {**self.optim_args, **(overrides or {})}
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: adapters
        self.optimizer = torch.optim.AdamW(trainable, **args)
        self.residency.forget("optimizer")  # a fresh one holds no state yet

    def _on_device(self, op: str, *, optimizer: bool = True) -> None:
        self.residency.require(self.model, self.optimizer, op, optimizer_too=optimizer)

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

        self._on_device("step")
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

        self._on_device("logprobs", optimizer=False)
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
        and tests: the engines get their weights from a push."""
        from rstar2_trainer.training.distributed import full_state_dict

        self._on_device("full_state", optimizer=False)
        return list(full_state_dict(self.model).items())

    def offload(self, part: Part | None = None) -> dict[str, float]:
        """`part` ("optimizer", "parameters"; None: both) to host memory; bytes and seconds."""
        total = {"bytes": 0.0, "seconds": 0.0}
        for p in PARTS if part is None else (part,):
            moved = self.residency.offload(self.model, self.optimizer, p)
            total = {k: total[k] + moved[k] for k in total}
        return total

    def onload(self) -> dict[str, float]:
        """The training state back on the rank's device; bytes and seconds."""
        return self.residency.onload(self.model, self.optimizer)

    def open_channel(self, receivers: int, timeout_s: float) -> dict[str, str]:
        """Rank 0: a new weight-channel store on a free port of this node (the last one
        closed), for `receivers` engines; its address and backend (nccl on a CUDA rank)."""
        import ray

        from rstar2_rollout.weight_channel import WeightSender

        self.close_channel()
        device = self.world.device
        backend = "nccl" if device.type == "cuda" else "gloo"
        host = ray.util.get_node_ip_address()
        self._sender = WeightSender(receivers, host, 0, backend, str(device), timeout_s)
        return {"address": self._sender.address, "backend": backend}

    def send_weights(self, dtype: str, bucket_bytes: int) -> dict[str, Any]:
        """One sync (collective over the ranks): every rank gathers each tensor in `dtype`,
        rank 0 sends them in buckets over the open channel (built on its first sync). Rank 0's
        report: bytes, buckets, gathered bytes, seconds, connect_s (0 when the group was kept),
        and `error` when the send failed (the channel is then closed; the gathers finish)."""
        import torch

        from rstar2_trainer.training.gather import FullTensors

        self._on_device("send_weights", optimizer=False)
        start = time.perf_counter()
        gathered = FullTensors(self.model, dtype)
        stream = iter(gathered)
        report: dict[str, Any] = {"bytes_moved": 0.0, "buckets": 0.0, "connect_s": 0.0}
        if self.rank == 0 and self._sender is not None:
            try:
                if not self._connected:
                    self._sender.connect()
                    self._connected = True
                    report["connect_s"] = time.perf_counter() - start
                sent = self._sender.send(stream, getattr(torch, dtype), bucket_bytes)
                report.update(bytes_moved=float(sent.bytes_moved), buckets=float(sent.buckets))
            except Exception as exc:  # a receiver died or the group timed out
                report["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                self.close_channel()
        for _ in stream:  # the other ranks' all-gathers wait for rank 0's
            pass
        report["gathered_bytes"] = float(gathered.gathered_bytes)
        report["seconds"] = time.perf_counter() - start
        return report

    def adapter(self, dtype: str) -> Any:
        """The LoRA adapter, every tensor cast to `dtype` and gathered (collective); rank 0's
        `Adapter`, None on the others."""
        import torch

        from rstar2_trainer.training.lora import as_adapter

        self._on_device("adapter", optimizer=False)
        adapter = as_adapter(self.model, getattr(torch, dtype), self.model_dir)
        return adapter if self.rank == 0 else None

    def close_channel(self) -> None:
        sender, self._sender, self._connected = self._sender, None, False
        if sender is not None:
            sender.close()

    def load_state(self, named_tensors: list[tuple[str, Any]]) -> None:
        """Full weights (every rank gets the same) into this rank's shards (collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        self._on_device("load_state", optimizer=False)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, dict(named_tensors), options=options)

    def load_weights(self, path: str) -> None:
        """Weights only, from a workers' sharded checkpoint folder or a driver's `model.pt`
        (read by rank 0 and broadcast into every rank's shards) (collective)."""
        from rstar2_trainer.rundir.sharded_checkpoint import load_sharded
        from rstar2_trainer.training.distributed import load_full_weights

        self._on_device("load_weights", optimizer=False)
        if Path(path).is_dir():
            load_sharded(Path(path), model=self.model, optimizer=None)
        else:
            load_full_weights(self.model, Path(path))

    def export(self, out: str, bucket_bytes: int) -> None:
        """The weights as safetensors in `out`, written by rank 0 (collective)."""
        from rstar2_trainer.training.distributed import save_safetensors

        self._on_device("export", optimizer=False)
        save_safetensors(self.model, Path(out), bucket_bytes=bucket_bytes)

    def save(self, root: str, step: int, keep: int) -> str:
        from rstar2_trainer.rundir.sharded_checkpoint import save_sharded

        self._on_device("save")
        path = save_sharded(Path(root), step, model=self.model, optimizer=self.optimizer, keep=keep)
        return str(path)

    def load(self, path: str) -> dict[str, Any]:
        from rstar2_trainer.rundir.sharded_checkpoint import load_sharded

        self._on_device("load")
        return load_sharded(Path(path), model=self.model, optimizer=self.optimizer)

    def close(self) -> None:
        from rstar2_trainer.training.distributed import close_distributed

        self.close_channel()
        close_distributed()


def _is_lost(exc: BaseException) -> bool:
    """True when `exc` says a Ray actor's process is gone (not a bug in our code)."""
    try:
        from ray.exceptions import RayActorError, WorkerCrashedError
    except ImportError:
        return False
    return isinstance(exc, (RayActorError, WorkerCrashedError))


class TrainGroup:
    """The driver's handle on the training ranks: every call goes to all of them at once."""

    def __init__(self, actors: list[Any], labels: Sequence[str] | None = None) -> None:
        self.actors = actors
        self.labels = list(labels or (f"rank {r}" for r in range(len(actors))))
        self.placement_group: Any = None  # released by close()
        self.adapter_sync = False  # a LoRA policy whose pushes move the adapter
        self._local: TrainWorker | None = None

    @classmethod
    def in_process(cls, worker: TrainWorker) -> TrainGroup:
        """A world of one in this process (set up by the caller): its calls run here, in
        turn (bench/gpu_order.py, tests; a GPU image without Ray)."""
        group = cls([worker], ["rank 0 (this process)"])
        group._local = worker
        return group

    async def _call(self, rank: int, method: str, *args: Any) -> Any:
        if self._local is not None:
            result = getattr(self._local, method)(*args)
            return await result if inspect.isawaitable(result) else result
        return await getattr(self.actors[rank], method).remote(*args)

    async def _on_all(self, method: str, args: Sequence[tuple] | None = None) -> list[Any]:
        """`method` on every rank at once (`args[r]` for rank r); their results. A rank whose
        process is gone ends the wait at once with `RankError`."""
        per_rank = list(args) if args is not None else [()] * len(self.actors)
        calls: list[Awaitable[Any]] = [self._call(r, method, *a) for r, a in enumerate(per_rank)]
        tasks = [asyncio.ensure_future(c) for c in calls]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        failed = [(r, t.exception()) for r, t in enumerate(tasks) if t.done() and t.exception()]
        if failed:
            for task in tasks:
                task.cancel()
            rank, exc = failed[0]
            assert exc is not None
            if _is_lost(exc):
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise RankError(
                    f"training {self.labels[rank]} is gone ({why[:200]}) during {method}"
                ) from None
            raise exc
        return [t.result() for t in tasks]

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
        args = [
            (shard, loss_fn, lr, pad_id, micro_batch_tokens, max_grad_norm, options)
            for shard in shards
        ]
        return (await self._on_all("step", args))[0]

    async def with_old_logprobs(
        self, rows: Sequence[Row], *, pad_id: int, micro_batch_tokens: int, temperature: float
    ) -> list[Row]:
        """The rows, in their order, each with `values["old_logp"]` computed on the ranks."""
        from rstar2_trainer.training.distributed import partition_indices, with_values

        parts = partition_indices(rows, len(self.actors))
        args = [([rows[i] for i in p], pad_id, micro_batch_tokens, temperature) for p in parts]
        logps: list[list[float]] = [[] for _ in rows]
        for part, got in zip(parts, await self._on_all("logprobs", args), strict=True):
            for i, logp in zip(part, got, strict=True):
                logps[i] = logp
        return with_values(rows, "old_logp", logps)

    async def load_state(self, named_tensors: Any) -> None:
        """Full weights into every rank's shards (one object-store copy for all ranks)."""
        items: Any = list(named_tensors)
        if self._local is None:
            import ray

            items = ray.put(items)
        await self._on_all("load_state", [(items,)] * len(self.actors))

    async def reset_optimizer(self, **overrides: Any) -> None:
        await self._on_all("reset_optimizer", [(overrides,)] * len(self.actors))

    async def save(self, root: Path, step: int, *, keep: int) -> Path:
        """A sharded checkpoint of model and optimizer, `root/step_NNNNNN/`, all ranks at once."""
        paths = await self._on_all("save", [(str(root), step, keep)] * len(self.actors))
        return Path(paths[0])

    async def load(self, path: Path) -> dict[str, Any]:
        """Load a sharded checkpoint (saved at any world size) into every rank; its state."""
        return (await self._on_all("load", [(str(path),)] * len(self.actors)))[0]

    async def load_weights(self, path: Path) -> None:
        """Weights (a workers' checkpoint folder, or a driver's `model.pt`) into every rank."""
        await self._on_all("load_weights", [(str(path),)] * len(self.actors))

    async def export(self, out: Path, *, bucket_bytes: int = 1 << 30) -> None:
        """The full weights as safetensors files in `out` (rank 0 writes; no driver copy)."""
        await self._on_all("export", [(str(out), bucket_bytes)] * len(self.actors))

    async def full_state(self) -> list[tuple[str, Any]]:
        """The full weights, fetched into this process (for checks; every rank gathers)."""
        return (await self._on_all("full_state"))[0]

    async def offload(self, part: Part | None = None) -> dict[str, float]:
        """`part` of every rank's state to host memory; the largest bytes and seconds."""
        return _slowest(await self._on_all("offload", [(part,)] * len(self.actors)))

    async def onload(self) -> dict[str, float]:
        """Every rank's state back on its device; the largest bytes and seconds."""
        return _slowest(await self._on_all("onload"))

    async def open_channel(self, receivers: int, timeout_s: float) -> dict[str, str]:
        """Rank 0's new weight-channel address and backend for `receivers` engines."""
        return await self._call(0, "open_channel", receivers, timeout_s)

    async def send_weights(self, dtype: str, bucket_bytes: int) -> dict[str, Any]:
        """Every rank gathers, rank 0 sends (`TrainWorker.send_weights`); rank 0's report."""
        return (await self._on_all("send_weights", [(dtype, bucket_bytes)] * len(self.actors)))[0]

    async def close_channel(self) -> None:
        await self._call(0, "close_channel")

    async def adapter(self, dtype: str) -> Any:
        """The LoRA adapter in `dtype`, gathered on the ranks; rank 0's `Adapter`."""
        return (await self._on_all("adapter", [(dtype,)] * len(self.actors)))[0]

    async def close(self) -> None:
        """Close every rank (a rank stuck in a collective is given `CLOSE_TIMEOUT_S`), then
        kill the actors and release the placement group."""
        if self._local is not None:
            self._local.close()
            return
        import ray

        async def close_one(actor: Any) -> None:
            with contextlib.suppress(Exception):  # a dead or stuck rank is killed below
                await asyncio.wait_for(_awaited(actor.close.remote()), CLOSE_TIMEOUT_S)
            ray.kill(actor)

        await asyncio.gather(*(close_one(a) for a in self.actors))
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.placement_group)
            self.placement_group = None


async def _awaited(ref: Any) -> Any:
    return await ref


def _slowest(reports: Sequence[dict[str, float]]) -> dict[str, float]:
    return {
        "bytes": max(r["bytes"] for r in reports),
        "seconds": max(r["seconds"] for r in reports),
    }

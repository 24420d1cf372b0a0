"""Training ranks on Ray: one actor per rank, one placement-group bundle each, node by node.

- `start_ranks(world_size, model_dir, config, ...)` makes one placement group of `world_size`
  bundles (`devices.rank_bundles`, strategy PACK), waits until Ray has placed it, then orders
  the ranks by node (`ranks_by_node` over Ray's placement-group table): Ray numbers bundles in
  the order they were asked for, not by node, so bundle r and r+1 may sit on different nodes
  even when both nodes hold several; the ranks of one node are made contiguous (verl sorts its
  bundles the same way), which keeps FSDP's neighbours and a colocated node's engines together.
  It then starts one actor of `actor_class` (a `train_workers.TrainWorker`) per rank in its
  bundle, finds rank 0's rendezvous address, and has every rank join the world, load its shard
  and make its optimizer; the handle is a `group_class` (`TrainGroup`) labelled with each rank's
  Ray actor id and host. Each rank's LOCAL_RANK is `devices.actor_device_index()`, run in the
  actor. TimeoutError when they are not up in `timeout_s`.
- `start_train_group(config, model_dir, group_class=, actor_class=)` does it from the recipe's
  cluster, train and optim sections; `open_train_group(config, model_dir)` is the same as an
  async context manager that closes the ranks, with a `ClusterError` in one line when Ray
  cannot place them.

Not covered: MIG slices, fractional GPUs per rank, ranks that come back after a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.config.cluster import ClusterError
from rstar2_trainer.placement.devices import (
    actor_device_index,
    placement_group_strategy,
    rank_bundles,
)
from rstar2_trainer.training.distributed import DistributedConfig
from rstar2_trainer.training.train_workers import TrainGroup, TrainWorker
from rstar2_trainer.training.sharded_policy import distributed_config

G = TypeVar("G", bound=TrainGroup)


def ranks_by_node(bundles_to_node: Mapping[Any, str]) -> list[int]:
    """Bundle indices in rank order: the nodes in the order their first bundle appears, each
    node's bundles contiguous and in index order. `bundles_to_node` is the
    `bundles_to_node_id` of `ray.util.placement_group_table(pg)` (bundle index -> node id)."""
    by_node: dict[str, list[int]] = {}
    for bundle in sorted(bundles_to_node, key=int):
        by_node.setdefault(bundles_to_node[bundle], []).append(int(bundle))
    return [bundle for bundles in by_node.values() for bundle in bundles]


async def start_ranks(
    world_size: int,
    model_dir: Path,
    config: DistributedConfig,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
    gpus_per_train_worker: float = 0,
    cpus_per_train_worker: float = 1,
    threads: int = 1,
    timeout_s: float | None = None,
    actor_class: type = TrainWorker,
    group_class: type[G] = TrainGroup,
    lora: Any = None,
) -> G:
    """Place and set up `world_size` ranks (see the module docstring)."""
    import ray
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = rank_bundles(world_size, int(gpus_per_train_worker), cpus_per_train_worker)
    pg = placement_group(bundles, strategy=placement_group_strategy)
    try:
        await asyncio.wait_for(pg.ready(), timeout_s)
        order = ranks_by_node(placement_group_table(pg)["bundles_to_node_id"])
    except BaseException:
        remove_placement_group(pg)
        raise
    actors = [
        ray.remote(actor_class)
        .options(
            num_cpus=cpus_per_train_worker,
            num_gpus=gpus_per_train_worker,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=order[rank]
            ),
        )
        .remote(rank, world_size, threads)
        for rank in range(world_size)
    ]
    group = group_class(actors)
    group.placement_group = pg
    try:
        master = await asyncio.wait_for(actors[0].rendezvous.remote(), timeout_s)
        setups = [
            a.setup.remote(
                master, str(model_dir), config, lr, betas, weight_decay, actor_device_index, lora
            )
            for a in actors
        ]
        hosts = await asyncio.wait_for(asyncio.gather(*setups), timeout_s)
    except BaseException:
        await group.close()
        raise
    group.labels = [
        f"rank {r} (Ray actor {a._actor_id.hex()[:12]} on {host})"
        for r, (a, host) in enumerate(zip(actors, hosts, strict=True))
    ]
    return group


async def start_train_group(
    config: TrainerConfig,
    model_dir: Path,
    *,
    group_class: type[G] = TrainGroup,
    actor_class: type = TrainWorker,
) -> G:
    """`cluster.train_workers` ranks of `actor_class` on the model folder, set up from the
    cluster, train and optim sections (colocated placement passes its own classes); a
    `ClusterError` in one line when Ray cannot place them in `cluster.start_timeout_s`."""
    cluster = config.cluster
    assert cluster is not None
    lora = getattr(config.model, "lora", None)  # a LoRA policy (training/lora.py)
    try:
        group = await start_ranks(
            cluster.train_workers,
            model_dir,
            distributed_config(config),
            lr=config.optim.lr,
            betas=config.optim.betas,
            weight_decay=config.optim.weight_decay,
            gpus_per_train_worker=cluster.gpus_per_train_worker,
            cpus_per_train_worker=cluster.cpus_per_train_worker,
            threads=cluster.train_threads,
            timeout_s=cluster.start_timeout_s,
            actor_class=actor_class,
            group_class=group_class,
            lora=lora,
        )
        group.adapter_sync = lora is not None and lora.sync == "adapter"
        return group
    except TimeoutError:
        raise ClusterError(
            f"{cluster.train_workers} training workers of {cluster.gpus_per_train_worker} GPU "
            f"and {cluster.cpus_per_train_worker} CPU were not placed in "
            f"{cluster.start_timeout_s:.0f} s; check `ray status` for free resources"
        ) from None


@contextlib.asynccontextmanager
async def open_train_group(config: TrainerConfig, model_dir: Path) -> AsyncIterator[TrainGroup]:
    """`cluster.train_workers` ranks on the model folder (`start_train_group`), closed after."""
    group = await start_train_group(config, model_dir)
    try:
        yield group
    finally:
        await group.close()

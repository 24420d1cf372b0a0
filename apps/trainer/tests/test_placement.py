"""Placement without a cluster: which device an actor drives, the colocated config's rules, and
`Engines` dropping an engine whose process died while the driver's pushes go on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rstar2_trainer.config import load_config
from rstar2_trainer.config.cluster import ClusterConfig
from rstar2_trainer.placement.devices import local_device_index, rank_bundles
from rstar2_trainer.placement.engines import EngineError, Engines
from rstar2_trainer.placement.weights import TensorMover


def test_ray_narrowed_devices_mean_index_zero():
    assert local_device_index(["5"], {"CUDA_VISIBLE_DEVICES": "5"}) == 0
    assert local_device_index(["5"], {"HIP_VISIBLE_DEVICES": "5"}, "HIP_VISIBLE_DEVICES") == 0
    assert local_device_index([], {}) == 0


@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"])
def test_devices_left_visible_select_the_assigned_gpu(variable):
    """Under Ray's NOSET switch for `variable` the actor sees every GPU (the node's list, or all
    of them) and picks Ray's assignment itself; the full matrix of Ray's environments, with
    vLLM's own device arithmetic, is in tests/test_gpu_rules.py."""
    assert local_device_index(["3"], {}, variable) == 3
    assert local_device_index([6], {variable: "4,6,7"}, variable) == 1
    with pytest.raises(RuntimeError, match="hides it"):
        local_device_index(["2"], {variable: "4,6"}, variable)


def test_one_bundle_per_rank():
    assert rank_bundles(3, 1, 4) == [{"CPU": 4.0, "GPU": 1.0}] * 3
    assert rank_bundles(2, 0, 1) == [{"CPU": 1.0}] * 2


def test_colocated_ranks_offload_by_default_and_hold_one_engine_each():
    colocated = ClusterConfig(
        colocate=True, train_workers=8, gpus_per_train_worker=1, gpus_per_engine=1
    )
    assert colocated.colocated_ranks and colocated.offloads
    assert colocated.activation_checkpointing
    assert not ClusterConfig(train_workers=8, gpus_per_train_worker=1).offloads
    with pytest.raises(ValueError, match=r"set cluster\.gpus_per_engine to 1"):
        ClusterConfig(colocate=True, train_workers=8, gpus_per_train_worker=1, gpus_per_engine=2)
    with pytest.raises(ValueError, match=r"remove cluster\.engines_per_node"):
        ClusterConfig(
            colocate=True,
            train_workers=2,
            engines_per_node=2,
            gpus_per_train_worker=1,
            gpus_per_engine=1,
        )


def test_the_weight_channel_timeout_is_the_cluster_setting():
    assert ClusterConfig().sync_timeout_s == 300.0
    config = load_config("tiny", ["cluster.kind=ray", "cluster.sync_timeout_s=45"])
    assert config.cluster is not None and config.cluster.sync_timeout_s == 45.0
    with pytest.raises(ValueError, match=r"^cluster\.sync_timeout_s: Input should be greater"):
        load_config("tiny", ["cluster.kind=ray", "cluster.sync_timeout_s=0"])


def test_mi300x_recipe_colocates_all_64_gpus():
    cluster = load_config("qwen3-14b-mi300x").cluster
    assert cluster is not None
    assert cluster.colocate and cluster.train_workers == 64 and cluster.offloads


class _Lost:
    """An engine on a machine that went away: every call raises Ray's actor error."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.can_sleep = True
        self.sleeping = False
        self.calls: list[str] = []

    async def sleep(self, level: int = 1) -> None:
        from ray.exceptions import RayActorError

        self.calls.append("sleep")
        raise RayActorError()

    async def wake_up(self, tags: Any = None) -> None:
        self.calls.append("wake")

    async def update_weights(self, named_tensors: Any) -> None:
        self.calls.append("load")

    async def generate(self, *args: Any) -> Any:
        raise AssertionError("not used")

    def kv_capacity(self) -> None:
        return None

    async def close(self) -> None:
        pass


class _Fine(_Lost):
    async def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep{level}")
        self.sleeping = True

    async def wake_up(self, tags: Any = None) -> None:
        self.calls.append("wake:" + ",".join(tags or ["all"]))
        if tags is None or "kv_cache" in tags:
            self.sleeping = False


def test_a_dead_engine_is_dropped_and_the_step_goes_on():
    pytest.importorskip("ray")
    lost, fine = _Lost("lost"), _Fine("fine")
    engines = Engines([lost, fine], sleep_level=2)
    mover = TensorMover(engines)  # the driver's weights: split placement or local engines

    async def step() -> Any:
        asleep = await mover.sleep()
        assert asleep.asleep == 1 and asleep.needs_push
        return await mover.push([])

    asyncio.run(step())
    assert engines.dropped == ["lost"]
    assert [e.name for e in engines.alive] == ["fine"]
    assert lost.calls == ["sleep"]  # no wake, no load after it was lost
    assert fine.calls == ["sleep2", "wake:weights", "load", "wake:kv_cache"]
    with pytest.raises(EngineError, match="every engine is gone"):
        asyncio.run(Engines([_Lost("a")]).sleep())

"""Which accelerators an actor drives, and where the ranks are placed: Ray 2.60 as it really is.

Ray assigns each actor GPU ids (`get_accelerator_ids()["GPU"]`: the node's ids, as its
`CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES` listed them when Ray started, else 0..n-1) and
narrows the actor to them by writing one variable, the one its accelerator manager names
(`ray/_private/accelerators`): `CUDA_VISIBLE_DEVICES` on NVIDIA nodes, `HIP_VISIBLE_DEVICES` on
AMD nodes. It leaves that variable alone when its switch is "1" or "true":
`RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES` on NVIDIA, `RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_
DEVICES` on AMD. `RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES` (set by some AMD images, read by
vLLM's ROCm platform) is not Ray's switch in 2.60: Ray still narrows `HIP_VISIBLE_DEVICES`.

Contract
- `local_device_indices(assigned, env, variable)`: the indices, among the devices this process
  can see, of the GPUs Ray assigned, read from the variable Ray writes (`variable`): its
  position in that list when the variable is set (Ray narrowed it to the assigned ids, or it is
  the node's own list under a NOSET switch), the id itself when unset (every GPU of the node
  visible, in id order: only under a NOSET switch). No switch is consulted: what the variable
  holds is what the process sees. An assigned id the variable hides raises one line.
- `local_device_index(...)`: the first of them (0 for an actor without GPUs). A training rank
  sets its device from it (`LOCAL_RANK`), and its colocated engine gets the same index
  (`colocated.py`); a split engine actor gets all of its indices (`engine_actor.py`), passed to
  vLLM as `device_ids`, from which vLLM's worker sets its device (`rstar2_rollout.engines.vllm`).
- `actor_device_indices()` / `actor_device_index()` read the ids from Ray, the variable from
  Ray's accelerator manager for "GPU", and the environment, inside an actor.
- `rank_bundles(world_size, gpus, cpus)` is one placement-group bundle per rank (a rank and its
  colocated engine share it), packed node by node (`PACK`), so rank r and r+1 sit on the same
  node whenever they fit; `placement_group_strategy` names it.

Not covered: MIG slices, fractional GPUs per rank, GPUs named by UUID, an AMD node where
`CUDA_VISIBLE_DEVICES` and `HIP_VISIBLE_DEVICES` are both set and differ (vLLM refuses it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

NVIDIA_VARIABLE = "CUDA_VISIBLE_DEVICES"  # NvidiaGPUAcceleratorManager's
AMD_VARIABLE = "HIP_VISIBLE_DEVICES"  # AMDGPUAcceleratorManager's
placement_group_strategy = "PACK"


def local_device_indices(
    assigned: Sequence[str | int], env: Mapping[str, str], variable: str = NVIDIA_VARIABLE
) -> list[int]:
    """Visible-device indices of the assigned GPUs (see the module docstring)."""
    raw = env.get(variable)
    listed = [d.strip() for d in (raw or "").split(",") if d.strip()]
    if raw is None or not listed:
        return [int(a) for a in assigned]  # nothing narrows: the node's ids are the indices
    out = []
    for gpu in (str(a) for a in assigned):
        if gpu not in listed:
            raise RuntimeError(
                f"Ray assigned GPU {gpu} but {variable}={raw} hides it; unset {variable} or "
                "the RAY_EXPERIMENTAL_NOSET_* switch that keeps it"
            )
        out.append(listed.index(gpu))
    return out


def local_device_index(
    assigned: Sequence[str | int], env: Mapping[str, str], variable: str = NVIDIA_VARIABLE
) -> int:
    """The visible-device index of the first assigned GPU (0 for none)."""
    indices = local_device_indices(assigned[:1], env, variable)
    return indices[0] if indices else 0


def ray_visible_variable() -> str:
    """The variable Ray narrows for "GPU" on this node (CUDA_ or HIP_VISIBLE_DEVICES)."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    manager = get_accelerator_manager_for_resource("GPU")
    name = manager.get_visible_accelerator_ids_env_var() if manager is not None else None
    return name or NVIDIA_VARIABLE


def actor_device_indices() -> list[int]:
    """This Ray actor's device indices (see `local_device_indices`); [] without GPUs."""
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    if not ids:
        return []
    return local_device_indices(ids, os.environ, ray_visible_variable())


def actor_device_index() -> int:
    """This Ray actor's first device index (0 without GPUs)."""
    indices = actor_device_indices()
    return indices[0] if indices else 0


def rank_bundles(world_size: int, gpus: int, cpus: float) -> list[dict[str, float]]:
    """One bundle per rank: its GPU (shared with its colocated engine) and its CPUs."""
    bundle: dict[str, float] = {"CPU": float(cpus)}
    if gpus:
        bundle["GPU"] = float(gpus)
    return [dict(bundle) for _ in range(world_size)]

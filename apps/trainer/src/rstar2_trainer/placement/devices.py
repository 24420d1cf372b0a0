"""Which accelerator an actor drives, and where the ranks are placed: Ray as it really is.

Contract
- `local_device_index(assigned, env)` is the index, among the devices this process can see, of
  the first GPU Ray assigned to it. Ray normally hides every other GPU (it sets
  `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES` per actor), so the answer is 0. AMD's vLLM
  images set `RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES` (or `..._ROCR_VISIBLE_DEVICES`,
  NVIDIA's `..._CUDA_VISIBLE_DEVICES`): Ray then leaves the variable alone, every GPU of the
  node is visible, and the actor must select the assigned one itself; the index is then the
  assigned id's position in the visible list (the id itself when nothing narrows it).
- `actor_device_index()` reads both from Ray and the environment inside an actor.
- `rank_bundles(world_size, gpus, cpus)` is one placement-group bundle per rank (a rank and its
  colocated engine share it), packed node by node (`PACK`), so rank r and r+1 sit on the same
  node whenever they fit; `placement_group_strategy` names it.

Not covered: MIG slices, fractional GPUs per rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

NOSET_VARIABLES = {  # Ray's switches that stop it from narrowing an actor's visible GPUs
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "HIP_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "ROCR_VISIBLE_DEVICES",
}
placement_group_strategy = "PACK"


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no")


def local_device_index(assigned: Sequence[str | int], env: Mapping[str, str]) -> int:
    """The visible-device index of the first assigned GPU (0 when Ray narrowed visibility)."""
    if not assigned:
        return 0
    first = str(assigned[0])
    for switch, visible in NOSET_VARIABLES.items():
        if not _truthy(env.get(switch)):
            continue
        listed = [d.strip() for d in env.get(visible, "").split(",") if d.strip()]
        if not listed:
            return int(first)  # every GPU of the node is visible, in id order
        if first in listed:
            return listed.index(first)
        raise RuntimeError(
            f"Ray assigned GPU {first} but {visible}={env.get(visible)} hides it; unset "
            f"{visible} or {switch}"
        )
    return 0


def actor_device_index() -> int:
    """This Ray actor's device index (see `local_device_index`)."""
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return local_device_index(ids, os.environ)


def rank_bundles(world_size: int, gpus: int, cpus: float) -> list[dict[str, float]]:
    """One bundle per rank: its GPU (shared with its colocated engine) and its CPUs."""
    bundle: dict[str, float] = {"CPU": float(cpus)}
    if gpus:
        bundle["GPU"] = float(gpus)
    return [dict(bundle) for _ in range(world_size)]

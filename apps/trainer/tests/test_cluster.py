"""Ray cluster mode on one machine: a local Ray cluster on loopback, real servers, real vLLM (CPU).

- every node's sandbox and verify servers start as the actor's children, answer, and stop;
- two engine actors behind `RayEngine` generate through the KV-aware scheduler, which spreads
  trajectories over both by their free KV cache;
- a weight sync through the placement's mover (the driver's tensors: `TensorMover`) changes
  greedy output to what transformers gives with the new weights;
- nothing is left running afterwards (Ray, workers, servers, engines).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.scheduler import Job
from rstar2_sandbox import ExecutionRequest
from rstar2_trainer.config import load_config
from rstar2_trainer.placement.cluster import (
    ClusterConfig,
    ClusterError,
    _service_args,
    connect,
    engine_nodes,
    open_cluster_parts,
    start_engines,
    start_node_servers,
)
from rstar2_verify.client import VerifyPool

# Under `uv run`, Ray would start its workers through `uv run` too (re-resolving the environment
# in each); the cluster module turns that off before it imports Ray, and so must this test,
# which imports Ray itself.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

CLUSTER = ClusterConfig(
    num_cpus=4,
    services_host="127.0.0.1",
    engines_per_node=2,
    sandbox_workers=1,
    sandbox_max_in_flight=2,
    verify_workers=1,
)
SMALL = [
    "model.layers=2",
    "model.vocab_size=1024",
    "engine.kv_cache_memory_bytes=2097152",  # 2048 tokens: one 1.2K-token job per engine
    "engine.max_num_seqs=8",
]


def _descendants() -> set[int]:
    """Every live process below this one (Ray's GCS and raylet, workers, servers)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _wait_no_descendants(before: set[int], timeout_s: float = 60.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    left = _descendants() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _descendants() - before
    return left


def _refuses(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


@pytest.mark.slow
def test_node_servers_start_answer_and_stop():
    import ray

    before = _descendants()
    config = load_config("tiny", SMALL)

    async def scenario() -> list[dict[str, str]]:
        from rstar2_sandbox.client import SandboxClient

        async with contextlib.AsyncExitStack() as stack:
            nodes = await start_node_servers(config, CLUSTER, stack)
            assert len(nodes) == 1 and nodes[0]["sandbox"].startswith("127.0.0.1:")
            async with SandboxClient([n["sandbox"] for n in nodes]) as sandbox:
                result = await sandbox.execute(ExecutionRequest(code="print(6 * 7)"))
                assert result.stdout.strip() == "42", result
                # the node's sandbox runs cluster.sandbox_max_in_flight calls, queues the rest
                nap = ExecutionRequest(code="import time\ntime.sleep(1.5)", timeout_s=10)
                naps = asyncio.gather(*(sandbox.execute(nap) for _ in range(4)))
                await asyncio.sleep(0.8)
                (info,) = await sandbox.info()
                assert (info.in_flight, info.queued) == (2, 2), info
                assert all(r.status.value == "ok" for r in await naps)
            pool = VerifyPool([n["verify"] for n in nodes])
            grades = await pool.grade_many([("<answer>\\boxed{42}</answer>", "42"), ("7", "8")])
            await pool.close()
            assert [g.correct for g in grades] == [True, False]
        return nodes

    assert connect(CLUSTER)
    try:
        nodes = asyncio.run(scenario())
    finally:
        ray.shutdown()
    assert all(_refuses(a) for n in nodes for a in n.values())
    assert not _wait_no_descendants(before)


@pytest.mark.slow
def test_engines_spread_by_free_kv_and_sync_weights(tmp_path):
    import ray

    before = _descendants()
    # kv_aware reserves each job's declared budget, so one 1.2K-token job fills an engine
    config = load_config("tiny", [*SMALL, "scheduler.policy.kind=kv_aware"])

    async def scenario() -> dict:
        out: dict = {}
        async with open_cluster_parts(config, tmp_path, cluster=CLUSTER) as parts:
            assert ray.is_initialized()
            names = [e.name for e in parts.engines]
            assert names == ["vllm-0-0", "vllm-0-1"]
            caps = [e.kv_capacity() for e in parts.engines]
            assert all(c is not None and 1408 <= c.total_tokens < 2 * 1210 for c in caps), caps
            prompt = parts.tokenizer("the sum of 12 and 30 is")["input_ids"]
            greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)

            def job(i: int) -> Job:
                async def run(engine):
                    return await engine.generate(prompt, greedy, f"job-{i}")

                return Job(run, len(prompt), 1200)  # only one fits an engine's KV at a time

            scheduler = parts.source.scheduler  # type: ignore[attr-defined]  (a RolloutService)
            results = await scheduler.run([job(i) for i in range(6)])
            assert all(r.ok for r in results), [r.error for r in results]
            # every answer brought the engine's progress report back: vLLM never preempted
            reports = [e.progress() for e in parts.engines]  # type: ignore[attr-defined]
            assert all(p is not None and p.preemptions == 0 for p in reports), reports
            out["engines"] = [r.engine for r in results]
            out["spans"] = [(r.engine, r.started_at, r.finished_at) for r in results]
            first = results[0].value
            assert first is not None
            out["before"] = first.token_ids

            model = parts.model
            generator = torch.Generator().manual_seed(1)
            new_state = {
                k: v + 0.5 * v.std() * torch.randn(v.shape, generator=generator)
                if v.dim() > 1
                else v
                for k, v in model.state_dict().items()
            }
            model.load_state_dict(new_state)
            out["times"] = await parts.mover.push(model.state_dict().items())
            after = [await e.generate(prompt, greedy, f"after-{e.name}") for e in parts.engines]
            out["after"] = [g.token_ids for g in after]
            with torch.no_grad():
                ids = torch.tensor([prompt])
                ref = model.generate(ids, max_new_tokens=12, do_sample=False)
            out["reference"] = ref[0, len(prompt) :].tolist()
        out["ray_after"] = ray.is_initialized()
        return out

    out = asyncio.run(scenario())
    assert set(out["engines"]) == {"vllm-0-0", "vllm-0-1"}
    for name in ("vllm-0-0", "vllm-0-1"):  # never two jobs at once on one engine
        spans = sorted((s, f) for e, s, f in out["spans"] if e == name)
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans)), spans
    assert out["after"][0] == out["after"][1] == out["reference"]
    assert out["after"][0] != out["before"]
    assert out["times"].load_s > 0
    assert out["times"].total_s >= out["times"].load_s
    assert out["ray_after"] is False
    assert not _wait_no_descendants(before)


@pytest.mark.slow
def test_engines_need_room_on_some_node():
    import ray

    connect(CLUSTER)
    try:
        with pytest.raises(ClusterError, match="no Ray node has 2 GPUs"):
            engine_nodes(ClusterConfig(engines_per_node=2, gpus_per_engine=1))
    finally:
        ray.shutdown()


def test_every_node_sandbox_gets_the_recipes_workers_and_calls_in_flight():
    """cluster.sandbox_workers and cluster.sandbox_max_in_flight reach each node's `serve`
    (before, the node server ran 32 calls at once whatever its workers); the default is 16 per
    worker, and a number the sandbox could not run is refused when the recipe loads."""
    config = load_config("tiny")

    def flags(cluster: ClusterConfig) -> dict[str, str]:
        args = _service_args(config, cluster)[0]
        return dict(zip(args[::2], args[1::2], strict=True))

    assert (
        flags(ClusterConfig(sandbox_workers=64, sandbox_max_in_flight=1024))["--max-in-flight"]
        == "1024"
    )
    assert flags(ClusterConfig(sandbox_workers=8))["--max-in-flight"] == "128"
    assert flags(ClusterConfig(sandbox_workers=8))["--workers"] == "8"
    with pytest.raises(ValueError, match="uids per worker"):
        ClusterConfig(sandbox_workers=1, sandbox_max_in_flight=4000)
    cluster = load_config("qwen3-14b-mi300x").cluster
    assert cluster is not None and flags(cluster)["--max-in-flight"] == "1024"


@pytest.mark.parametrize("recipe", ["qwen3-14b-mi300x", "node-8gpu"])
def test_recipes_cluster_sections_validate(recipe):
    """The multi-GPU recipes place their parts on Ray: the section validates as a ClusterConfig."""
    config = load_config(recipe)
    cluster = config.cluster
    assert cluster is not None
    assert cluster.kind == "ray" and cluster.gpus_per_engine == 1
    assert config.algo.rollouts_per_prompt == 32 and config.algo.group_size == 16
    gpus = 64 if recipe == "qwen3-14b-mi300x" else 8  # every GPU: one rank and one engine
    assert cluster.colocate and cluster.train_workers == gpus and cluster.offloads
    assert cluster.gpus_per_train_worker == 1 and cluster.activation_checkpointing


def test_colocating_cpu_engines_is_refused_before_any_actor_starts(tmp_path):
    config = load_config("tiny")
    cluster = ClusterConfig(colocate=True, gpus_per_engine=0)
    with pytest.raises(
        ClusterError, match=r"colocate needs GPU engines .* cluster.gpus_per_engine >= 1"
    ):
        asyncio.run(start_engines(config, cluster, tmp_path))


@pytest.mark.slow
def test_train_workers_match_one_process_and_feed_the_engine(tmp_path):
    """Two FSDP2 ranks as Ray actors (gloo) take the step one process takes on the same rows;
    rank 0's weights go over the weight channel into an engine, whose greedy output then
    matches transformers with the stepped weights."""
    import ray
    from transformers import AutoModelForCausalLM

    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.channel import ChannelMover
    from rstar2_trainer.placement.engines import Engines
    from rstar2_trainer.placement.ranks import start_ranks
    from rstar2_trainer.training.distributed import DistributedConfig, Row, train_step
    from rstar2_trainer.training.train_workers import sft_loss

    before = _descendants()
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in (5, 17, 9, 30, 2, 11):
        ids = torch.randint(3, 1000, (n + 3,), generator=gen).tolist()
        mask = [0 if 3 <= i < 5 else 1 for i in range(n)]  # a masked "tool output" stretch
        rows.append(Row(prompt_ids=ids[:3], response_ids=ids[3:], loss_mask=mask))
    step = {"lr": 3e-3, "pad_id": 0, "micro_batch_tokens": 48, "max_grad_norm": 0.5}

    reference: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=step["lr"])
    expected = train_step(
        reference,
        optimizer,
        rows,
        sft_loss,
        pad_id=0,
        micro_batch_tokens=48,
        max_grad_norm=0.5,
    )

    config = load_config(
        "tiny", [*SMALL, "engine.kv_cache_memory_bytes=4194304", "engine.max_model_len=2048"]
    )
    cluster = ClusterConfig(num_cpus=4, engines_per_node=1)

    async def scenario() -> dict:
        group = await start_ranks(
            2, model_dir, DistributedConfig(device="cpu", micro_batch_tokens=48), lr=step["lr"]
        )
        try:
            result = await group.step(rows, sft_loss, **step)
            state = dict(await group.full_state())
            (engine,) = await start_engines(config, cluster, model_dir)
            try:
                mover = ChannelMover(Engines([engine]), group, bucket_bytes=1 << 20, timeout_s=300)
                times = await mover.push(group)
                await mover.close()
                prompt = rows[0].prompt_ids
                greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)
                out = await engine.generate(prompt, greedy, "after-step")
            finally:
                await engine.close()
        finally:
            await group.close()
        return {
            "result": result,
            "state": state,
            "tokens": out.token_ids,
            "times": (times.load_s, times.total_s),
        }

    connect(cluster)
    try:
        out = asyncio.run(scenario())
    finally:
        ray.shutdown()
    assert out["result"].tokens == expected.tokens
    assert abs(out["result"].loss - expected.loss) < 1e-5
    assert abs(out["result"].grad_norm - expected.grad_norm) < 1e-4
    ref_state = reference.state_dict()
    assert set(out["state"]) == set(ref_state)
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    moved = max((ref_state[k] - initial[k]).abs().max().item() for k in ref_state)
    diff = max((out["state"][k] - ref_state[k]).abs().max().item() for k in ref_state)
    assert moved > 1e-3 and diff < 5e-5, (moved, diff)  # Adam moves each weight by ~lr
    with torch.no_grad():
        ids = torch.tensor([list(rows[0].prompt_ids)])
        want = reference.generate(ids, max_new_tokens=12, do_sample=False)[0, 3:].tolist()
    assert out["tokens"] == want
    assert all(t > 0 for t in out["times"])
    assert not _wait_no_descendants(before)

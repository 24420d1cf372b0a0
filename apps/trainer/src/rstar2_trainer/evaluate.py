"""Evaluation inside a training run: accuracy of the current policy on problems it does not train on.

One `measure_accuracy` for both kinds, through the same trajectory source, agent loop, sandbox and
`rstar2_rollout.collect` as training, under a `SamplingProtocol` (the model `rstar2-eval` reads,
so the final table's command reproduces a number exactly). Accuracy is the mean reward over every
sample (avg@k, as the paper reports). The kinds differ only in problems and protocol:

- the synthetic held-out set (the tiny recipe): problems drawn with the evaluation seed minus
  any question the run trains on (`held_out_problems`), under `eval.protocol(...)`: the `eval`
  section's sampling with the run's top-p and reward rule;
- a benchmark of `eval.sources` (AIME, MATH-500, GPQA-Diamond, ...) under `eval.benchmark`: the
  paper's protocol by default (T=0.6, 16 samples, 30K tokens, 30 turns, training's reward rule).
  A multiple-choice benchmark is sampled as rstar2-eval samples it: each sample sees the options
  in its own seeded order (`choice_variant`, one trajectory per variant) and is graded as a
  letter (the `Scorer`'s choice kind), so GPQA can be watched beside AIME (the paper's Fig. 8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rstar2_curriculum import Problem, choice_variant, generate_problems, is_choice
from rstar2_rollout import Collected, RolloutConfig, SamplingProtocol, collect
from rstar2_trainer.config import EvalSettings
from rstar2_trainer.stats import trajectory_stats

if TYPE_CHECKING:
    from rstar2_trainer.placement.local import Parts


def held_out_problems(config: EvalSettings, training: Sequence[Problem]) -> list[Problem]:
    """Draws `config.problems` synthetic problems none of whose questions the run trains on."""
    seen = {p.question for p in training}
    size = config.problems * 2
    while True:  # a larger pool when training already holds most small problems
        pool = generate_problems(size, seed=config.seed, difficulty=config.difficulty)
        fresh = [p for p in pool if p.question not in seen]
        if len(fresh) >= config.problems or size >= config.problems * 64:
            break
        size *= 4
    return [p.model_copy(update={"id": f"eval-{p.id}"}) for p in fresh[: config.problems]]


async def measure_accuracy(
    parts: Parts,
    problems: Sequence[Problem],
    protocol: SamplingProtocol,
    base: RolloutConfig,
    on_done: Callable[[], None] | None = None,
) -> tuple[dict[str, float | None], Collected[Problem]]:
    """Samples `problems` with the current policy under `protocol`, grades every sample and
    returns accuracy (avg@k) with trajectory statistics, plus what was collected."""
    scorer, asked, n = parts.scorer.under(protocol.reward), list(problems), protocol.samples
    if problems and all(is_choice(p) for p in problems):
        asked = [choice_variant(p, protocol.seed, i) for p in problems for i in range(n)]
        scorer, n = scorer.of_kind("choice"), 1
    collected = await collect(
        parts.source,
        scorer,
        asked,
        n,
        protocol.apply(base),
        meters=parts.engines,
        on_done=on_done,
    )
    stats = trajectory_stats(collected.trajectories)
    stats["accuracy"] = stats.pop("reward", 0.0)
    stats["problems"] = len(problems)
    stats["samples"] = protocol.samples
    stats["failed_jobs"] = len(collected.failed_jobs)
    return stats, collected

"""The paper's hard-subset pass before a stage on the hard problems (`data: hard`).

Before stage 3 the paper rolls out every training problem 8 times with the latest policy and
drops the problems solved 8 of 8, leaving 17.3K of 42K. `hard_subset_pass` does exactly that at
the switch into a hard stage: `hard_k` trajectories per problem through the run's trajectory
source (the stage's budget, a seed of its own), the outcomes recorded in the curriculum's
difficulty tracker, which then keeps the problems not solved k of k as the stage's pool.

The pass is resumable: it runs in rounds of `hard_pass.chunk_problems` problems and appends each
problem's outcomes to `RUN_DIR/hard_pass/<stage>.jsonl`; a resumed run reads the file and rolls
out only the problems not in it. A problem whose rollouts failed (an engine died) has fewer than
k outcomes; the missing ones are recorded as failures, so it stays in the subset.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2_curriculum import Curriculum, Stage
from rstar2_rollout import collect, derive_seed
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.rundir import report
from rstar2_trainer.sampling import rollout_config_for
from rstar2_verify import is_correct

if TYPE_CHECKING:
    from rstar2_trainer.placement.local import Parts


def _read_done(path: Path) -> dict[str, list[bool]]:
    done: dict[str, list[bool]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a torn last line of a killed run: rolled again
                continue
            done[row["id"]] = [bool(c) for c in row["correct"]]
    return done


async def hard_subset_pass(
    parts: Parts,
    curriculum: Curriculum,
    config: TrainerConfig,
    run_dir: Path,
    step: int,
    stage: Stage,
) -> dict[str, Any]:
    """Roll out every problem `stage.hard_k` times at RL step `step`, record the outcomes in
    `curriculum`; return the counts."""
    k = stage.hard_k
    path = run_dir / "hard_pass" / f"{stage.name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _read_done(path)
    todo = [p for p in curriculum.problems if p.id not in done]
    rollout = rollout_config_for(
        config.rollout,
        seed=derive_seed(config.run.seed, "hard", stage.name),
        step=step,
        max_response_tokens=stage.max_response_tokens,
        max_turns=stage.max_turns,
    )
    start = time.perf_counter()
    size = config.hard_pass.chunk_problems
    with report.progress(f"hard pass ({stage.name})", len(todo) * k) as advance:
        for first in range(0, len(todo), size):
            chunk = todo[first : first + size]
            collected = await collect(
                parts.source,
                parts.scorer,
                chunk,
                k,
                rollout,
                meters=parts.engines,
                on_done=advance,
            )
            outcomes: dict[str, list[bool]] = {p.id: [] for p in chunk}
            for t in collected.trajectories:
                outcomes[t.group_id].append(is_correct(t.reward))
            with path.open("a") as f:
                for pid, correct in outcomes.items():
                    f.write(json.dumps({"id": pid, "correct": correct}) + "\n")
            done.update(outcomes)
    for problem in curriculum.problems:
        correct = done.get(problem.id, [])
        correct = correct + [False] * (k - len(correct))  # failed rollouts count as unsolved
        curriculum.observe(problem.id, [float(c) for c in correct])
    solved = sum(1 for c in done.values() if len(c) >= k and all(c))
    record = {
        "stage": stage.name,
        "k": k,
        "problems": len(curriculum.problems),
        "rolled_now": len(todo),
        "solved_all": solved,
        "kept": len(curriculum.problems) - solved,
        "time_s": time.perf_counter() - start,
    }
    report.console.print(
        f"hard pass before {stage.name}: {solved} of {len(curriculum.problems)} problems solved "
        f"{k}/{k} and dropped, {record['kept']} kept"
    )
    return record

"""The trainer, top to bottom: set up, evaluate, SFT, then staged RL; every step logged and saved.

    set up      run directory, parts (model, engines, sandbox and verify servers), data
    evaluate    held-out accuracy before SFT
    SFT         non-reasoning SFT on synthetic tool-call traces; evaluate again
    RL, a step  batch -> rollout 2G per problem -> grade (overlapped) -> reject equal-reward groups
                -> Resample-on-Correct to G -> advantages -> policy loss -> optimizer step
                -> weight sync to the engines -> curriculum (difficulty, stage switch) -> log
                -> checkpoint; an evaluation after each stage
    finish      the trained policy as a Hugging Face folder (RUN_DIR/policy), the final table, plots

The policy is a `policy.Policy`, chosen once: in the driver, or on `cluster.train_workers`
FSDP2 ranks (`sharded_policy`; the driver then loads no model). It owns the weights from the
start: it trains SFT and RL and writes the policy folder. The weights move through the
placement's mover (`parts.mover`, placement/weights.py), the one owner of sleep, training-state
moves and pushes: `mover.sleep()` before anything that trains or runs collectives on the
training state (SFT, an update, a checkpoint's save or restore, the export), so colocated ranks
find their state on the device and the engines asleep; `sync` (`mover.push(policy.weights())`)
whenever the weights changed, and after a save whose sleep left the engines needing one. The
engines load the model folder themselves, so nothing is pushed before SFT (remote rollout
services, which loaded their own copy, get the policy's weights first). Trajectories come from `parts.source` (local engines or remote rollout services) through
`collect`, or the rollout pool with asynchronous steps (rstar2-rollout's one core under both).
A step is `rl_step` (rollout to update, its metrics) then
`end_step` (curriculum, log, stage switch, checkpoint); `Phases` times each phase.
Weights versions: `Run.weights_version` counts the pushes (`sync`) of this process, and each
engine counts the loads it made since it started, so the two agree; `Run.policy_version` counts
the changes of the weights, and `Run.pushed` maps each push to the policy version it carried (a
colocated checkpoint pushes the same weights again after its sleep). Every step logs the
rollouts' staleness (`staleness_mean`, `staleness_max`: the policy version minus that of a
trajectory's oldest token; 0 in a synchronous run), `staleness_unknown` (no version known) and
`turns_resumed` (turns aborted at a push and resumed on the new weights, `async.at_push`).

Asynchronous steps (`async.max_staleness` >= 1; local engines or split placement, where the
engine actors generate while the ranks train, or colocated, where they sleep meanwhile) keep the
run's `RolloutPool` (rstar2-rollout) in flight across steps and train on what it drew: a step
submits its batch (and draws batches ahead while a whole one fits under the pool's capacity of
`(max_staleness + 1) x curriculum.batch_size` groups: the first step, a resumed run), and takes
the groups due (started `max_staleness` steps ago) first, then with partial rollouts
(`async.partial_rollout`) the oldest finished ones, or one-step-off the oldest batch whole. No
group is discarded for staleness: its later turns run on the new weights, each token records
its version, and the loss corrects the stale tokens (`algo.off_policy`, TIS by default for
asynchronous steps: asyncsteps.py). A stage switch (its evaluation and hard-subset pass) and a
checkpoint pause the pool (queued submissions wait, running trajectories hold their next turn)
instead of draining it; the checkpoint records what was drawn and not trained, and a resumed
run submits it again. Every step logs `drawn` (the problems the curriculum drew for it),
`groups` (those it trains), `groups_trained`, `groups_carried`, `groups_failed` (the same
shape in a synchronous step), and what the pool generated while the policy trained, counted at
the engines and the pool around the update (`turns_during_train`, `tokens_during_train`,
`groups_finished_during_train`; answers as the driver received them, so a reply in transit when
the update began counts): a driver policy trains on a worker thread then (policy.py), training
ranks are awaited.

A run with `init` (`--init-from`, origin.py) starts from another run's checkpoint
instead: no SFT, the checkpoint's weights (optionally its optimizer and curriculum state),
evaluated as `init`, checkpoint 0, then RL.

Resuming (`resume_dir`) restores model, optimizer, RNG, curriculum and step from the newest
good checkpoint (rundir/checkpoint.py: `latest`, or the one before when that one is incomplete
or corrupt, with one line) and the trackers drop or hold back what was logged after it
(tracking.py), so no step is lost or repeated. Every random choice
derives from (run seed, step, ...) so a resumed run draws the batches the uninterrupted run would.

Faults (docs/LAUNCH.md, "When something fails"): child services restart themselves (each step
logs `service_restarts`, `calls_retried`); the run's restarts from its newest good checkpoint
(`run.max_restarts`) and SIGTERM wrap this module (restarts.py, one `train_attempt` each).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rstar2_algos import build_algorithm
from rstar2_curriculum import Curriculum, Problem, StepMetrics, write_jsonl
from rstar2_rollout import (
    RolloutConfig,
    RolloutPool,
    Trajectory,
    collect,
    derive_seed,
    staleness_stats,
)
from rstar2_rollout.chat import encode_conversation
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.data import RunData
from rstar2_trainer.evaluate import held_out_problems, measure_accuracy
from rstar2_trainer.faults import Control
from rstar2_trainer.hard import hard_subset_pass
from rstar2_trainer.origin import copy_model_dir, origin_checkpoint
from rstar2_trainer.placement.cluster import open_cluster_parts
from rstar2_trainer.placement.local import Parts, open_parts
from rstar2_trainer.preempt import Preempted
from rstar2_trainer.rundir import report
from rstar2_trainer.rundir.checkpoint import GoodCheckpoint, load_checkpoint
from rstar2_trainer.rundir.tracking import MetricsLog
from rstar2_trainer.sampling import rollout_config_for
from rstar2_trainer.stats import group_stats, tool_error_ratio, trajectory_stats
from rstar2_trainer.training.policy import Policy, open_policy
from rstar2_trainer.training.precision import Precision
from rstar2_trainer.training.update import warmup_lr
from rstar2_verify import is_correct


@dataclass
class Phases:
    """Wall times of a step's phases, as `time_<name>_s` metrics."""

    times: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"time_{name}_s"] = time.perf_counter() - start


@dataclass
class Run:
    """What the loop carries from step to step."""

    config: TrainerConfig
    run_dir: Path
    log: MetricsLog
    parts: Parts
    policy: Policy
    curriculum: Curriculum
    held_out: list  # synthetic held-out problems (empty when eval.synthetic is off)
    benchmarks: dict[str, list]  # eval.sources: name -> problems
    step: int = 0
    evals: list[dict[str, Any]] = field(default_factory=list)
    weights_version: int = 0  # pushes to the engines in this process (each bumps every engine)
    policy_version: int = 0  # changes of the policy's weights in this process
    pushed: list[int] = field(default_factory=lambda: [0])  # push count -> policy version
    pool: RolloutPool | None = None  # asynchronous steps: groups in flight across steps
    control: Control = field(default_factory=Control)  # train() hands its own
    services_seen: dict[str, int] = field(default_factory=dict)  # service counts at the last step

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


async def train_attempt(
    config: TrainerConfig,
    run_dir: Path,
    log: MetricsLog,
    good: GoodCheckpoint,
    data: RunData,
    control: Control,
) -> None:
    """One attempt of the run (restarts.py calls it): the parts opened, a new start or `good`
    restored, the RL steps, the export and the final table; every part closed however it ends."""
    problems = data.prepared.problems
    curriculum = data.prepared.curriculum
    held_out = []
    if config.eval.synthetic:
        held_out = held_out_problems(config.eval, [*problems, *data.sft_problems])
        write_jsonl(held_out, run_dir / "heldout.jsonl")  # for rstar2-eval on the same problems
    ckpt = load_checkpoint(good.path) if good.path is not None else None
    traces = data.sft if ckpt is None else []

    copy_model_dir(config, run_dir)  # --init-from: the origin's tiny model and tokenizer
    corpus = tokenizer_corpus(problems, traces, config.rollout.system_prompt)
    opener = open_parts if config.cluster is None else open_cluster_parts
    precision = Precision.from_settings(config.train.device, config.train.dtype)
    async with opener(config, run_dir, corpus) as parts:
        pad_id = _pad_id(parts.tokenizer)
        async with open_policy(
            config, parts.model, parts.model_dir, precision, pad_id=pad_id, group=parts.train_group
        ) as policy:
            run = Run(config, run_dir, log, parts, policy, curriculum, held_out, data.benchmarks)
            run.control = control
            await run_steps(run, ckpt, traces)
            policy_dir = await export(run)
        report.final_table(run.evals, run_dir, policy_dir, final_eval_command(config))


async def run_steps(run: Run, ckpt: Any, traces: list) -> None:
    """A new start (SFT on `traces`) or `ckpt` restored, then RL steps to the end of the plan,
    with the rollout pool (asynchronous steps) open throughout and closed however it ends."""
    steps = run.config.async_
    if steps.max_staleness > 0:  # partial rollouts, or one-step-off: whole batches in order
        parts = run.parts
        run.pool = RolloutPool(
            parts.source,
            parts.scorer,
            groups_per_step=run.curriculum.batch_size,
            max_staleness=steps.max_staleness,
            order="finish" if steps.partial_rollout else "submission",
        )
    try:
        if ckpt is None:
            await start(run, traces)
        else:
            await restore(run, ckpt)
        await safe_point(run, saved=True)
        while not run.curriculum.plan.finished:
            run.step += 1
            run.control.step = run.step
            stage, metrics = await rl_step(run)
            saved = await end_step(run, stage, metrics)
            await safe_point(run, saved)
    finally:
        if run.pool is not None:
            await run.pool.close()


async def safe_point(run: Run, saved: bool) -> None:
    """After SIGTERM: a checkpoint of this step (unless it has one), then `Preempted`."""
    if not run.control.preemption.requested:
        return
    if not saved:  # the pool paused: the checkpoint records what was drawn and not trained
        async with run.pool.paused() if run.pool is not None else contextlib.nullcontext():
            await save(run)
    run.control.preemption.saved()
    raise Preempted(run.step, saved=True)


async def run_eval(run: Run, when: str) -> None:
    """Held-out accuracy of the current policy (synthetic set, then each benchmark file),
    logged and kept for the final table."""
    config = run.config
    run.parts.check_servers()
    if run.held_out:
        total = len(run.held_out) * config.eval.samples
        with report.progress(f"eval ({when})", total) as advance:
            held_out = config.eval.protocol(top_p=config.rollout.top_p, reward=config.reward)
            stats, _ = await measure_accuracy(
                run.parts, run.held_out, held_out, config.rollout, advance
            )
        record = {"when": when, **stats}
        run.evals.append({**record, "step": run.step})
        run.log.log("eval", run.step, record)
        report.console.print(
            f"eval {when}: accuracy {stats['accuracy']:.3f} on {stats['problems']} held-out "
            f"problems x {config.eval.samples}, "
            f"tool-error ratio in correct {report.fmt(stats.get('tool_error_ratio_pos'))}"
        )
    protocol = config.eval.benchmark
    for name, problems in run.benchmarks.items():
        total = len(problems) * protocol.samples
        with report.progress(f"{name} ({when})", total) as advance:
            stats, _ = await measure_accuracy(
                run.parts, problems, protocol, config.rollout, advance
            )
        record = {"when": when, "benchmark": name, **stats}
        run.evals.append({**record, "step": run.step})
        run.log.log("benchmark", run.step, record)
        report.console.print(
            f"{name} {when}: avg@{protocol.samples} {stats['accuracy']:.3f} on "
            f"{stats['problems']} problems"
        )


async def start(run: Run, traces: list) -> None:
    """A new run: (evaluate,) SFT, push to the engines, evaluate, checkpoint 0."""
    config, parts = run.config, run.parts
    if config.init is not None:
        await start_from_origin(run)
        return
    if parts.remote is not None:  # remote rollout services loaded a model of their own
        await sync(run)
    if config.eval.before_sft:
        await run_eval(run, "before_sft")
    if config.sft.enabled:
        await parts.mover.sleep()  # colocated: SFT gets the GPU memory; the sync wakes them
        await run_sft(run, traces)
        await sync(run)
    await run_eval(run, "after_sft")
    await save(run)


async def start_from_origin(run: Run) -> None:
    """A run with `init` (origin.py): no SFT; the origin checkpoint's weights (and
    optimizer and curriculum state when included) into the policy, read from the checkpoint's
    files where the policy lives, pushed to the engines, evaluated, checkpoint 0."""
    config = run.config
    init = config.init
    assert init is not None
    origin = origin_checkpoint(config)
    await run.parts.mover.sleep()  # loading is a collective on the ranks' state
    if "optimizer" in init.include:
        await run.policy.restore(origin)  # the weights and the optimizer state
    else:
        await run.policy.load_weights(origin.path)
    if "curriculum" in init.include:
        run.curriculum.load_state_dict(origin.state["curriculum"])
    await sync(run)
    taken = ", ".join(["weights", *init.include])
    report.console.print(f"initialised from {init.run} step {init.step} ({taken}); no SFT")
    await run_eval(run, "init")
    await save(run)


async def restore(run: Run, ckpt: Any) -> None:
    """Back to the latest checkpoint: policy, curriculum, evaluations, step; engines synced."""
    run.step = run.control.step = ckpt.step
    await run.parts.mover.sleep()  # loading is a collective on the ranks' state
    await run.policy.restore(ckpt)
    run.curriculum.load_state_dict(ckpt.state["curriculum"])
    run.evals = list(ckpt.state["evals"])
    await sync(run)
    if run.pool is not None:  # drawn and not trained at the checkpoint: rolled out again
        for pending in ckpt.state.get("pool", []):
            problems = [Problem.model_validate(p) for p in pending["problems"]]
            config = RolloutConfig.model_validate(pending["config"])
            run.pool.submit(problems, pending["n"], config, age=pending["age"])
    report.console.print(f"resumed {run.run_dir} at RL step {run.step}")


async def sync(run: Run, *, changed: bool = True) -> dict[str, float]:
    """Push the policy's weights to the engines: the next engine version (engines count it
    alike), and, when the weights `changed` since the last push, the next policy version."""
    report = await run.parts.mover.push(run.policy.weights())
    run.weights_version += 1
    run.policy_version += changed
    run.pushed.append(run.policy_version)
    return report.as_metrics()


async def rl_step(run: Run) -> tuple[Any, dict[str, Any]]:
    """One RL step: batch, rollouts (graded as they finish), select, advantages, update, sync."""
    config, parts, step = run.config, run.parts, run.step
    parts.check_servers()
    algo = build_algorithm(config.algo)
    batch = run.curriculum.next_batch()
    stage = batch.stage
    lr = warmup_lr(step - 1, config.optim.lr, config.optim.warmup_steps)
    rollout = rollout_config_for(
        config.rollout,
        seed=config.run.seed,
        step=step,
        max_response_tokens=stage.max_response_tokens,
        max_turns=stage.max_turns,
    )
    n = algo.rollouts_per_prompt
    trajectories, rolled = await roll_out(run, batch.problems, n, rollout)
    by_group: dict[str, list[bool]] = {}
    for t in trajectories:
        by_group.setdefault(t.group_id, []).append(is_correct(t.reward))
    for problem_id, correct in by_group.items():
        run.curriculum.observe(problem_id, [float(c) for c in correct])

    selection = algo.select(
        trajectories,
        np.random.default_rng(derive_seed(config.run.seed, "select", step)),
        target_groups=len(batch.problems),
    )
    metrics: dict[str, Any] = {
        "stage": stage.name,
        "lr": lr,
        **trajectory_stats(trajectories),
        **group_stats(trajectories),
        **selection.stats.as_dict(),
        "kept_tool_error_ratio_pos": tool_error_ratio(
            [t for t in selection.trajectories if is_correct(t.reward)]
        ),
        **rolled,
        "engine_idle_share": rolled["engine_idle_s"]
        / max(1e-9, rolled["time_rollout_s"] * max(1, len(parts.engines))),
        **staleness_stats(trajectories, run.policy_version, run.pushed),
    }
    metrics["engines_dropped"] = len(parts.engines.dropped)
    counts = parts.service_counts()  # since the last step: restarts, calls sent again
    metrics.update({k: v - run.services_seen.get(k, 0) for k, v in counts.items()})
    run.services_seen = counts
    if not selection.trajectories:
        metrics.update(time_train_s=0.0, time_sleep_s=0.0, time_sync_s=0.0, skipped_update=1)
        return stage, metrics
    phases = Phases()
    with phases.time("sleep"):  # colocated: engines free the GPU, the state comes back to it
        asleep = await parts.mover.sleep()
    before = generated(run)
    with phases.time("train"):
        advantages = algo.advantages(selection).float()  # [K]
        temperature = rollout.temperature if rollout.temperature > 0 else 1.0
        update = await run.policy.update(
            selection.trajectories, advantages, lr=lr, temperature=temperature
        )
    if run.pool is not None:  # what the pool generated while the policy trained
        after = generated(run)
        for name, was in before.items():
            metrics[f"{name}_during_train"] = after[name] - was
    metrics.update(update)
    metrics.update(phases.times)
    metrics.update(asleep.as_metrics())
    metrics.update(await sync(run))
    return stage, metrics


def generated(run: Run) -> dict[str, int]:
    """Counts since the start: turns and tokens the engines answered, groups the pool finished."""
    engines = run.parts.engines
    return {
        "turns": sum(getattr(e, "turns", 0) for e in engines),
        "tokens": sum(getattr(e, "tokens", 0) for e in engines),
        "groups_finished": run.pool.finished if run.pool is not None else 0,
    }


async def roll_out(
    run: Run, problems: list, n: int, rollout: Any
) -> tuple[list[Trajectory], dict[str, Any]]:
    """The step's graded trajectories and the rollout's metrics, one shape whatever the mode:
    `n` of every problem (`collect`), or with asynchronous steps the step's groups from the run's
    `RolloutPool` (`RolloutPool.step`: this step's problems submitted, the curriculum's next
    batches drawn ahead while a whole one fits, sampled with seeds of their own; due groups
    first, then the oldest finished, or one-step-off the oldest batch whole).

    `drawn` lists the problems the curriculum drew for this step, `groups` the ones whose groups
    it trains (in an asynchronous step, drawn by this step or an earlier one)."""
    parts = run.parts
    drawn = list(problems)
    with report.progress(f"step {run.step} rollouts", len(problems) * n) as advance:
        if run.pool is None:
            got = await collect(
                parts.source,
                parts.scorer,
                problems,
                n,
                rollout,
                meters=parts.engines,
                on_done=advance,
            )
        else:

            def on_group(_problem: Any) -> None:
                for _ in range(n):
                    advance()

            def ahead(k: int) -> tuple[list, Any]:
                seed = derive_seed(run.config.run.seed, "rl", run.step, "ahead", k)
                more = run.curriculum.next_batch().problems
                return more, rollout.model_copy(update={"seed": seed})

            got, drawn = await run.pool.step(
                problems, n, rollout, ahead=ahead, meters=parts.engines, on_group=on_group
            )
    return got.trajectories, {"drawn": [p.id for p in drawn], **got.step_metrics()}


async def end_step(run: Run, stage: Any, metrics: dict[str, Any]) -> bool:
    """Curriculum (difficulty, stage switch), log, then the stage switch's work and the
    checkpoint with the rollout pool paused; whether it checkpointed."""
    switch = run.curriculum.end_step(
        StepMetrics(
            all_correct_share=metrics.get("all_correct_share"),
            all_wrong_share=metrics.get("all_wrong_share"),
            truncation_ratio=metrics.get("truncation_ratio"),
            reward_mean=metrics.get("reward"),
        )
    )
    checkpoint = run.step % run.config.run.checkpoint_every == 0 or run.curriculum.plan.finished
    run.log.log("rl", run.step, metrics)
    report.step_line(run.step, stage.name, metrics)
    async with run.pool.paused() if run.pool is not None else contextlib.nullcontext():
        await switch_and_save(run, stage, switch, checkpoint)
    return checkpoint


async def switch_and_save(run: Run, stage: Any, switch: Any, checkpoint: bool) -> None:
    """The stage switch's work (its evaluation, optimizer reset, hard-subset pass) and the
    checkpoint; an asynchronous run's groups in flight are paused meanwhile, not discarded."""
    if switch is not None:
        run.log.log("stage", run.step, switch.model_dump())
        report.console.print(f"stage switch after step {run.step}: {switch.reason}")
        if run.config.eval.every_stage or run.curriculum.plan.finished:
            await run_eval(run, f"after_{stage.name}")
        if switch.reset_optimizer:
            await run.policy.reset_optimizer()
        entered = run.curriculum.plan.current if not run.curriculum.plan.finished else None
        if (
            entered is not None
            and entered.data == "hard"
            and run.config.hard_pass.mode == "rollouts"
        ):
            record = await hard_subset_pass(
                run.parts, run.curriculum, run.config, run.run_dir, run.step, entered
            )
            run.log.log("hard_pass", run.step, record)
    if checkpoint:
        await save(run)


async def save(run: Run) -> None:
    """The run's checkpoint of this step (the policy writes its own parts), with the groups an
    asynchronous run drew and has not trained yet. Its collectives run with the engines asleep
    and the training state on its device; the engines get the weights back after it when that
    sleep took them (a push; the pool is paused around a checkpoint)."""
    state: dict[str, Any] = {"curriculum": run.curriculum.state_dict(), "evals": run.evals}
    if run.pool is not None:  # drawn, not trained: a resumed run submits these again
        state["pool"] = [
            {
                "problems": [p.model_dump(mode="json") for p in pending.problems],
                "n": pending.n,
                "config": pending.config.model_dump(mode="json"),
                "age": pending.age,
            }
            for pending in run.pool.pending()
        ]
    asleep = await run.parts.mover.sleep()
    started = time.perf_counter()
    await run.policy.save(run.checkpoints, run.step, state)
    if asleep.needs_push:  # the same weights back: no new policy version
        await sync(run, changed=False)
    run.log.checkpointed(run.step)
    run.control.preemption.last_save_s = time.perf_counter() - started


async def export(run: Run) -> Path:
    """The trained policy as a Hugging Face folder (RUN_DIR/policy). The export gathers every
    parameter: the engines sleep and the training state comes to its device first (the run
    is over, so nothing wakes them after)."""
    await run.parts.mover.sleep()
    return await run.policy.export(
        run.run_dir / "policy",
        run.parts.tokenizer,
        system_prompt=run.config.rollout.system_prompt,
        step=run.step,
    )


def final_eval_command(config: TrainerConfig) -> str:
    """The `rstar2-eval` settings that reproduce the run's last held-out evaluation: its
    sampling protocol (the model `rstar2-eval`'s config is), the prompt and the tool limits."""
    r = config.rollout
    protocol = config.eval.protocol(top_p=r.top_p, reward=config.reward)
    settings = [f"system_prompt={r.system_prompt}", *protocol.overrides()]
    if r.tool_timeout_s is not None:
        settings.append(f"tool_timeout_s={r.tool_timeout_s}")
    if r.max_tool_response_chars is not None:
        settings.append(f"max_tool_response_chars={r.max_tool_response_chars}")
    return " ".join(settings)


def tokenizer_corpus(problems: list, traces: list, style: str = "paper") -> list[str]:
    """Text to train a tiny tokenizer on: what the model reads and writes in this run."""
    from rstar2_rollout.chat import system_prompt, wrap_question

    corpus = [system_prompt(style=style)] * 64  # type: ignore[arg-type]
    corpus += [wrap_question(p.question) for p in problems]
    corpus += [m.content for ex in traces for m in ex.messages]
    return corpus


async def run_sft(run: Run, traces: list) -> None:
    """Non-reasoning SFT of the policy (in the driver or on the training ranks) on the run's SFT
    examples (data or synthetic traces), encoded exactly as the agent loop renders them."""
    config, parts, log = run.config, run.parts, run.log
    style = config.rollout.system_prompt
    examples = [
        encode_conversation(parts.tokenizer, ex.messages, ex.tools, style=style) for ex in traces
    ]
    sft = config.sft
    steps = sft.epochs * -(-len(examples) // sft.batch_size)
    with report.progress("SFT", steps) as advance:

        def on_step(step: int, total: int, loss: float) -> None:
            advance()
            if step == 1 or step % 10 == 0 or step == total:
                log.log("sft", step, {"loss": loss})

        result = await run.policy.sft(examples, sft, seed=config.run.seed, on_step=on_step)
    report.console.print(
        f"SFT: {result.steps} steps on {len(examples)} traces, loss {result.first_loss:.3f} -> "
        f"{result.last_loss:.3f}"
    )


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)

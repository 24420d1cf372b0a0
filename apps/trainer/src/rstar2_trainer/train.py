"""The trainer, top to bottom: set up, evaluate, SFT, then staged RL; every step logged and saved.

    set up      run directory, parts (model, engines, sandbox and verify servers), data
    evaluate    held-out accuracy before SFT
    SFT         non-reasoning SFT on synthetic tool-call traces; evaluate again
    RL, a step  batch -> rollout 2G per problem -> grade (overlapped) -> reject equal-reward groups
                -> Resample-on-Correct to G -> advantages -> policy loss -> optimizer step
                -> weight sync to the engines -> curriculum (difficulty, stage switch) -> log
                -> checkpoint; an evaluation after each stage
    finish      the trained policy as a Hugging Face folder (RUN_DIR/policy), the final table, plots

With `cluster.train_workers: N` the policy update and the weight sync run on N FSDP2 ranks
(`worker_policy`); SFT and evaluation stay as they are, and the ranks take the driver's weights
before RL.

Resuming (`resume_dir`) restores model, optimizer, RNG, curriculum and step from the latest
checkpoint and drops metrics logged after it, so no step is lost or repeated. Every random choice
derives from (run seed, step, ...) so a resumed run draws the batches the uninterrupted run would.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rstar2_algos import build_algorithm
from rstar2_curriculum import (
    Curriculum,
    StepMetrics,
    generate_problems,
    load_problems,
    sft_traces,
    write_jsonl,
)
from rstar2_rollout.chat import encode_conversation
from rstar2_rollout.loop import derive_seed
from rstar2_trainer import report
from rstar2_trainer.build import Parts, open_parts
from rstar2_trainer.checkpoint import latest_step, load_latest, save_checkpoint, save_policy
from rstar2_trainer.cluster import open_cluster_parts
from rstar2_trainer.collect import collect, rollout_config_for
from rstar2_trainer.config import TrainerConfig
from rstar2_trainer.evaluate import evaluate, held_out_problems
from rstar2_trainer.precision import FP32_CPU, Precision
from rstar2_trainer.rundir import MetricsLog, read_metrics, truncate_metrics
from rstar2_trainer.sft import train_sft
from rstar2_trainer.stats import group_stats, trajectory_stats
from rstar2_trainer.update import make_optimizer, policy_update, warmup_lr
from rstar2_trainer.weight_sync import push_weights, release_engines
from rstar2_trainer.worker_policy import WorkerPolicy, open_worker_policy


async def sync_weights(parts: Parts) -> dict[str, float]:
    """Push the policy's weights into every engine at once (sleeping engines woken, prefix
    caches reset); the times as metrics (`time_sync_s` the whole). With rollout workers on other
    machines (`remote`), one payload goes to each worker over gRPC."""
    if parts.remote is not None:
        return {"time_sync_s": await parts.remote.push_weights(parts.model.state_dict().items())}
    times = await push_weights(parts.engines, parts.model.state_dict().items())
    return times.as_metrics()


async def sync_policy(parts: Parts, workers: WorkerPolicy | None) -> dict[str, float]:
    """The policy's weights into the engines: from the training ranks, or from the driver."""
    return await (workers.sync(parts.engines) if workers else sync_weights(parts))


async def train(config: TrainerConfig, run_dir: Path, *, resume: bool) -> Path:
    torch.set_num_threads(config.run.threads)
    if resume:
        # Before the log is opened: lines past the checkpoint belong to the step being redone;
        # with no checkpoint yet the run starts over, so nothing logged before is kept.
        step = latest_step(run_dir / "checkpoints")
        if step is None:
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        else:
            truncate_metrics(run_dir, rl_step=step)
    log = MetricsLog(run_dir, tensorboard=config.run.tensorboard)
    try:
        await _train(config, run_dir, log, resume)
    finally:
        log.close()
    if config.run.plots:
        report.draw_plots(run_dir, read_metrics(run_dir))
    return run_dir


async def _train(config: TrainerConfig, run_dir: Path, log: MetricsLog, resume: bool) -> None:
    seed = config.run.seed
    algo = build_algorithm(config.algo)
    problems = load_problems(config.curriculum.source, seed=seed).problems
    curriculum = Curriculum.from_config(config.curriculum, problems)
    sft_problems = generate_problems(
        config.sft.examples, seed=derive_seed(seed, "sft"), difficulty=config.sft.difficulty
    )
    held_out = held_out_problems(config.eval, [*problems, *sft_problems])
    write_jsonl(held_out, run_dir / "heldout.jsonl")  # for rstar2-eval on the same problems
    checkpoints = run_dir / "checkpoints"
    ckpt = load_latest(checkpoints) if resume else None
    traces = []
    if config.sft.enabled and ckpt is None:
        traces = sft_traces(
            sft_problems,
            seed=seed,
            failure_rate=config.sft.failure_rate,
            direct_share=config.sft.direct_share,
        )

    corpus = tokenizer_corpus(problems, traces, config.rollout.system_prompt)
    opener = open_parts if config.cluster is None else open_cluster_parts
    precision = Precision.from_settings(config.train.device, config.train.dtype)
    sleep_level = config.cluster.sleep_level if config.cluster is not None else 1
    async with (
        opener(config, run_dir, corpus) as parts,
        open_worker_policy(config, parts.model_dir) as workers,
    ):
        parts.model.to(precision.device)  # fp32 master weights, on the training device
        model, pad_id = parts.model, _pad_id(parts.tokenizer)
        optimizer = make_optimizer(
            model, config.optim.lr, config.optim.betas, config.optim.weight_decay
        )
        evals: list[dict[str, Any]] = []

        async def run_eval(when: str, step: int) -> None:
            parts.check_servers()
            total = len(held_out) * config.eval.samples
            with report.progress(f"eval ({when})", total) as advance:
                stats, _ = await evaluate(parts, held_out, config.eval, config.rollout, advance)
            record = {"when": when, **stats}
            evals.append({**record, "step": step})
            log.log("eval", step, record)
            report.console.print(
                f"eval {when}: accuracy {stats['accuracy']:.3f} on {stats['problems']} held-out "
                f"problems x {config.eval.samples}, "
                f"tool-error ratio in correct {stats.get('tool_error_ratio_pos')}"
            )

        if ckpt is None:
            step = 0
            await sync_weights(parts)
            await run_eval("before_sft", 0)
            if config.sft.enabled:
                run_sft(config, parts, traces, log, pad_id, precision)
                await sync_weights(parts)
            await run_eval("after_sft", 0)
            if workers:
                await workers.load_from(model)  # SFT ran in the driver
            await save_run_checkpoint(
                config, checkpoints, 0, model, optimizer, workers, curriculum, evals
            )
        else:
            step = ckpt.step
            if workers:
                await workers.restore(checkpoints, step)
            elif ckpt.model is None:
                raise FileNotFoundError(
                    f"{ckpt.path} holds no model.pt: it was written with training workers; "
                    "resume with the run's cluster.train_workers"
                )
            else:
                model.load_state_dict(ckpt.model)
            if ckpt.optimizer is not None:
                optimizer.load_state_dict(ckpt.optimizer)
            curriculum.load_state_dict(ckpt.state["curriculum"])
            evals = list(ckpt.state["evals"])
            await sync_policy(parts, workers)
            report.console.print(f"resumed {run_dir} at RL step {step}")

        while not curriculum.plan.finished:
            step += 1
            parts.check_servers()
            batch = curriculum.next_batch()
            stage = batch.stage
            for group in optimizer.param_groups:
                group["lr"] = warmup_lr(step - 1, config.optim.lr, config.optim.warmup_steps)
            rollout = rollout_config_for(
                config.rollout,
                seed=seed,
                step=step,
                max_response_tokens=stage.max_response_tokens,
                max_turns=stage.max_turns,
            )
            n = algo.rollouts_per_prompt
            with report.progress(f"step {step} rollouts", len(batch.problems) * n) as advance:
                collected = await collect(batch.problems, n, parts, rollout, advance)
            trajectories = collected.trajectories
            by_group: dict[str, list[float]] = {}
            for t in trajectories:
                by_group.setdefault(t.group_id, []).append(t.reward)
            for problem_id, rewards in by_group.items():
                curriculum.observe(problem_id, rewards)

            selection = algo.select(
                trajectories,
                np.random.default_rng(derive_seed(seed, "select", step)),
                target_groups=len(batch.problems),
            )
            metrics: dict[str, Any] = {
                "stage": stage.name,
                "batch": [p.id for p in batch.problems],
                "lr": optimizer.param_groups[0]["lr"],
                **trajectory_stats(trajectories),
                **group_stats(trajectories),
                **selection.stats.as_dict(),
                "kept_tool_error_ratio_pos": _kept_pos_ratio(selection.trajectories),
                "failed_jobs": len(collected.failed_jobs),
                "time_rollout_s": collected.rollout_s,
                "time_grade_tail_s": collected.grade_tail_s,
                "time_tool_s": collected.tool_s,
                "time_generate_s": collected.generate_s,
                "engine_idle_s": collected.engine_idle_s,
                "engine_idle_share": collected.engine_idle_s
                / max(1e-9, collected.rollout_s * len(parts.engines)),
            }
            if selection.trajectories:
                # Colocated engines free their GPU memory for the update; the sync wakes them.
                metrics["time_sleep_s"] = await release_engines(parts.engines, sleep_level)
                start = time.perf_counter()
                advantages = algo.advantages(selection).float()  # [K]
                update = update_policy(
                    config,
                    model,
                    optimizer,
                    workers,
                    algo,
                    selection.trajectories,
                    advantages,
                    pad_id=pad_id,
                    precision=precision,
                    temperature=rollout.temperature if rollout.temperature > 0 else 1.0,
                )
                metrics.update(await update)
                metrics["time_train_s"] = time.perf_counter() - start
                metrics.update(await sync_policy(parts, workers))
            else:
                metrics.update(
                    time_train_s=0.0, time_sleep_s=0.0, time_sync_s=0.0, skipped_update=1
                )

            switch = curriculum.end_step(
                StepMetrics(
                    all_correct_share=metrics.get("all_correct_share"),
                    all_wrong_share=metrics.get("all_wrong_share"),
                    truncation_ratio=metrics.get("truncation_ratio"),
                    reward_mean=metrics.get("reward"),
                )
            )
            log.log("rl", step, metrics)
            report.step_line(step, stage.name, metrics)
            if switch is not None:
                log.log("stage", step, switch.model_dump())
                report.console.print(f"stage switch after step {step}: {switch.reason}")
                await run_eval(f"after_{stage.name}", step)
                if switch.reset_optimizer:
                    optimizer = make_optimizer(
                        model, config.optim.lr, config.optim.betas, config.optim.weight_decay
                    )
                    if workers:
                        await workers.reset_optimizer()
            if step % config.run.checkpoint_every == 0 or curriculum.plan.finished:
                await save_run_checkpoint(
                    config, checkpoints, step, model, optimizer, workers, curriculum, evals
                )
        if workers:
            await workers.export_into(model)  # the trained weights, for the policy folder
        policy = save_policy(
            model,
            parts.tokenizer,
            run_dir / "policy",
            system_prompt=config.rollout.system_prompt,
            step=step,
        )
        report.final_table(evals, run_dir, policy, config.rollout.system_prompt)


async def update_policy(
    config: TrainerConfig,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    workers: WorkerPolicy | None,
    algo: Any,
    kept: list,
    advantages: torch.Tensor,  # [K]
    *,
    pad_id: int,
    precision: Precision,
    temperature: float,
) -> dict[str, float]:
    """One optimizer step on the kept batch, on the training ranks or in the driver; metrics."""
    if workers:
        lr = optimizer.param_groups[0]["lr"]  # the driver's optimizer carries the schedule
        return await workers.update(kept, advantages, lr=lr, pad_id=pad_id, temperature=temperature)
    result = policy_update(
        model,
        optimizer,
        algo,
        kept,
        advantages,
        pad_id=pad_id,
        micro_batch_tokens=config.optim.micro_batch_tokens,
        grad_clip=config.optim.grad_clip,
        precision=precision,
        temperature=temperature,
    )
    return {"loss": result.loss, "grad_norm": result.grad_norm, **result.metrics}


async def save_run_checkpoint(
    config: TrainerConfig,
    checkpoints: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    workers: WorkerPolicy | None,
    curriculum: Curriculum,
    evals: list[dict[str, Any]],
) -> None:
    """The run's checkpoint; with training workers their sharded one first, and no model.pt."""
    if workers:
        await workers.save(checkpoints, step)
    save_checkpoint(
        checkpoints,
        step,
        model=None if workers else model,
        optimizer=None if workers else optimizer,
        state={"curriculum": curriculum.state_dict(), "evals": evals},
        keep=config.run.keep_checkpoints,
    )


def tokenizer_corpus(problems: list, traces: list, style: str = "paper") -> list[str]:
    """Text to train a tiny tokenizer on: what the model reads and writes in this run."""
    from rstar2_rollout.chat import system_prompt, wrap_question

    corpus = [system_prompt(style=style)] * 64  # type: ignore[arg-type]
    corpus += [wrap_question(p.question) for p in problems]
    corpus += [m.content for ex in traces for m in ex.messages]
    return corpus


def run_sft(
    config: TrainerConfig,
    parts: Parts,
    traces: list,
    log: MetricsLog,
    pad_id: int,
    precision: Precision = FP32_CPU,
) -> None:
    """Non-reasoning SFT on the curriculum's synthetic traces, encoded as the agent loop would."""
    style = config.rollout.system_prompt
    examples = [encode_conversation(parts.tokenizer, ex.messages, style=style) for ex in traces]
    sft = config.sft
    steps = sft.epochs * -(-len(examples) // sft.batch_size)
    with report.progress("SFT", steps) as advance:

        def on_step(step: int, total: int, loss: float) -> None:
            advance()
            if step == 1 or step % 10 == 0 or step == total:
                log.log("sft", step, {"loss": loss})

        result = train_sft(
            parts.model,
            examples,
            epochs=sft.epochs,
            batch_size=sft.batch_size,
            lr=sft.lr,
            warmup_ratio=sft.warmup_ratio,
            seed=config.run.seed,
            pad_id=pad_id,
            on_step=on_step,
            precision=precision,
        )
    report.console.print(
        f"SFT: {result.steps} steps on {len(examples)} traces, loss {result.first_loss:.3f} -> "
        f"{result.last_loss:.3f}"
    )


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def _kept_pos_ratio(kept: list) -> float | None:
    from rstar2_trainer.stats import tool_error_ratio

    return tool_error_ratio([t for t in kept if t.reward > 0.5])


def run(config: TrainerConfig, run_dir: Path, *, resume: bool) -> Path:
    return asyncio.run(train(config, run_dir, resume=resume))

"""`rstar2-train [RECIPE] [a.b=value ...]`, `rstar2-train --resume RUN_DIR`,
`rstar2-train --export RUN_DIR [--step N] [--to OUT]` (a checkpoint as a policy folder),
`rstar2-train --help-config [SECTION]` (every config key with its type, default and description),
and `rstar2-train [RECIPE] [a.b=value ...] --init-from RUN_DIR[:STEP] [--init-include WHAT]`
(a new run from another run's checkpoint, origin.py). Overrides may come before or after
options.

A user mistake (an unknown recipe, a wrong key or value, a run directory that is not a run, data
that cannot be read: a missing file, missing fields, a missing extra) is one line on stderr (each
of several wrong keys or values a line of its own) and exit code 2, never a traceback; the data
is read before the run directory is made, so a mistake leaves nothing behind. A service that
fails (a port in use, a server that dies for good, a Ray cluster without room for the run) or a
checkpoint the disk refuses is one line and exit code 1; the run can then be resumed. A training
rank that dies (with colocated engines: also its engine's actor) stops the run within the step,
with one line that names the rank and the `--resume` command (`stop_line`), exit code 1; so does
a run whose every engine is gone. A SIGTERM stops the run at a safe point with a checkpoint
(preempt.py): exit code 0 and the resume command; a second SIGTERM ends it at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from rstar2_config import help_config_action, read_yaml
from rstar2_curriculum import DataError
from rstar2_trainer.config import (
    ConfigError,
    TrainerConfig,
    load_config,
    recipes,
    validate_config,
)
from rstar2_trainer.origin import parse_init_from, resolve_origin
from rstar2_trainer.placement.servers import ServerError
from rstar2_trainer.preempt import Preempted
from rstar2_trainer.rundir import new_run_dir, write_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-train",
        description="Non-reasoning SFT, then multi-stage GRPO-RoC agentic RL.",
    )
    parser.add_argument("recipe", nargs="?", default="tiny", help=f"one of {recipes()} or a path")
    parser.add_argument("overrides", nargs="*", help="a.b=value overrides")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    parser.add_argument(
        "--dry-run", action="store_true", help="validate, print the plan and the config, exit"
    )
    parser.add_argument(
        "--export",
        metavar="RUN_DIR",
        help="write a checkpoint of RUN_DIR as a Hugging Face folder (rstar2-eval runs it), exit",
    )
    parser.add_argument(
        "--step", type=int, help="with --export: the checkpoint's step (default: the latest)"
    )
    parser.add_argument(
        "--to", metavar="OUT", help="with --export: where (default: RUN_DIR/policy_step_N)"
    )
    parser.add_argument(
        "--merged",
        action="store_true",
        help="with --export of a LoRA run: the base with the adapter merged (a model folder), "
        "not the adapter folder",
    )
    parser.add_argument(
        "--init-from",
        metavar="RUN_DIR[:STEP]",
        help="a new run (this recipe and overrides) from RUN_DIR's checkpoint STEP (default: "
        "the latest) instead of SFT",
    )
    parser.add_argument(
        "--init-include",
        metavar="WHAT",
        help="with --init-from: also take optimizer, curriculum, or optimizer,curriculum",
    )
    parser.add_argument(
        "--help-config",
        action=help_config_action(TrainerConfig, "rstar2-train"),
        help="list every config key (or SECTION's: optim, engine, ...) with its type, default "
        "and description, exit",
    )
    return parser


def _export(args: argparse.Namespace) -> int:
    from rstar2_trainer.export import export_checkpoint

    run_dir = Path(args.export)
    to = Path(args.to) if args.to else None
    out = export_checkpoint(run_dir, args.step, to, merged=args.merged)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    style = config.get("rollout", {}).get("system_prompt", "paper")
    print(f"wrote {out}")
    print(f"evaluate it: rstar2-eval run {out} {run_dir / 'heldout.jsonl'} system_prompt={style}")
    return 0


def _resolve(args: argparse.Namespace) -> tuple[TrainerConfig, Path | None, bool]:
    """The config, the run directory (None: a new one, made later) and whether it resumes."""
    if args.resume:
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"{run_dir} is not a run directory (no config.yaml in it)")
        if args.overrides or args.recipe != "tiny":
            raise ConfigError("--resume continues a run as it was configured; drop the recipe")
        if args.init_from:
            raise ConfigError(
                "--init-from starts a new run and --resume continues one; use one of them"
            )
        config = validate_config(read_yaml(saved), str(saved))
        return config, run_dir, True
    config = load_config(*_split(args))
    run_dir = config.run.output_dir
    if run_dir is not None and (run_dir / "checkpoints" / "latest").exists():
        raise ConfigError(
            f"{run_dir} already holds a run: resume it with --resume {run_dir} "
            f"or choose another run.output_dir"
        )
    return config, run_dir, False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(argv)  # overrides may follow options
    try:
        if (args.step is not None or args.to or args.merged) and not args.export:
            raise ConfigError("--step, --to and --merged go with --export RUN_DIR")
        if args.init_include and not args.init_from:
            raise ConfigError("--init-include goes with --init-from RUN_DIR[:STEP]")
        if args.export:
            if (
                args.resume
                or args.dry_run
                or args.overrides
                or args.recipe != "tiny"
                or args.init_from
            ):
                raise ConfigError("--export takes only a run directory (and --step, --to)")
            return _export(args)
        if args.dry_run:
            config = load_config(*_split(args))
            print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
            return 0
        config, where, resume = _resolve(args)
        from rstar2_trainer.data import load_run_data, write_reports
        from rstar2_trainer.placement.local import check_local_engines
        from rstar2_trainer.rundir.tracking import check_trackers

        check_local_engines(config)
        check_trackers(config.run)
        data = load_run_data(config, resume=resume)
        if config.init is not None and not resume:
            config = resolve_origin(config, data)
    except (ConfigError, DataError) as exc:
        for line in str(exc).splitlines():  # one line per mistake
            print(f"rstar2-train: {line}", file=sys.stderr)
        return 2
    if where is None:
        run_dir = new_run_dir(config.run.runs_root, config.run.name)
    else:
        run_dir = where
        run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        write_config(run_dir, config)
        write_reports(data, run_dir)
    from rstar2_sandbox import SandboxStartError
    from rstar2_trainer.placement.cluster import ClusterError
    from rstar2_trainer.placement.engines import EngineError
    from rstar2_trainer.restarts import run
    from rstar2_trainer.rundir.logs import quiet
    from rstar2_trainer.rundir.manifest import CheckpointError
    from rstar2_trainer.training.train_workers import RankError

    try:
        with quiet(run_dir, config.run.log_level):  # the libraries' logs to RUN_DIR/logs/run.log
            run(config, run_dir, resume=resume, data=data)
    except (ServerError, ClusterError, SandboxStartError) as exc:
        print(f"rstar2-train: {exc}", file=sys.stderr)
        return 1
    except (RankError, EngineError) as exc:  # a lost rank, or no engine left
        print(stop_line(exc, run_dir), file=sys.stderr)
        return 1
    except CheckpointError as exc:
        print(
            f"rstar2-train: {exc}; free space, then resume with --resume {run_dir}", file=sys.stderr
        )
        return 1
    except Preempted as stop:
        print(_preempted(stop, run_dir), flush=True)
        return 0
    except KeyboardInterrupt:
        print(f"rstar2-train: interrupted; resume with --resume {run_dir}", file=sys.stderr)
        return 130
    return 0


def stop_line(exc: BaseException, run_dir: Path) -> str:
    """The one line a run stopped by a lost training rank ends with."""
    why = " ".join(str(exc).split())
    return f"rstar2-train: {why}; the run stopped; resume it with: rstar2-train --resume {run_dir}"


def _preempted(stop: Preempted, run_dir: Path) -> str:
    """The line a preempted run ends with: where it stopped and how to go on."""
    if stop.saved:
        where = f"after RL step {stop.step}, checkpoint step {stop.step} saved"
    elif stop.step is not None:
        where = f"in the middle of a step (dropped); checkpoint step {stop.step} is the newest"
    else:
        where = "before the first checkpoint; a resume starts over"
    return f"rstar2-train: stopped on SIGTERM {where}; resume with: rstar2-train --resume {run_dir}"


def _split(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The recipe and the overrides, `--init-from` among them (`init.*`)."""
    recipe, overrides = args.recipe, list(args.overrides)
    if "=" in recipe:  # `rstar2-train a.b=1` means the default recipe with an override
        recipe, overrides = "tiny", [recipe, *overrides]
    if args.init_from:
        overrides += parse_init_from(args.init_from, args.init_include)
    return recipe, overrides


if __name__ == "__main__":
    sys.exit(main())

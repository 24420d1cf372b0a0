"""`rstar2-eval`: benchmark evaluation of a model with the code tool.

    rstar2-eval run MODEL BENCH [key=value ...] [--config paper|quick|FILE] [--data F] [--out D]
    rstar2-eval compare RUN_A RUN_B [--json PATH]
    rstar2-eval show RUN
    rstar2-eval benchmarks
    rstar2-eval --help-config [SECTION]      (or `rstar2-eval run --help-config [SECTION]`)

MODEL is a Hugging Face-format folder (run with vLLM, or transformers where vLLM is missing) or
the URL of an OpenAI-compatible endpoint (then `model.tokenizer=FOLDER` is needed). BENCH is a
registered name or a .jsonl file. Every field of `EvalConfig` can be set as key=value (a number
indexes a list: `pass_k.0=2`); `--help-config` lists them with types, defaults and descriptions.
A user mistake (an unknown benchmark, a dataset without the needed fields, an unreachable
endpoint, a bad override) prints one line on stderr (each of several bad overrides a line of its
own) and exits 2; a run that could not finish every sample exits 1 and can be rerun to resume.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from rstar2_config import help_config_action
from rstar2_curriculum import BENCHMARKS, BenchmarkError
from rstar2_evaluator.compare import compare_runs, read_summary
from rstar2_evaluator.config import ConfigError, EvalConfig, load_config
from rstar2_evaluator.evaluate import EvalFailed, run_evaluation
from rstar2_evaluator.model import ModelError
from rstar2_evaluator.report import comparison_tables, summary_table
from rstar2_evaluator.store import RunError
from rstar2_evaluator.tool import ToolError

USER_ERRORS = (ConfigError, BenchmarkError, ModelError, RunError, ToolError)


def _model_base(model: str) -> dict[str, Any]:
    if model.startswith(("http://", "https://")):
        return {"model.kind": "openai", "model.url": model}
    return {"model.kind": "local", "model.path": model}


def _run(args: argparse.Namespace, console: Console) -> int:
    base = {**_model_base(args.model), "benchmark.name": args.benchmark}
    if args.data:
        base["benchmark.data"] = args.data
    if args.out:
        base["out"] = args.out
    if base["model.kind"] == "openai" and os.environ.get("OPENAI_API_KEY"):
        base["model.api_key"] = os.environ["OPENAI_API_KEY"]
    config = load_config(args.config, base, args.overrides)
    try:
        summary, run_dir = run_evaluation(config, console, progress=not args.no_progress)
    except EvalFailed as failed:
        print(f"rstar2-eval: {failed}", file=sys.stderr)
        return 1
    console.print(summary_table(summary, f"{config.benchmark.name}: {run_dir}"))
    return 0


def _compare(args: argparse.Namespace, console: Console) -> int:
    comparison = compare_runs(args.a, args.b)
    console.print(comparison_tables(comparison, limit=args.limit))
    if args.json:
        Path(args.json).write_text(comparison.model_dump_json(indent=2) + "\n")
    return 0


def _show(args: argparse.Namespace, console: Console) -> int:
    console.print(summary_table(read_summary(args.run), str(args.run)))
    return 0


def _benchmarks(args: argparse.Namespace, console: Console) -> int:
    for bench in BENCHMARKS.values():
        hub = " + ".join(f"{p.path}{':' + p.name if p.name else ''}" for p in bench.parts)
        console.print(f"{bench.name:<11} {bench.title:<36} {hub}")
    return 0


HelpConfig = help_config_action(EvalConfig, "rstar2-eval")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-eval", description="Benchmark evaluation of a model with the code tool."
    )
    parser.add_argument("--help-config", action=HelpConfig)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="evaluate a model on a benchmark (resumable)")
    run.add_argument("model", help="a Hugging Face-format folder, or http(s)://host:port/v1")
    run.add_argument("benchmark", help=f"one of {', '.join(BENCHMARKS)}, or a .jsonl file")
    run.add_argument("overrides", nargs="*", help="key=value settings, e.g. samples=4")
    run.add_argument("--config", default="paper", help="paper (default), quick, or a YAML path")
    run.add_argument("--data", help="a local .jsonl copy of a named benchmark")
    run.add_argument("--out", help="run directory (default runs/eval/<bench>-<model>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--help-config", action=HelpConfig)
    run.set_defaults(handler=_run)
    compare = commands.add_parser("compare", help="two finished runs side by side")
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--json", help="also write the comparison here")
    compare.add_argument("--limit", type=int, default=20, help="problems shown (default 20)")
    compare.set_defaults(handler=_compare)
    show = commands.add_parser("show", help="the summary of a finished run")
    show.add_argument("run")
    show.set_defaults(handler=_show)
    names = commands.add_parser("benchmarks", help="list the named benchmarks")
    names.set_defaults(handler=_benchmarks)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # Overrides may follow options (`run M B --config quick samples=4`): argparse stops filling a
    # positional list at the first option, and subparsers rule out parse_intermixed_args.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "overrides", None) is None or any(x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    console = Console()
    try:
        return args.handler(args, console)
    except USER_ERRORS as error:
        for line in str(error).splitlines():  # one line per mistake
            print(f"rstar2-eval: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rstar2-eval: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

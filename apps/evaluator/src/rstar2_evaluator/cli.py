"""`rstar2-eval`: benchmark evaluation of a model, with the code tool where the paper uses it.

    rstar2-eval run MODEL BENCH|SUITE [key=value ...] [--config paper|quick|FILE] [--data PATH]
                    [--out D] [--json PATH]
    rstar2-eval compare RUN_A RUN_B [--json PATH]      (two runs, or two suite runs)
    rstar2-eval show RUN
    rstar2-eval benchmarks
    rstar2-eval --help-config [SECTION]      (or `rstar2-eval run --help-config [SECTION]`)

MODEL is a Hugging Face-format folder (run with vLLM, or transformers where vLLM is missing) or
the URL of an OpenAI-compatible endpoint (then `model.tokenizer=FOLDER` is needed). BENCH is a
benchmark's name (`rstar2-eval benchmarks`) or a .jsonl file; SUITE a suite's name (`paper`:
the paper's Tables 3 and 5) or a suite YAML (`suite.py`), run benchmark by benchmark, each under
its own protocol, and shown as one table beside the reported numbers. Every field of
`EvalConfig` can be set as key=value (a number indexes a list: `pass_k.0=2`); `--help-config`
lists them with types, defaults and descriptions.
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
from rstar2_curriculum import BenchmarkError
from rstar2_evaluator import catalog
from rstar2_evaluator.compare import compare_runs, compare_suites, is_suite_run, read_summary
from rstar2_evaluator.config import ConfigError, EvalConfig, load_config
from rstar2_evaluator.evaluate import EvalFailed, run_evaluation
from rstar2_evaluator.model import ModelError
from rstar2_evaluator.report import (
    comparison_tables,
    suite_comparison_table,
    suite_tables,
    summary_table,
)
from rstar2_evaluator.store import RunError
from rstar2_evaluator.suite import (
    SUITE_FILE,
    SUITES,
    SuiteResult,
    is_suite,
    load_suite,
    local_copies,
    row_result,
)
from rstar2_evaluator.tool import ToolError

USER_ERRORS = (ConfigError, BenchmarkError, ModelError, RunError, ToolError)


def _model_base(model: str) -> dict[str, Any]:
    if model.startswith(("http://", "https://")):
        return {"model.kind": "openai", "model.url": model}
    return {"model.kind": "local", "model.path": model}


def _keys(base: dict[str, Any]) -> dict[str, Any]:
    """Secrets from the environment, never from the command line or a file."""
    if base["model.kind"] == "openai" and os.environ.get("OPENAI_API_KEY"):
        base["model.api_key"] = os.environ["OPENAI_API_KEY"]
    return base


def _judge_key(config: EvalConfig) -> EvalConfig:
    key = os.environ.get(config.judge.api_key_env, "")
    if not key or config.judge.api_key:
        return config
    return config.model_copy(update={"judge": config.judge.model_copy(update={"api_key": key})})


def _config_of(args: argparse.Namespace, benchmark: str, extra: dict[str, Any], row: list[str]):
    entry = catalog.find(benchmark)
    base = {
        **_model_base(args.model),
        "benchmark.name": benchmark,
        **(entry.protocol if entry is not None else {}),
        **extra,
    }
    return _judge_key(load_config(args.config, _keys(base), [*row, *args.overrides]))


def _run(args: argparse.Namespace, console: Console) -> int:
    if is_suite(args.benchmark):
        return _run_suite(args, console)
    extra = {"benchmark.data": args.data} if args.data else {}
    if args.out:
        extra["out"] = args.out
    config = _config_of(args, args.benchmark, extra, [])
    try:
        summary, run_dir = run_evaluation(config, console, progress=not args.no_progress)
    except EvalFailed as failed:
        print(f"rstar2-eval: {failed}", file=sys.stderr)
        return 1
    console.print(summary_table(summary, f"{config.benchmark.name}: {run_dir}"))
    if args.json:
        Path(args.json).write_text(summary.model_dump_json(indent=2) + "\n")
    return 0


def _run_suite(args: argparse.Namespace, console: Console) -> int:
    """Every benchmark of the suite, each under its protocol in OUT/<benchmark>; then one table."""
    suite = load_suite(args.benchmark)
    name = Path(args.benchmark).stem
    out = Path(args.out) if args.out else Path("runs/eval") / f"{name}-{_label(args.model)}"
    data = local_copies(suite, Path(args.data)) if args.data else {}
    configs = []
    for row in suite.rows:  # every config is checked before the first benchmark runs
        extra: dict[str, Any] = {"out": str(out / row.benchmark)}
        if row.benchmark in data:
            extra["benchmark.data"] = data[row.benchmark]
        config = _config_of(args, row.benchmark, extra, row.overrides)
        catalog.build_checker(config)  # a missing judge or reference scorer: said before any run
        configs.append(config)
    done: dict[str, Any] = {}
    for row, config in zip(suite.rows, configs, strict=True):
        console.rule(f"{row.label or row.benchmark}")
        try:
            summary, run_dir = run_evaluation(config, console, progress=not args.no_progress)
        except EvalFailed as failed:
            print(f"rstar2-eval: {row.benchmark}: {failed}", file=sys.stderr)
            return 1
        done[row.benchmark] = row_result(row, summary, run_dir)
    result = SuiteResult(
        suite=name,
        title=suite.title,
        model=_label(args.model),
        reported=suite.reported,
        tables=[(t.title, [done[r.benchmark] for r in t.rows]) for t in suite.tables],
    )
    text = result.model_dump_json(indent=2) + "\n"
    (out / SUITE_FILE).write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    console.print(suite_tables(result))
    console.print(f"{suite.title}: {out / SUITE_FILE}")
    return 0


def _label(model: str) -> str:
    return Path(model.rstrip("/")).name or "endpoint"


def _compare(args: argparse.Namespace, console: Console) -> int:
    if is_suite_run(args.a) or is_suite_run(args.b):
        suites = compare_suites(args.a, args.b)
        console.print(suite_comparison_table(suites))
        if args.json:
            Path(args.json).write_text(suites.model_dump_json(indent=2) + "\n")
        return 0
    comparison = compare_runs(args.a, args.b)
    console.print(comparison_tables(comparison, limit=args.limit))
    if args.json:
        Path(args.json).write_text(comparison.model_dump_json(indent=2) + "\n")
    return 0


def _show(args: argparse.Namespace, console: Console) -> int:
    if is_suite_run(args.run):
        from rstar2_evaluator.compare import read_suite

        console.print(suite_tables(read_suite(args.run)))
        return 0
    console.print(summary_table(read_summary(args.run), str(args.run)))
    return 0


def _benchmarks(args: argparse.Namespace, console: Console) -> int:
    """One line per benchmark (name, kind, title, scorer, data) and per suite."""
    for entry in catalog.CATALOG.values():
        print(
            f"{entry.name:<14} {entry.kind:<14} {entry.title}; scored by {entry.scorer}; "
            f"data: {entry.download}"
        )
    for name in SUITES.names():
        suite = load_suite(name)
        names = " ".join(row.benchmark for row in suite.rows)
        print(f"{name:<14} {'suite':<14} {suite.title}: {names}")
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
    run.add_argument(
        "benchmark", help="a benchmark or suite by name (`rstar2-eval benchmarks`), or a file"
    )
    run.add_argument("overrides", nargs="*", help="key=value settings, e.g. samples=4")
    run.add_argument("--config", default="paper", help="paper (default), quick, or a YAML path")
    run.add_argument(
        "--data",
        help="a local copy of the benchmark in its published format (file or folder); for a "
        "suite, a folder holding one per benchmark, by name",
    )
    run.add_argument("--out", help="run directory (default runs/eval/<bench>-<model>)")
    run.add_argument("--json", help="also write the summary (a suite's: suite.json) here")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--help-config", action=HelpConfig)
    run.set_defaults(handler=_run)
    compare = commands.add_parser(
        "compare", help="two finished runs, or two suite runs, side by side"
    )
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--json", help="also write the comparison here")
    compare.add_argument("--limit", type=int, default=20, help="problems shown (default 20)")
    compare.set_defaults(handler=_compare)
    show = commands.add_parser("show", help="the summary of a finished run")
    show.add_argument("run")
    show.set_defaults(handler=_show)
    names = commands.add_parser("benchmarks", help="list the benchmarks and the suites")
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

"""`rstar2-curriculum`: prepare data from the command line.

    rstar2-curriculum clean train.jsonl --eval aime24.jsonl --out clean.jsonl --report report.json
    rstar2-curriculum synth --n 512 --seed 0 --out problems.jsonl --sft sft.jsonl
    rstar2-curriculum convert glaive.jsonl --format glaive --out sft.jsonl
    rstar2-curriculum sft chat.jsonl glaive.parquet --format auto --out mix.jsonl --report r.json
    rstar2-curriculum verify-labels omr.jsonl --engine vllm --model /models/Qwen3-32B --k 16 --m 2 \
        --out verified.jsonl --report labels.json

`clean` loads (JSONL, Parquet or a Hugging Face dataset, raw or through a `--preset`), cleans,
decontaminates against the `--eval` sets, prints the load and clean tables, writes the kept
problems and a JSON report. `sft` reads SFT sources as the trainer does (`load_sft`) and writes
the checked mixture. `verify-labels` is the paper's label check (labels.py; needs the
`label-check` extra, imported only when it runs). A user mistake (missing file, unknown format,
missing fields, missing extra) prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from rstar2_curriculum.clean import clean
from rstar2_curriculum.config import (
    CleanConfig,
    FieldMap,
    HFSource,
    JsonlSource,
    LabelCheckConfig,
    ParquetSource,
    Preset,
    SFTFormat,
    SFTSourceConfig,
)
from rstar2_curriculum.convert import convert_rows
from rstar2_curriculum.load import DataError, LoadResult, load_problems, write_jsonl
from rstar2_curriculum.rows import detect_kind
from rstar2_curriculum.sft import write_sft_jsonl
from rstar2_curriculum.sftdata import load_sft
from rstar2_curriculum.synthetic import Difficulty, generate_problems
from rstar2_curriculum.traces import sft_traces


def _load(path: str, kind: str, fields: FieldMap, preset: str | None = None) -> LoadResult:
    if kind == "auto":
        kind = detect_kind(path)
    mapping: dict = {"preset": preset} if preset else {"fields": fields}
    if kind == "jsonl":
        return load_problems(JsonlSource(path=path, **mapping))
    if kind == "parquet":
        return load_problems(ParquetSource(path=path, **mapping))
    return load_problems(HFSource(path=path, **mapping))


def _fields(args: argparse.Namespace) -> FieldMap:
    return FieldMap(question=args.question, answer=args.answer, id=args.id or None)


def _clean(args: argparse.Namespace) -> None:
    fields = _fields(args)
    loaded = _load(args.input, args.format, fields, args.preset)
    print(loaded.report.table())
    evals = []
    for path in args.eval:
        result = _load(path, "auto", fields)
        print(result.report.table())
        evals += result.problems
    config = CleanConfig(
        integer_answers=not args.allow_non_integer,
        max_answer_digits=args.max_answer_digits,
        decontaminate_ngram=args.ngram,
    )
    cleaned = clean(loaded.problems, config, evals)
    print(cleaned.report.table())
    if args.out:
        write_jsonl(cleaned.problems, args.out)
    if args.report:
        report = {"load": loaded.report.model_dump(), "clean": cleaned.report.model_dump()}
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=2))


def _synth(args: argparse.Namespace) -> None:
    levels: dict[str, Difficulty] = {"1": 1, "2": 2, "3": 3, "mixed": "mixed"}
    problems = generate_problems(args.n, args.seed, difficulty=levels[args.difficulty])
    write_jsonl(problems, args.out)
    print(f"wrote {len(problems)} problems to {args.out}")
    if args.sft:
        examples = sft_traces(
            problems, args.seed, failure_rate=args.failure_rate, direct_share=args.direct_share
        )
        write_sft_jsonl(examples, args.sft)
        print(f"wrote {len(examples)} SFT traces to {args.sft}")


def _convert(args: argparse.Namespace) -> None:
    rows, bad = [], 0
    with Path(args.input).open("rb") as handle:
        for raw in handle:
            try:
                rows.append(json.loads(raw.decode("utf-8")))
            except (UnicodeDecodeError, json.JSONDecodeError):
                bad += raw.strip() != b""
    examples, report = convert_rows(rows, args.format, source=Path(args.input).stem)
    write_sft_jsonl(examples, args.out)
    print(f"{report.rows + bad} rows, {report.converted} converted -> {args.out}")
    for reason, count in sorted({**report.skipped, "unreadable_line": bad}.items()):
        if count:
            print(f"  skipped {count:>7}  {reason}")


def _sft(args: argparse.Namespace) -> None:
    sources = [SFTSourceConfig(path=p, format=args.format) for p in args.inputs]
    loaded = load_sft(sources, seed=args.seed)
    print(loaded.report.table())
    write_sft_jsonl(loaded.examples, args.out)
    if args.report:
        Path(args.report).write_text(loaded.report.model_dump_json(indent=2))


def _verify_labels(args: argparse.Namespace) -> None:
    from rstar2_curriculum._verify_cli import run, settings

    config = settings(args)
    loaded = _load(args.input, args.format, _fields(args), args.preset)
    print(loaded.report.table())
    run(args, loaded, config)


def _problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=["auto", "jsonl", "parquet", "hf"], default="auto")
    p.add_argument("--preset", choices=list(get_args(Preset)), help="a named row mapping")
    p.add_argument("--question", default="question", help="field of the question")
    p.add_argument("--answer", default="answer", help="field of the answer")
    p.add_argument("--id", default="id", help="field of the id ('' for row numbers)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-curriculum", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("clean", help="load, clean and decontaminate a problem set")
    c.add_argument("input")
    _problem_args(c)
    c.add_argument("--eval", action="append", default=[], help="an evaluation set (repeatable)")
    c.add_argument("--ngram", type=int, default=8)
    c.add_argument("--max-answer-digits", type=int, default=30)
    c.add_argument("--allow-non-integer", action="store_true")
    c.add_argument("--out", help="write kept problems here (JSONL)")
    c.add_argument("--report", help="write the JSON report here")
    c.set_defaults(run=_clean)

    s = sub.add_parser("synth", help="generate synthetic problems (and SFT traces)")
    s.add_argument("--n", type=int, default=512)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--difficulty", choices=["1", "2", "3", "mixed"], default="mixed")
    s.add_argument("--out", required=True)
    s.add_argument("--sft", help="also write worked tool-call traces here")
    s.add_argument(
        "--failure-rate", type=float, default=0.3, help="share of traces that fail first"
    )
    s.add_argument(
        "--direct-share",
        type=float,
        default=0.0,
        help="share of traces that answer without the tool",
    )
    s.set_defaults(run=_synth)

    v = sub.add_parser("convert", help="convert tool-calling / instruction JSONL to SFT examples")
    v.add_argument("input")
    v.add_argument(
        "--format",
        choices=["auto", "openai", "sharegpt", "glaive", "xlam", "instruction"],
        default="auto",
    )
    v.add_argument("--out", required=True)
    v.set_defaults(run=_convert)

    f = sub.add_parser("sft", help="read SFT sources as the trainer does and write the mixture")
    f.add_argument("inputs", nargs="+", help=".jsonl / .parquet files or save_to_disk folders")
    f.add_argument("--format", choices=list(get_args(SFTFormat)), default="auto")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--out", required=True, help="write the checked examples here (JSONL)")
    f.add_argument("--report", help="write the JSON load report here")
    f.set_defaults(run=_sft)

    lc = LabelCheckConfig()
    e = sub.add_parser(
        "verify-labels",
        help="the paper's label check: keep problems whose label m of k samples match",
        description="Sample --k answers per problem from a model (any engine rstar2-rollout "
        "builds), grade them against the label with rstar2-verify, keep the problems with at "
        'least --m matches. Needs: pip install "rstar2-curriculum[label-check]" and the '
        "engine's extra (rstar2-rollout[hf] or [vllm]).",
    )
    e.add_argument("input", help="problems: .jsonl, .parquet or a save_to_disk folder")
    _problem_args(e)
    e.add_argument("--engine", choices=["vllm", "hf", "openai"], default="vllm")
    e.add_argument("--model", help="model folder (vllm, hf) or served model name (openai)")
    e.add_argument("--engine-config", help="a full rstar2-rollout EngineConfig as JSON")
    e.add_argument("--base-url", help="openai engine: endpoint root, e.g. http://host:8000/v1")
    e.add_argument("--tokenizer", help="tokenizer folder; default: the model folder")
    e.add_argument("--dtype", default=None, help="engine dtype (hf: float32; vllm: auto)")
    e.add_argument("--max-model-len", type=int, default=None, help="vllm: prompt + response")
    e.add_argument("--k", type=int, default=lc.k, help="samples per problem")
    e.add_argument("--m", type=int, default=lc.m, help="matches needed to keep a problem")
    e.add_argument("--mode", choices=["plain", "agent"], default=lc.mode)
    e.add_argument("--sandbox", default="local", help="agent mode: 'local' or HOST:PORT")
    e.add_argument("--temperature", type=float, default=lc.temperature)
    e.add_argument("--top-p", type=float, default=lc.top_p)
    e.add_argument("--max-response-tokens", type=int, default=lc.max_response_tokens)
    e.add_argument("--max-turns", type=int, default=lc.max_turns)
    e.add_argument("--system-prompt", choices=["paper", "compact"], default=lc.system_prompt)
    e.add_argument("--max-concurrency", type=int, default=lc.max_concurrency)
    e.add_argument("--seed", type=int, default=lc.seed)
    e.add_argument("--limit", type=int, help="check only the first N problems")
    e.add_argument("--out", required=True, help="write the kept problems here (JSONL)")
    e.add_argument("--report", help="write the JSON report here")
    e.set_defaults(run=_verify_labels)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        message = f"{where}: {message}" if where else message
        print(f"rstar2-curriculum {args.command}: {message}", file=sys.stderr)
        return 2
    except (DataError, ImportError, ValueError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"rstar2-curriculum {args.command}: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

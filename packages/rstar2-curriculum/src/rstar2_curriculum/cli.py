"""`rstar2-curriculum`: prepare data from the command line.

    rstar2-curriculum clean train.jsonl --eval aime24.jsonl --out clean.jsonl --report report.json
    rstar2-curriculum synth --n 512 --seed 0 --out problems.jsonl --sft sft.jsonl
    rstar2-curriculum convert glaive.jsonl --format glaive --out sft.jsonl

`clean` loads (JSONL, Parquet or a Hugging Face dataset), cleans, decontaminates against the
`--eval` sets, prints the load and clean tables, writes the kept problems and a JSON report.
A user mistake (missing file, unknown format, bad field) prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from rstar2_curriculum.clean import clean
from rstar2_curriculum.config import CleanConfig, FieldMap, HFSource, JsonlSource, ParquetSource
from rstar2_curriculum.convert import convert_rows
from rstar2_curriculum.load import DataError, LoadResult, load_problems, write_jsonl
from rstar2_curriculum.sft import write_sft_jsonl
from rstar2_curriculum.synthetic import Difficulty, generate_problems
from rstar2_curriculum.traces import sft_traces


def _load(path: str, kind: str, fields: FieldMap) -> LoadResult:
    if kind == "auto":
        kind = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}.get(
            Path(path).suffix, "hf"
        )
    if kind == "jsonl":
        return load_problems(JsonlSource(path=path, fields=fields))
    if kind == "parquet":
        return load_problems(ParquetSource(path=path, fields=fields))
    return load_problems(HFSource(path=path, fields=fields))


def _clean(args: argparse.Namespace) -> None:
    fields = FieldMap(question=args.question, answer=args.answer, id=args.id or None)
    loaded = _load(args.input, args.format, fields)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-curriculum", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("clean", help="load, clean and decontaminate a problem set")
    c.add_argument("input")
    c.add_argument("--format", choices=["auto", "jsonl", "parquet", "hf"], default="auto")
    c.add_argument("--question", default="question", help="field of the question")
    c.add_argument("--answer", default="answer", help="field of the answer")
    c.add_argument("--id", default="id", help="field of the id ('' for row numbers)")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except (DataError, ImportError, ValueError, ValidationError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"rstar2-curriculum {args.command}: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

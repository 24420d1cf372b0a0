"""The registry of benchmarks graded by answer, and the one strict loader of their problems.

`load_benchmark(BenchmarkConfig)` (rstar2-eval) turns a name or a path into `Problem`s;
`load_benchmark_file(path)` (rstar2-train's `eval.sources`) reads one file. Named benchmarks load
with the `datasets` library where the machine is online; `data=PATH` loads a local copy in the
published format instead (Parquet or JSONL rows with the dataset's own field names; GPQA's CSV).
Each has a `kind`: `math` (an answer rstar2-verify grades) or `choice` (multiple choice: the
options are kept in the problem, see `choice.py`, and a letter is graded). Any JSONL or Parquet
file works as a maths benchmark with question and answer fields (names configurable).

Loading is strict, because a silently smaller benchmark is a wrong number: a row without the
needed fields, an empty file or two problems with one id is a `BenchmarkError` (a `DataError`)
whose message is one line that names the fix; an offline machine without `data` is told what to
download and where (`Benchmark.download`).

Not covered: cleaning or decontamination (evaluation data is taken as published), and the
benchmarks scored by reference checkers (IFEval, BFCL, Arena-Hard, LiveCodeBench), which
rstar2-eval loads itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rstar2_curriculum.choice import GPQA_COLUMNS, csv_rows, gpqa_problem
from rstar2_curriculum.config import BenchmarkConfig, FieldMap, HFSource
from rstar2_curriculum.load import LoadReport, LoadResult, load_hf, load_jsonl, load_parquet
from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import DataError, RowError, hf_rows, jsonl_rows, parquet_rows

__all__ = [
    "BENCHMARKS",
    "AnswerKind",
    "Benchmark",
    "BenchmarkError",
    "load_benchmark",
    "load_benchmark_file",
]

AnswerKind = Literal["math", "choice"]


class BenchmarkError(DataError):
    """The problems cannot be loaded as asked; the message is one actionable line."""


@dataclass(frozen=True)
class HubPart:
    """One Hugging Face dataset (configuration, split) of a benchmark."""

    path: str
    split: str
    name: str | None = None


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark: where it lives on the hub, what its fields are called, its kind, and
    what a user downloads for an offline copy."""

    name: str
    title: str
    parts: tuple[HubPart, ...]
    fields: FieldMap
    kind: AnswerKind = "math"
    download: str = ""  # the file(s) to fetch for --data, and from where


_MATHARENA = FieldMap(question="problem", answer="answer", id="problem_idx")


def _parquet(repo: str, split: str = "train") -> str:
    return f"huggingface.co/datasets/{repo}: data/{split}-*.parquet (or its rows as JSONL)"


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "aime24",
            "AIME 2024 (I and II, 30 problems)",
            (HubPart("HuggingFaceH4/aime_2024", "train"),),
            FieldMap(question="problem", answer="answer", id="id"),
            download=_parquet("HuggingFaceH4/aime_2024"),
        ),
        Benchmark(
            "aime25",
            "AIME 2025 (I and II, 30 problems)",
            (
                HubPart("opencompass/AIME2025", "test", "AIME2025-I"),
                HubPart("opencompass/AIME2025", "test", "AIME2025-II"),
            ),
            FieldMap(question="question", answer="answer", id=None),
            download="huggingface.co/datasets/opencompass/AIME2025: aime2025-I.jsonl and "
            "aime2025-II.jsonl, concatenated",
        ),
        Benchmark(
            "aime26",
            "AIME 2026 (I and II, 30 problems)",
            (HubPart("MathArena/aime_2026", "train"),),
            _MATHARENA,
            download=_parquet("MathArena/aime_2026"),
        ),
        Benchmark(
            "math500",
            "MATH-500 (500 problems)",
            (HubPart("HuggingFaceH4/MATH-500", "test"),),
            FieldMap(question="problem", answer="answer", id="unique_id"),
            download="huggingface.co/datasets/HuggingFaceH4/MATH-500: test.jsonl",
        ),
        Benchmark(
            "hmmt_feb25",
            "HMMT February 2025 (30 problems)",
            (HubPart("MathArena/hmmt_feb_2025", "train"),),
            _MATHARENA,
            download=_parquet("MathArena/hmmt_feb_2025"),
        ),
        Benchmark(
            "hmmt_feb26",
            "HMMT February 2026 (33 problems)",
            (HubPart("MathArena/hmmt_feb_2026", "train"),),
            _MATHARENA,
            download=_parquet("MathArena/hmmt_feb_2026"),
        ),
        Benchmark(
            "brumo25",
            "BRUMO 2025 (30 problems)",
            (HubPart("MathArena/brumo_2025", "train"),),
            _MATHARENA,
            download=_parquet("MathArena/brumo_2025"),
        ),
        Benchmark(
            "beyond_aime",
            "BeyondAIME (100 problems)",
            (HubPart("ByteDance-Seed/BeyondAIME", "test"),),
            FieldMap(question="problem", answer="answer", id=None),
            download=_parquet("ByteDance-Seed/BeyondAIME", "test"),
        ),
        Benchmark(
            "gpqa_diamond",
            "GPQA-Diamond (198 questions, 4 options)",
            (HubPart("Idavidrein/gpqa", "train", "gpqa_diamond"),),
            FieldMap(question="Question", answer="Correct Answer", id="Record ID"),
            kind="choice",
            download="huggingface.co/datasets/Idavidrein/gpqa (gated: accept its terms): "
            "gpqa_diamond.csv",
        ),
    )
}

_PLAIN = FieldMap(question="question", answer="answer", id="id")


def _fields(base: FieldMap, config: BenchmarkConfig) -> FieldMap:
    return FieldMap(
        question=config.question_field or base.question,
        answer=config.answer_field or base.answer,
        id=config.id_field or base.id,
    )


def _row_keys(path: Path) -> str:
    """The fields of the first object in a JSONL file, for an error message."""
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    return ", ".join(sorted(row)) if isinstance(row, dict) else "not an object"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return "unreadable"
    return "none"


def _strict(
    result: LoadResult, where: str, path: Path | None, fields: FieldMap | None
) -> list[Problem]:
    """The loaded problems, or a BenchmarkError when any row was unusable or none was there.
    `fields` None: the columns are the benchmark's own and cannot be renamed (GPQA's)."""
    report = result.report
    if report.skipped:
        reason, count = max(report.skipped.items(), key=lambda kv: kv[1])
        at = ", ".join(report.examples.get(reason, [])[:3])
        hint = ""
        if fields is None:
            hint = f"; the file needs GPQA's columns ({', '.join(GPQA_COLUMNS)})"
        elif reason.startswith(("missing_field:", "empty_field:")):
            field = reason.split(":", 1)[1]
            which = "question" if field == fields.question else "answer"
            seen = f" (rows have: {_row_keys(path)})" if path else ""
            hint = f"; name the field with benchmark.{which}_field=...{seen}"
        raise BenchmarkError(
            f"{where}: {count} of {report.rows} rows unusable ({reason}, e.g. {at}){hint}"
        )
    if not result.problems:
        raise BenchmarkError(f"{where}: no problems in it")
    return result.problems


def _unique(problems: list[Problem], where: str) -> list[Problem]:
    seen: set[str] = set()
    for problem in problems:
        if problem.id in seen:
            raise BenchmarkError(
                f"{where}: problem id {problem.id!r} appears twice; ids must be unique "
                "(name another field with benchmark.id_field=...)"
            )
        seen.add(problem.id)
    return problems


def _choices(rows: Iterable[tuple[str, Any]], source: str) -> LoadResult:
    """Multiple-choice rows (GPQA's columns) to Problems, bad rows counted as the loaders do."""
    report = LoadReport(source=source)
    problems: list[Problem] = []
    for where, row in rows:
        report.rows += 1
        try:
            if isinstance(row, RowError):
                raise row
            problems.append(gpqa_problem(row, source, report.rows - 1))
        except RowError as error:
            report.skip(str(error), where)
    report.loaded = len(problems)
    return LoadResult(problems, report)


_SUFFIXES = {
    "math": ((".jsonl", ".parquet"), "a .jsonl file (one JSON object per line) or a .parquet file"),
    "choice": (
        (".csv", ".jsonl", ".parquet"),
        "a .csv (GPQA's published file), .jsonl or .parquet file",
    ),
}


def _load_file(
    path: Path, fields: FieldMap, source: str, kind: AnswerKind = "math"
) -> list[Problem]:
    suffixes, wanted = _SUFFIXES[kind]
    if path.suffix not in suffixes:
        raise BenchmarkError(f"{path}: expected {wanted}")
    if kind == "choice":
        if not path.is_file():
            raise BenchmarkError(f"{path}: no such data file")
        reader = {".csv": csv_rows, ".jsonl": jsonl_rows, ".parquet": parquet_rows}[path.suffix]
        try:
            result = _choices(reader(path), source)
        except DataError as error:
            raise BenchmarkError(str(error)) from None
        return _strict(result, str(path), path, None)
    load = load_parquet if path.suffix == ".parquet" else load_jsonl
    try:
        result = load(path, fields, source)
    except DataError as error:
        hint = ""
        if "no row has the field" in str(error):
            hint = "; name the fields with benchmark.question_field=... benchmark.answer_field=..."
        raise BenchmarkError(f"{error}{hint}") from None
    return _strict(result, str(path), path, fields)


def _load_hub(bench: Benchmark, fields: FieldMap) -> list[Problem]:
    problems: list[Problem] = []
    for part in bench.parts:
        source = part.name or bench.name
        try:
            if bench.kind == "choice":
                result = _choices(hf_rows(part.path, part.split, name=part.name), bench.name)
            else:
                config = HFSource(
                    path=part.path, name=part.name, split=part.split, fields=fields, source=source
                )
                result = load_hf(config)
        except ImportError as error:
            raise BenchmarkError(f"{bench.name} needs the datasets library ({error})") from None
        except DataError as error:
            reason = str(error).splitlines()[0][:160]
            raise BenchmarkError(
                f"cannot load {bench.name} from the Hugging Face hub ({reason}); offline, "
                f"download {bench.download} and pass it with --data PATH"
            ) from None
        problems += _strict(result, part.path, None, fields if bench.kind == "math" else None)
    return problems


def load_benchmark_file(path: str | Path, fields: FieldMap = _PLAIN) -> list[Problem]:
    """Every problem of one JSONL or Parquet file, ids unique (BenchmarkError otherwise)."""
    return _unique(_load_file(Path(path), fields, Path(path).stem), str(path))


def load_benchmark(config: BenchmarkConfig) -> list[Problem]:
    """The problems a benchmark config names, in order, ids unique."""
    bench = BENCHMARKS.get(config.name)
    path = Path(config.name)
    if bench is not None:
        fields = _fields(bench.fields, config)
        if config.data:
            data = Path(config.data)
            if not data.exists():
                raise BenchmarkError(
                    f"{data}: no such data file; download {bench.download} and pass it with "
                    "--data PATH"
                )
            problems = _load_file(data, fields, bench.name, bench.kind)
        else:
            problems = _load_hub(bench, fields)
    elif path.suffix in (".jsonl", ".parquet") or path.exists():
        if config.data:
            raise BenchmarkError(f"--data is for named benchmarks; {config.name} is a file already")
        problems = _load_file(path, _fields(_PLAIN, config), path.stem)
    else:
        raise BenchmarkError(
            f"unknown benchmark {config.name!r}: choose one of {', '.join(BENCHMARKS)}, "
            "or give a .jsonl file with question and answer fields"
        )
    problems = _unique(problems, config.name)
    return problems[: config.limit] if config.limit else problems

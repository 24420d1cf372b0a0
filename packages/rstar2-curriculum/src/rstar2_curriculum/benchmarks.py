"""The benchmark registry and the one strict loader of evaluation problems.

`load_benchmark(BenchmarkConfig)` (rstar2-eval) turns a name or a path into `Problem`s;
`load_benchmark_file(path)` (rstar2-train's `eval.sources`) reads one file. Named benchmarks (the
paper's table 3) load with the `datasets` library where the machine is online; `data=FILE.jsonl`
loads a local copy instead. Any JSONL or Parquet file works with question and answer fields
(names configurable). Loading is strict, because a silently smaller benchmark is a wrong
number: a row without the needed fields, an empty file or two problems with one id is a
`BenchmarkError` (a `DataError`) whose message is one line that names the fix.

Not covered: cleaning or decontamination (evaluation data is taken as published).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rstar2_curriculum.config import BenchmarkConfig, FieldMap, HFSource
from rstar2_curriculum.load import LoadResult, load_hf, load_jsonl, load_parquet
from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import DataError

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkError", "load_benchmark", "load_benchmark_file"]


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
    """A named benchmark: where it lives on the hub and what its fields are called."""

    name: str
    title: str
    parts: tuple[HubPart, ...]
    fields: FieldMap


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "aime24",
            "AIME 2024 (I and II, 30 problems)",
            (HubPart("HuggingFaceH4/aime_2024", "train"),),
            FieldMap(question="problem", answer="answer", id="id"),
        ),
        Benchmark(
            "aime25",
            "AIME 2025 (I and II, 30 problems)",
            (
                HubPart("opencompass/AIME2025", "test", "AIME2025-I"),
                HubPart("opencompass/AIME2025", "test", "AIME2025-II"),
            ),
            FieldMap(question="question", answer="answer", id=None),
        ),
        Benchmark(
            "math500",
            "MATH-500 (500 problems)",
            (HubPart("HuggingFaceH4/MATH-500", "test"),),
            FieldMap(question="problem", answer="answer", id="unique_id"),
        ),
        Benchmark(
            "hmmt_feb25",
            "HMMT February 2025 (30 problems)",
            (HubPart("MathArena/hmmt_feb_2025", "train"),),
            FieldMap(question="problem", answer="answer", id="problem_idx"),
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


def _strict(result: LoadResult, where: str, path: Path | None, fields: FieldMap) -> list[Problem]:
    """The loaded problems, or a BenchmarkError when any row was unusable or none was there."""
    report = result.report
    if report.skipped:
        reason, count = max(report.skipped.items(), key=lambda kv: kv[1])
        at = ", ".join(report.examples.get(reason, [])[:3])
        hint = ""
        if reason.startswith(("missing_field:", "empty_field:")):
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


def _load_file(path: Path, fields: FieldMap, source: str) -> list[Problem]:
    if path.suffix not in (".jsonl", ".parquet"):
        raise BenchmarkError(
            f"{path}: expected a .jsonl file (one JSON object per line) or a .parquet file"
        )
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
        config = HFSource(
            path=part.path, name=part.name, split=part.split, fields=fields, source=source
        )
        try:
            result = load_hf(config)
        except ImportError as error:
            raise BenchmarkError(f"{bench.name} needs the datasets library ({error})") from None
        except DataError as error:
            reason = str(error).splitlines()[0][:160]
            raise BenchmarkError(
                f"cannot load {bench.name} from the Hugging Face hub ({reason}); offline, "
                f"pass a local copy: --data FILE.jsonl"
            ) from None
        problems += _strict(result, part.path, None, fields)
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
            problems = _load_file(Path(config.data), fields, bench.name)
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

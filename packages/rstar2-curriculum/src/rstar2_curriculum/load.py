"""Loaders: JSONL, Parquet and Hugging Face datasets into `Problem`s, with a report.

A bad row never stops a load: malformed JSON, text that is not UTF-8, a row that is not an
object, a missing or empty field, or a value of the wrong type is skipped and counted under a
reason in `LoadReport`, with the first few locations kept so a person can find them. A file that
cannot be opened raises `DataError` before any row is read, and so does a source none of whose
rows has the fields the mapping (or the `preset`, see presets.py) needs: the message names the
missing fields and the ones the rows have.

Parquet needs the `parquet` extra (pyarrow) and Hugging Face needs the `hf` extra (datasets);
both are imported only when used. A hub name works only where the machine is online; local
directories written by `save_to_disk` and local data files always work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rstar2_curriculum.config import (
    FieldMap,
    HFSource,
    JsonlSource,
    ParquetSource,
    SourceConfig,
    SyntheticSource,
)
from rstar2_curriculum.presets import missing_columns, preset_problem
from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import (  # DataError: re-exported, raised by every loader
    DataError,
    MissingExtraError,
    RowError,
    get_path,
    hf_rows,
    jsonl_rows,
    missing_fields_error,
    open_file,
    parquet_rows,
    text_at,
)
from rstar2_curriculum.synthetic import generate_problems

__all__ = [
    "DataError",
    "LoadReport",
    "LoadResult",
    "MissingExtraError",
    "load_hf",
    "load_jsonl",
    "load_parquet",
    "load_problems",
    "to_problem",
    "write_jsonl",
]

_EXAMPLES_PER_REASON = 5


class LoadReport(BaseModel):
    """What a load read, kept and skipped (reason -> count, and where)."""

    source: str = Field(description="The source label.")
    rows: int = Field(default=0, description="Rows (lines) seen, blank lines excluded.")
    loaded: int = Field(default=0, description="Rows that became Problems.")
    skipped: dict[str, int] = Field(default_factory=dict, description="Reason -> rows skipped.")
    examples: dict[str, list[str]] = Field(
        default_factory=dict, description="Reason -> the first few locations ('line 7')."
    )

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        seen = self.examples.setdefault(reason, [])
        if len(seen) < _EXAMPLES_PER_REASON:
            seen.append(where)

    def table(self) -> str:
        lines = [f"{self.source}: {self.rows} rows, {self.loaded} loaded"]
        for reason, count in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            where = ", ".join(self.examples.get(reason, []))
            lines.append(f"  skipped {count:>7}  {reason:<24} e.g. {where}")
        return "\n".join(lines)


@dataclass
class LoadResult:
    """Problems in file order, and the report of the load."""

    problems: list[Problem]
    report: LoadReport


def to_problem(row: Any, fields: FieldMap, source: str, index: int) -> Problem:
    """Map one row to a Problem; raises ValueError whose message is the skip reason."""
    if not isinstance(row, dict):
        raise RowError("not_an_object")
    question = text_at(row, fields.question, required=True)
    answer = text_at(row, fields.answer, required=True)
    ident = text_at(row, fields.id, required=False) if fields.id else None
    origin = (text_at(row, fields.source, required=False) if fields.source else None) or source
    metadata = {k: v for k in fields.metadata if (v := get_path(row, k)) is not None}
    if fields.metadata_object and isinstance(bag := get_path(row, fields.metadata_object), dict):
        metadata = {**bag, **metadata}
    assert question is not None and answer is not None
    return Problem(
        id=ident or f"{source}/{index}",
        question=question,
        answer=answer,
        source=origin,
        metadata=metadata,
    )


def _collect(
    rows: Iterable[tuple[str, Any]], fields: FieldMap, source: str, preset: str | None = None
) -> LoadResult:
    """Rows to Problems; a source none of whose rows has the needed fields is a DataError."""
    report = LoadReport(source=source)
    problems: list[Problem] = []
    first: Any = None
    for where, row in rows:
        report.rows += 1
        if isinstance(row, RowError):
            report.skip(str(row), where)
            continue
        if first is None:
            first = row
        try:
            if preset is None:
                problems.append(to_problem(row, fields, source, report.rows - 1))
            else:
                problems.append(preset_problem(preset, row, source, report.rows - 1))
        except RowError as error:
            report.skip(str(error), where)
    report.loaded = len(problems)
    if not problems and isinstance(first, dict):
        if preset is not None:
            if lacking := missing_columns(preset, first):
                raise missing_fields_error(f"{source} (preset {preset})", lacking, first)
        else:
            needed = [fields.question, fields.answer]
            lacking = [f for f in needed if get_path(first, f) is None]
            if lacking and any(r.startswith("missing_field:") for r in report.skipped):
                raise missing_fields_error(source, lacking, first)
    return LoadResult(problems, report)


def load_jsonl(
    path: str | Path, fields: FieldMap | None = None, source: str = "", preset: str | None = None
) -> LoadResult:
    """Read a JSONL file; bad lines are skipped and counted."""
    file = open_file(path)
    return _collect(jsonl_rows(file), fields or FieldMap(), source or file.stem, preset)


def load_parquet(
    path: str | Path, fields: FieldMap | None = None, source: str = "", preset: str | None = None
) -> LoadResult:
    """Read a Parquet file batch by batch (needs the `parquet` extra)."""
    rows = parquet_rows(path)
    return _collect(rows, fields or FieldMap(), source or Path(path).stem, preset)


def load_hf(config: HFSource) -> LoadResult:
    """Read a Hugging Face dataset: a save_to_disk directory, data files, or a hub name."""
    rows = hf_rows(
        config.path,
        config.split,
        name=config.name,
        data_files=config.data_files,
        cache_dir=config.cache_dir,
    )
    return _collect(rows, config.fields, config.source or Path(config.path).name, config.preset)


def load_problems(config: SourceConfig, seed: int = 0) -> LoadResult:
    """Load (or generate) the problems a source config names."""
    if isinstance(config, SyntheticSource):
        problems = generate_problems(
            config.n, seed, difficulty=config.difficulty, families=config.families or None
        )
        report = LoadReport(source="synthetic", rows=len(problems), loaded=len(problems))
        return LoadResult(problems, report)
    if isinstance(config, JsonlSource):
        return load_jsonl(config.path, config.fields, config.source, config.preset)
    if isinstance(config, ParquetSource):
        return load_parquet(config.path, config.fields, config.source, config.preset)
    return load_hf(config)


def write_jsonl(problems: Iterable[Problem], path: str | Path) -> int:
    """Write Problems as JSONL (the loader's default field names); returns the count."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(problem.model_dump_json() + "\n")
            count += 1
    return count

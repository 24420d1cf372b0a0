"""Rows from data on disk: JSONL, Parquet and Hugging Face datasets, and `DataError`.

`read_rows(path, kind)` yields `(where, row)` pairs (`where` is "line 7" or "row 7") for every
row of a file or dataset, whatever it will become (a `Problem`, an `SFTExample`). A line that is
not valid JSON or not UTF-8 is yielded as a `RowError` in place of the row, so the caller counts
it and goes on. Everything that stops a load before any row is read is a `DataError` whose
message is one line a person can act on: a missing file, a format that cannot be told, a split
that does not exist, a file that is not Parquet, and a missing extra (`MissingExtraError`, which
names the exact pip command). Parquet needs the `parquet` extra (pyarrow) and Hugging Face
datasets the `hf` extra (datasets); both are imported only when used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

FileKind = Literal["auto", "jsonl", "parquet", "hf"]

_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_HF_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


class DataError(Exception):
    """Data that cannot be read at all; the message is one actionable line."""


class MissingExtraError(DataError, ImportError):
    """An optional dependency is not installed; the message names the pip command."""


class RowError(ValueError):
    """One row is unusable; the message is the counted reason."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def is_hf_dir(path: Path) -> bool:
    """True for a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return path.is_dir() and any((path / marker).exists() for marker in _HF_MARKERS)


def detect_kind(path: str | Path) -> Literal["jsonl", "parquet", "hf"]:
    """The file kind of a path from its suffix, or a save_to_disk folder; else DataError."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"no such data file or folder: {p}")
    if p.is_dir():
        if is_hf_dir(p):
            return "hf"
        raise DataError(
            f"{p} is a folder but not a Hugging Face dataset saved with save_to_disk "
            "(no dataset_info.json or dataset_dict.json)"
        )
    kind = _SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise DataError(
            f"cannot tell the format of {p}: use a .jsonl or .parquet file, or a folder "
            "written by datasets' save_to_disk"
        )
    return kind  # type: ignore[return-value]


def open_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"no such data file: {p}")
    return p


def jsonl_rows(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Each non-blank line parsed; a bad line is yielded as a RowError."""
    file = open_file(path)

    def rows() -> Iterator[tuple[str, Any]]:
        with file.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                where = f"line {number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    yield where, RowError("not_utf8")
                    continue
                line = line.lstrip("\ufeff").strip()
                if not line:
                    continue
                try:
                    yield where, json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    yield where, RowError("malformed_json")

    return rows()


def parquet_rows(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Rows of a Parquet file, batch by batch (needs the `parquet` extra)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(
            'reading Parquet needs pyarrow: pip install "rstar2-curriculum[parquet]"'
        ) from None
    file = open_file(path)
    try:
        reader = pq.ParquetFile(file)
    except Exception as error:  # pyarrow raises several types for a bad file
        raise DataError(f"cannot read {file} as Parquet: {_first_line(error)}") from error

    def rows() -> Iterator[tuple[str, Any]]:
        number = 0
        for batch in reader.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row

    return rows()


def hf_rows(
    path: str,
    split: str = "train",
    *,
    name: str | None = None,
    data_files: tuple[str, ...] = (),
    cache_dir: str | None = None,
) -> Iterator[tuple[str, Any]]:
    """Rows of a Hugging Face dataset: a save_to_disk folder, data files, or a hub name."""
    try:
        import datasets
    except ImportError:
        raise MissingExtraError(
            'Hugging Face datasets need the hf extra: pip install "rstar2-curriculum[hf]"'
        ) from None
    folder = Path(path)
    try:
        if is_hf_dir(folder):
            loaded = datasets.load_from_disk(str(folder))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DataError(f"{folder} has splits {sorted(loaded)}, not {split!r}")
                loaded = loaded[split]
        else:
            loaded = datasets.load_dataset(
                path, name, split=split, data_files=list(data_files) or None, cache_dir=cache_dir
            )
    except DataError:
        raise
    except Exception as error:  # datasets raises many types: missing files, offline hub, ...
        raise DataError(f"cannot load dataset {path!r}: {_first_line(error)}") from error
    if not isinstance(loaded, datasets.Dataset):
        raise DataError(f"{path!r} is a {type(loaded).__name__}, not a Dataset")
    return ((f"row {i + 1}", row) for i, row in enumerate(loaded))


def read_rows(
    path: str | Path, kind: FileKind = "auto", split: str = "train"
) -> Iterator[tuple[str, Any]]:
    """Rows of a local file or folder; `kind="auto"` tells them apart by suffix."""
    chosen = detect_kind(path) if kind == "auto" else kind
    if chosen == "jsonl":
        return jsonl_rows(path)
    if chosen == "parquet":
        return parquet_rows(path)
    return hf_rows(str(path), split)


def missing_fields_error(label: str, fields: list[str], first_row: Any) -> DataError:
    """The DataError for a source none of whose rows has the fields a mapping needs."""
    seen = sorted(first_row) if isinstance(first_row, dict) else []
    have = ", ".join(seen[:12]) + (", ..." if len(seen) > 12 else "") if seen else "none"
    need = ", ".join(repr(f) for f in fields)
    return DataError(f"{label}: no row has the field(s) {need}; the rows have: {have}")


def get_path(row: Any, path: str) -> Any:
    """The value at a dotted path ('reward_model.ground_truth', 'prompt.-1.content') or None."""
    value = row
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and _is_index(part) and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _is_index(part: str) -> bool:
    return part.lstrip("-").isdigit() and part.count("-") <= 1


def text_at(row: Any, path: str, *, required: bool) -> str | None:
    """The text at a dotted path; numbers become text. Raises RowError with the reason."""
    value = get_path(row, path)
    if value is None:
        if required:
            raise RowError(f"missing_field:{path}")
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise RowError("not_utf8") from None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RowError(f"bad_type:{path}")
    text = str(value).strip()
    if required and not text:
        raise RowError(f"empty_field:{path}")
    return text

"""Reading a benchmark's published files from a local copy, with one-line errors.

The scorers load their benchmark from a path the user gives (`--data PATH`), since these machines
and many clusters cannot reach a hub. A missing or malformed file raises `ScorerDataError`, whose
message is one line that names the file and where to download it; the CLI prints it and exits 2.
Not covered: fetching anything (nothing here touches the network).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ScorerDataError(ValueError):
    """A benchmark file is missing or unreadable; the message is one actionable line."""


def read_jsonl(path: Path, *, what: str, download: str) -> list[dict[str, Any]]:
    """Every line of a JSONL file as a dict; `what`/`download` word the error for a user."""
    if not path.is_file():
        raise ScorerDataError(f"{what} not found at {path}: download {download}")
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ScorerDataError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ScorerDataError(f"{path}:{number}: expected a JSON object per line")
            rows.append(row)
    if not rows:
        raise ScorerDataError(f"{path} holds no records: download {download}")
    return rows


def require_fields(row: dict[str, Any], fields: tuple[str, ...], *, where: str) -> None:
    """One-line error naming the first field a record lacks."""
    for field in fields:
        if field not in row:
            raise ScorerDataError(f"{where}: record lacks the field {field!r}")

"""Suites: several benchmarks run as one command and shown as one table (`configs/suites/*.yaml`).

A suite is data, so a user writes their own: a title, the reported columns (models whose
published numbers are printed beside the run's, marked "reported"), and tables of rows, each a
benchmark by name with its label, its own `key=value` settings (applied after the benchmark's
protocol, before the command line's) and the reported numbers in percent:

```yaml
title: rStar2-Agent, Tables 3 and 5
reported: [rStar2-Agent-14B, SFT]
tables:
  - title: "Table 3: maths (pass@1, avg@16)"
    rows:
      - {benchmark: aime24, label: AIME24, reported: {rStar2-Agent-14B: 80.6, SFT: 3.33}}
```

`rstar2-eval run MODEL SUITE` runs each row as its own run directory, `OUT/<benchmark>` (so each
resumes alone), then writes `OUT/suite.json` (`SuiteResult`: every row's score, metric, n and
the reported numbers) and prints the table. `--data DIR` finds each benchmark's local copy in
DIR by its name (`aime24.parquet`, `gpqa_diamond.csv`, `livecodebench/`, ...); any that is
missing is a line naming what to download, before anything runs.
Not covered: running a benchmark (`evaluate.py`), drawing the table (`report.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rstar2_config import Recipes, validate
from rstar2_curriculum import BenchmarkError
from rstar2_evaluator import catalog
from rstar2_evaluator.config import CONFIG_DIR

SUITES = Recipes(CONFIG_DIR / "suites", noun="suite")
SUITE_FILE = "suite.json"
_SUFFIXES = ("", ".parquet", ".jsonl", ".csv", ".json")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SuiteRow(_Frozen):
    """One benchmark of a suite table."""

    benchmark: str = Field(description="A benchmark's name (`rstar2-eval benchmarks`).")
    label: str = Field(default="", description="Its column or row name; empty: the name.")
    overrides: list[str] = Field(
        default_factory=list, description="key=value settings for this benchmark."
    )
    reported: dict[str, float] = Field(
        default_factory=dict, description="Published numbers in percent, by reported column."
    )


class SuiteTable(_Frozen):
    title: str
    rows: list[SuiteRow]


class Suite(_Frozen):
    """Benchmarks run together and shown as the paper shows them."""

    title: str
    reported: list[str] = Field(default_factory=list, description="Reported columns, in order.")
    tables: list[SuiteTable]

    @property
    def rows(self) -> list[SuiteRow]:
        return [row for table in self.tables for row in table.rows]


class RowResult(_Frozen):
    benchmark: str
    label: str
    metric: str
    score: float = Field(description="In [0, 1].")
    n: int
    samples_per_problem: int
    run: str = Field(description="The row's run directory.")
    reported: dict[str, float]


class SuiteResult(_Frozen):
    """What `OUT/suite.json` holds."""

    suite: str
    title: str
    model: str
    reported: list[str]
    tables: list[tuple[str, list[RowResult]]]


def is_suite(name: str) -> bool:
    return name in SUITES.names() or name.endswith((".yaml", ".yml"))


def load_suite(name: str) -> Suite:
    """A suite by name (configs/suites/) or path; ConfigError (one line per mistake) or
    BenchmarkError (an unknown benchmark) otherwise."""
    tree, source = SUITES.read(name)
    suite = validate(Suite, tree, source)
    unknown = [r.benchmark for r in suite.rows if catalog.find(r.benchmark) is None]
    if unknown:
        raise BenchmarkError(
            f"suite {source}: unknown benchmark(s) {', '.join(unknown)}; "
            f"choose from {', '.join(catalog.CATALOG)}"
        )
    return suite


def local_copies(suite: Suite, folder: Path) -> dict[str, str]:
    """Each row's local copy in `folder`, found by the benchmark's name; BenchmarkError with a
    line per missing one, naming what to download."""
    found: dict[str, str] = {}
    missing: list[str] = []
    for row in suite.rows:
        name = row.benchmark
        path = next(
            (folder / f"{name}{s}" for s in _SUFFIXES if (folder / f"{name}{s}").exists()), None
        )
        if path is not None:
            found[name] = str(path)
        else:
            entry = catalog.CATALOG[name]
            missing.append(
                f"{name}: no copy in {folder}; download {entry.download} to {folder / name}.*"
            )
    if missing:
        raise BenchmarkError("\n".join(missing))
    return found


def row_result(row: SuiteRow, summary: Any, run: Path) -> RowResult:
    return RowResult(
        benchmark=row.benchmark,
        label=row.label or row.benchmark,
        metric=summary.metric,
        score=summary.score,
        n=summary.n,
        samples_per_problem=summary.samples_per_problem,
        run=str(run),
        reported=row.reported,
    )

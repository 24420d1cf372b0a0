"""From a `CurriculumConfig` to a ready `Curriculum`: load, clean, decontaminate, batch, report.

`prepare(config)` loads the training source (a file, a saved dataset, or a preset such as
`dapo` or `verl`, see presets.py) and every evaluation source, cleans the training problems
(integer answers when `clean.integer_answers`, unverifiable and compound answers, duplicates)
and removes those that share an n-gram with an evaluation problem: those of `eval_sources` and
any the caller passes (`eval_problems`, e.g. the trainer's benchmark files). It returns the
curriculum over the kept problems and a `PrepareReport` that is plain JSON
(`prepared.report.model_dump_json()`), for the run directory. It reads only what the config
names; a source that cannot be read raises `DataError` (one line) before anything is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from rstar2_curriculum.clean import CleanReport, clean
from rstar2_curriculum.config import CurriculumConfig
from rstar2_curriculum.curriculum import Curriculum
from rstar2_curriculum.load import LoadReport, load_problems
from rstar2_curriculum.problem import Problem


class Decontamination(BaseModel):
    """Training problems dropped for an n-gram shared with an evaluation problem."""

    ngram: int = Field(description="n of the overlap test; 0: off.")
    eval_problems: int = Field(description="Evaluation problems indexed.")
    hits: int = Field(description="Training problems dropped.")
    by_source: dict[str, int] = Field(description="Evaluation source -> training problems hit.")


class PrepareReport(BaseModel):
    """Everything `prepare` read, skipped, cleaned out and kept (JSON for the run directory)."""

    rows_read: int = Field(description="Rows of the training source.")
    loaded: int = Field(description="Rows that became problems.")
    skipped: dict[str, int] = Field(description="Load skips of the training source, by reason.")
    cleaned_out: dict[str, int] = Field(description="Cleaning drops by reason (not contamination).")
    decontamination: Decontamination = Field(description="The n-gram test against eval sets.")
    kept: int = Field(description="Problems the curriculum draws from.")
    train: LoadReport = Field(description="The training source's load report.")
    eval: list[LoadReport] = Field(description="Each evaluation source's load report.")
    clean: CleanReport = Field(description="Every cleaning drop with its reason.")


@dataclass
class Prepared:
    """A curriculum over the cleaned problems, and how they were obtained."""

    curriculum: Curriculum
    load_reports: list[LoadReport]  # the training source first, then each eval source
    clean_report: CleanReport
    report: PrepareReport
    problems: list[Problem]  # the kept training problems, in source order
    eval_problems: list[Problem]  # what the training set was decontaminated against

    def tables(self) -> str:
        """The load and clean reports as text tables."""
        return "\n".join([*(r.table() for r in self.load_reports), self.clean_report.table()])


def prepare(
    config: CurriculumConfig, *, seed: int | None = None, eval_problems: Sequence[Problem] = ()
) -> Prepared:
    """Load, clean, decontaminate and batch what `config` names (module docstring).

    `seed` (default `config.seed`) seeds the synthetic generator; `eval_problems` are further
    problems to decontaminate against, beside `config.eval_sources`.
    """
    seed = config.seed if seed is None else seed
    train = load_problems(config.source, seed=seed)
    evals = [load_problems(source, seed=seed) for source in config.eval_sources]
    against = [p for result in evals for p in result.problems] + list(eval_problems)
    cleaned = clean(train.problems, config.clean, against)
    curriculum = Curriculum.from_config(config, cleaned.problems)
    return Prepared(
        curriculum,
        [train.report, *(e.report for e in evals)],
        cleaned.report,
        _report(config, train.report, [e.report for e in evals], cleaned.report, against),
        cleaned.problems,
        against,
    )


def _report(
    config: CurriculumConfig,
    train: LoadReport,
    evals: list[LoadReport],
    cleaned: CleanReport,
    against: Sequence[Problem],
) -> PrepareReport:
    origin = {p.id: p.source or "eval" for p in against}
    by_source: dict[str, int] = {}
    for dropped in cleaned.dropped:
        if dropped.reason == "contaminated":
            label = origin.get(dropped.detail.split(": ", 1)[0], "eval")
            by_source[label] = by_source.get(label, 0) + 1
    ngram = config.clean.decontaminate_ngram
    return PrepareReport(
        rows_read=train.rows,
        loaded=train.loaded,
        skipped=dict(train.skipped),
        cleaned_out={k: v for k, v in cleaned.counts.items() if k != "contaminated"},
        decontamination=Decontamination(
            ngram=ngram,
            eval_problems=len(against),
            hits=cleaned.counts.get("contaminated", 0),
            by_source=by_source,
        ),
        kept=cleaned.kept,
        train=train,
        eval=evals,
        clean=cleaned,
    )

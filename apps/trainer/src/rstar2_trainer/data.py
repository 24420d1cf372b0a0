"""The run's data, read and checked before the run directory exists.

`load_run_data(config)` reads everything a run trains and evaluates on:

- the RL problems through rstar2-curriculum's `prepare()`: the source (a file, a saved dataset,
  a preset such as `dapo` or `verl`), cleaning (integer answers, ...) and decontamination
  against `curriculum.eval_sources` and the benchmark files of `eval.sources`;
- the SFT data of `sft.source` (`load_sft`: chat conversations with tool calls, or the source
  formats of the converters, mixed by weight), or, with no source, the curriculum's synthetic
  tool-call traces (the tiny recipe);
- the benchmarks of `eval.sources`, strictly (a smaller benchmark is a wrong number): a name
  from rstar2-curriculum's registry (from the hub), `NAME=PATH` (that benchmark from a local copy
  in its published format: GPQA-Diamond's CSV, a maths set's parquet), or a file of question and
  answer rows; multiple-choice problems keep their options (`evaluate.py` shuffles them).

Any problem with the data (a missing file, missing fields, a missing extra such as pyarrow) is
a `DataError` with one line that says what to fix, raised before anything is started or written.
`write_reports` puts what was read, skipped, cleaned out and decontaminated into the run
directory (`data_report.json`, `sft_report.json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rstar2_curriculum import (
    BENCHMARKS,
    BenchmarkConfig,
    DataError,
    Prepared,
    Problem,
    SFTExample,
    SFTReport,
    generate_problems,
    load_benchmark_file,
    load_sft,
    prepare,
    sft_traces,
)
from rstar2_rollout import derive_seed
from rstar2_trainer.config import TrainerConfig


@dataclass
class RunData:
    """What a run reads: RL problems (prepared), SFT examples, benchmarks by name."""

    prepared: Prepared
    sft: list[SFTExample] = field(default_factory=list)
    sft_report: SFTReport | None = None  # None: synthetic traces
    sft_problems: list[Problem] = field(default_factory=list)  # the synthetic traces' problems
    benchmarks: dict[str, list[Problem]] = field(default_factory=dict)


def benchmark_name(source: str) -> str:
    """The name a source of `eval.sources` is reported under."""
    name, sep, _ = source.partition("=")
    if sep or source in BENCHMARKS:
        return name
    return Path(source).stem


def load_benchmark(source: str) -> list[Problem]:
    """A benchmark of `eval.sources` (module docstring), read whole by the curriculum's strict
    loader (the one rstar2-eval uses); ids are prefixed with its name."""
    from rstar2_curriculum import load_benchmark as load_named

    name, sep, data = source.partition("=")
    try:
        if sep or source in BENCHMARKS:
            if name not in BENCHMARKS:
                raise DataError(
                    f"{name!r} is not a benchmark graded by answer (choose from "
                    f"{', '.join(BENCHMARKS)}); the others run in rstar2-eval"
                )
            problems = load_named(BenchmarkConfig(name=name, data=data or None))
        elif not Path(source).exists():
            raise DataError(f"{source} does not exist")
        else:
            problems = load_benchmark_file(source)
    except DataError as error:
        raise DataError(f"eval.sources: {error}") from None
    name = benchmark_name(source)
    return [p.model_copy(update={"id": f"{name}/{p.id}"}) for p in problems]


def load_run_data(config: TrainerConfig, *, resume: bool = False) -> RunData:
    """Read and check every data source of the run (module docstring); DataError on a problem.

    On resume the SFT data is not read again (SFT is over), nor for a run that starts from
    another run's checkpoint (`init`: no SFT)."""
    seed = config.run.seed
    names = [benchmark_name(p) for p in config.eval.sources]
    if len(set(names)) != len(names):
        raise DataError(f"eval.sources: two benchmark files share a name ({names}); rename one")
    benchmarks = {
        name: load_benchmark(p) for name, p in zip(names, config.eval.sources, strict=True)
    }
    against = [p for problems in benchmarks.values() for p in problems]
    prepared = prepare(config.curriculum, seed=seed, eval_problems=against)
    data = RunData(prepared, benchmarks=benchmarks)
    if not config.sft.enabled or resume or config.init is not None:
        return data
    if config.sft.source:
        loaded = load_sft(config.sft.source, seed=seed)
        data.sft, data.sft_report = loaded.examples, loaded.report
    else:
        data.sft_problems = generate_problems(
            config.sft.examples, seed=derive_seed(seed, "sft"), difficulty=config.sft.difficulty
        )
        data.sft = sft_traces(
            data.sft_problems,
            seed=seed,
            failure_rate=config.sft.failure_rate,
            check_failure_rate=config.sft.check_failure_rate,
            direct_share=config.sft.direct_share,
        )
    return data


def write_reports(data: RunData, run_dir: Path) -> None:
    """The data reports into the run directory (JSON)."""
    (run_dir / "data_report.json").write_text(data.prepared.report.model_dump_json(indent=2))
    if data.sft_report is not None:
        (run_dir / "sft_report.json").write_text(data.sft_report.model_dump_json(indent=2))
    sizes = {name: len(problems) for name, problems in data.benchmarks.items()}
    if sizes:
        (run_dir / "benchmarks.json").write_text(json.dumps(sizes, indent=2))

"""rstar2-curriculum: problems, cleaning, difficulty, the multi-stage plan, SFT data."""

from rstar2_curriculum.benchmarks import (
    BENCHMARKS,
    AnswerKind,
    Benchmark,
    BenchmarkError,
    load_benchmark,
    load_benchmark_file,
)
from rstar2_curriculum.choice import choice_variant, is_choice, render_choices
from rstar2_curriculum.clean import CleanReport, CleanResult, Dropped, clean, normalise_answer
from rstar2_curriculum.config import (
    BenchmarkConfig,
    CleanConfig,
    CurriculumConfig,
    DifficultyConfig,
    FieldMap,
    HFSource,
    JsonlSource,
    LabelCheckConfig,
    ParquetSource,
    PlateauTrigger,
    SFTSourceConfig,
    SFTSources,
    Stage,
    SyntheticSource,
    ThresholdTrigger,
    TinyPlanConfig,
)
from rstar2_curriculum.convert import ConvertReport, convert_rows, normalise_tool
from rstar2_curriculum.curriculum import Batch, Curriculum
from rstar2_curriculum.decontaminate import NgramIndex
from rstar2_curriculum.difficulty import DifficultyTracker
from rstar2_curriculum.labels import LabelCheckReport, keep_verified
from rstar2_curriculum.load import (
    DataError,
    LoadReport,
    LoadResult,
    load_hf,
    load_jsonl,
    load_parquet,
    load_problems,
    write_jsonl,
)
from rstar2_curriculum.plan import StagePlan, StageSwitch, StepMetrics
from rstar2_curriculum.prepare import Decontamination, Prepared, PrepareReport, prepare
from rstar2_curriculum.presets import strip_instructions
from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import MissingExtraError
from rstar2_curriculum.sft import (
    PYTHON_TOOL_NAME,
    Message,
    SFTExample,
    read_sft_jsonl,
    render_python_call,
    render_tool_call,
    write_sft_jsonl,
)
from rstar2_curriculum.sftdata import SFTLoadResult, SFTReport, SFTSourceReport, load_sft
from rstar2_curriculum.synthetic import FAMILIES, generate_problems
from rstar2_curriculum.traces import sft_traces

__all__ = [
    "BENCHMARKS",
    "FAMILIES",
    "PYTHON_TOOL_NAME",
    "AnswerKind",
    "Batch",
    "Benchmark",
    "BenchmarkConfig",
    "BenchmarkError",
    "CleanConfig",
    "CleanReport",
    "CleanResult",
    "ConvertReport",
    "Curriculum",
    "CurriculumConfig",
    "DataError",
    "Decontamination",
    "DifficultyConfig",
    "DifficultyTracker",
    "Dropped",
    "FieldMap",
    "HFSource",
    "JsonlSource",
    "LabelCheckConfig",
    "LabelCheckReport",
    "LoadReport",
    "LoadResult",
    "Message",
    "MissingExtraError",
    "NgramIndex",
    "ParquetSource",
    "PlateauTrigger",
    "PrepareReport",
    "Prepared",
    "Problem",
    "SFTExample",
    "SFTLoadResult",
    "SFTReport",
    "SFTSourceConfig",
    "SFTSourceReport",
    "SFTSources",
    "Stage",
    "StagePlan",
    "StageSwitch",
    "StepMetrics",
    "SyntheticSource",
    "ThresholdTrigger",
    "TinyPlanConfig",
    "choice_variant",
    "clean",
    "convert_rows",
    "generate_problems",
    "is_choice",
    "keep_verified",
    "load_benchmark",
    "load_benchmark_file",
    "load_hf",
    "load_jsonl",
    "load_parquet",
    "load_problems",
    "load_sft",
    "normalise_answer",
    "normalise_tool",
    "prepare",
    "read_sft_jsonl",
    "render_choices",
    "render_python_call",
    "render_tool_call",
    "sft_traces",
    "strip_instructions",
    "write_jsonl",
    "write_sft_jsonl",
]

"""rstar2-evaluator: the `rstar2-eval` app, benchmark evaluation with the code tool."""

from rstar2_curriculum import BENCHMARKS, BenchmarkError, load_benchmark
from rstar2_evaluator.compare import Comparison, compare_runs
from rstar2_evaluator.config import ConfigError, EvalConfig, load_config
from rstar2_evaluator.evaluate import EvalFailed, evaluate, run_evaluation
from rstar2_evaluator.metrics import Summary, majority_vote, pass_at_k, summarize
from rstar2_evaluator.record import SampleRecord
from rstar2_evaluator.store import RunError, RunStore, load_run

__all__ = [
    "BENCHMARKS",
    "BenchmarkError",
    "Comparison",
    "ConfigError",
    "EvalConfig",
    "EvalFailed",
    "RunError",
    "RunStore",
    "SampleRecord",
    "Summary",
    "compare_runs",
    "evaluate",
    "load_benchmark",
    "load_config",
    "load_run",
    "majority_vote",
    "pass_at_k",
    "run_evaluation",
    "summarize",
]

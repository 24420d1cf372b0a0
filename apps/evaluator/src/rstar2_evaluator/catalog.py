"""The benchmarks `rstar2-eval` runs: each one's kind, protocol, scorer and where its data is.

A benchmark's `kind` decides how it is sampled and scored:

| kind | sampled with | scored by |
|---|---|---|
| `math` | the paper's agent loop and format, the tool offered (`use_tool`) | rstar2-verify (`Scorer`) |
| `choice` | the same, options shuffled per sample (rstar2-curriculum's `choice_variant`) | rstar2-verify's choice kind (a letter) |
| `code` | the same; the program is the answer's first code block | `scorers.code` (every test in rstar2-sandbox) |
| `instruction`, `function_call`, `pairwise` | the model's own chat template, one turn (`chat.py`) | the benchmark's reference `Checker` in `scorers/` |

Its `protocol` is what it sets over the config file's (`--config paper|quick|FILE`): nothing for
the agent kinds (the paper's 5.1: T=0.6, 16 samples, 30 turns, 30K tokens, avg@16), one greedy
sample for the chat kinds (each benchmark's default template at temperature 0, as the paper runs
BFCL, IFEval and Arena-Hard). Settings on the command line win over both.

The answer-graded sets (maths, GPQA) are rstar2-curriculum's registry (`BENCHMARKS`: hub ids,
field names, downloads), which the trainer's `eval.sources` reads too; the rest are listed here.
Not covered: running anything (`evaluate.py`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rstar2_curriculum import BENCHMARKS, BenchmarkError

if TYPE_CHECKING:
    from rstar2_evaluator.config import EvalConfig
    from rstar2_evaluator.scorers import Checker
    from rstar2_sandbox import Sandbox

Kind = Literal["math", "choice", "code", "instruction", "function_call", "pairwise"]
CHAT_KINDS: frozenset[str] = frozenset({"instruction", "function_call", "pairwise"})
GREEDY: dict[str, Any] = {"samples": 1, "temperature": 0.0, "max_turns": 1, "pass_k": [1]}


@dataclass(frozen=True)
class EvalBenchmark:
    """A benchmark as rstar2-eval runs it."""

    name: str
    title: str
    kind: Kind
    scorer: str  # what scores it, and the package that provides the scorer
    download: str  # what to fetch for --data, and from where
    protocol: dict[str, Any] = field(default_factory=dict)  # over the config file's

    @property
    def agent(self) -> bool:
        """Sampled by the paper's agent loop (else by the model's chat template)."""
        return self.kind not in CHAT_KINDS


_VERIFY = "rstar2-verify (answer extraction and equivalence)"
CATALOG: dict[str, EvalBenchmark] = {
    **{
        name: EvalBenchmark(
            name,
            bench.title,
            bench.kind,
            _VERIFY if bench.kind == "math" else "rstar2-verify's choice kind (the letter)",
            bench.download,
        )
        for name, bench in BENCHMARKS.items()
    },
    "ifeval": EvalBenchmark(
        "ifeval",
        "IFEval (541 prompts; strict prompt-level accuracy)",
        "instruction",
        "IFEval's instruction registry as lm-eval ships it (scorers.ifeval)",
        "huggingface.co/datasets/google/IFEval: ifeval_input_data.jsonl",
        GREEDY,
    ),
    "bfcl_v3": EvalBenchmark(
        "bfcl_v3",
        "BFCL v3 (AST categories; overall accuracy)",
        "function_call",
        "bfcl-eval's AST checker (scorers.bfcl); its wheel carries the data",
        "the bfcl-eval wheel's data folder (BFCL_v3_*.json and possible_answer/)",
        GREEDY,
    ),
    "arena_hard": EvalBenchmark(
        "arena_hard",
        "Arena-Hard (500 prompts; judged win rate against the baseline)",
        "pairwise",
        "arena-hard-auto's pairwise judging and win rates (scorers.arena), judge.url/model",
        "github.com/lmarena/arena-hard-auto: question.jsonl and the baseline's model_answer",
        GREEDY,
    ),
    "livecodebench": EvalBenchmark(
        "livecodebench",
        "LiveCodeBench code generation (release_v6 or a date window; pass@1)",
        "code",
        "every test in rstar2-sandbox, LiveCodeBench's comparison (scorers.code)",
        "huggingface.co/datasets/livecodebench/code_generation_lite: test.jsonl ... test6.jsonl",
    ),
}

# The reference checkers, by benchmark: module and class (scorers/__init__.py's interface).
_CHECKERS = {
    "ifeval": ("rstar2_evaluator.scorers.checkers", "IFEvalChecker"),
    "bfcl_v3": ("rstar2_evaluator.scorers.checkers", "BFCLChecker"),
    "arena_hard": ("rstar2_evaluator.scorers.checkers", "ArenaChecker"),
}


def find(name: str) -> EvalBenchmark | None:
    """The benchmark of that name; None for a file (a maths benchmark of any JSONL/Parquet)."""
    return CATALOG.get(name)


def kind_of(name: str) -> Kind:
    entry = find(name)
    return entry.kind if entry is not None else "math"


def build_checker(config: EvalConfig, sandbox: Sandbox | None = None) -> Checker | None:
    """The reference checker of `config`'s benchmark; None for the answer-graded kinds."""
    name = config.benchmark.name
    if name == "livecodebench":
        from rstar2_evaluator.scorers.code import CodeChecker

        code = config.code
        return CodeChecker(
            sandbox,
            release=code.release,
            start_date=code.start_date,
            end_date=code.end_date,
            timeout_s=code.timeout_s,
            tests_at_once=code.tests_at_once,
        )
    if name not in _CHECKERS:
        return None
    module_name, class_name = _CHECKERS[name]
    if name == "arena_hard" and not (config.judge.url and config.judge.model):
        raise BenchmarkError(
            "arena_hard needs a judge: judge.url=https://HOST/v1 judge.model=NAME (its key from "
            f"${config.judge.api_key_env})"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise BenchmarkError(
            f"{name}: its reference checker ({module_name}) cannot be imported ({error})"
        ) from None
    checker_class = getattr(module, class_name)
    if name == "arena_hard":
        return checker_class(judge=config.judge, seed=config.seed, model=config.model_label())
    return checker_class()

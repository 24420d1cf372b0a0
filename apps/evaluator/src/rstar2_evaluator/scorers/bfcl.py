"""BFCL (Berkeley Function Calling Leaderboard) AST categories, scored by `bfcl-eval` itself.

Every verdict is the leaderboard runner's own per-entry check from bfcl-eval 2026.3.23:
`eval_runner._evaluate_single_ast_entry` (decode the model's calls with the handler, check the
decoded shape, then `ast_checker` against the possible answers) for the AST categories, and
`eval_runner._evaluate_single_relevance_entry` (does the output decode to a non-empty call?) for
irrelevance and live relevance. The handler is BFCL's `QwenFCHandler`, the one the leaderboard
runs for Qwen models in function-calling mode: `bfcl_prompt` is its `_format_prompt` (Qwen's
chat template with the tools in a system turn, `<tool_call>` JSON calls), and a response is
cleaned by its `_parse_query_response_prompting` (drops a `<think>` block) and decoded by its
`decode_ast`. The prompt's function documents get BFCL's language hints
(`add_language_specific_hint_to_function_doc`, as its inference step adds them); the checker sees
the documents as published, as its evaluation step loads them. The summaries use its leaderboard arithmetic
(`calculate_unweighted_accuracy` for non-live AST, `calculate_weighted_accuracy` for live AST).

Data: the JSON-lines files bfcl-eval's wheel carries (BFCL v4 names; the AST categories hold
the same entries as v3), or a folder the user gives with BFCL_v4_* or BFCL_v3_* files and their
`possible_answer/` folder. Temperature 0 is the issue's protocol (BFCL's own default is 0.001).

bfcl-eval's model registry (`constants/model_config.py`) imports every vendor SDK the leaderboard
can call (anthropic, cohere, google-genai, mistralai, boto3, qwen-agent); the evaluator installs
none of them. The checker reads one field from it, `underscore_to_dot` of the model being scored
(False for Qwen function-calling models: function names keep their dots), so before importing
bfcl-eval this module registers a stand-in `bfcl_eval.constants.model_config` holding that one
entry, unless the real registry is already imported. Not covered: the multi-turn, agentic,
memory, web-search and format-sensitivity categories (they need BFCL's executable backends).
"""

from __future__ import annotations

import copy
import functools
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_evaluator.scorers._data import ScorerDataError, require_fields

REGISTRY_NAME = "Qwen/Qwen3-14B-FC"
MODEL_NAME = REGISTRY_NAME.replace("/", "_")  # how bfcl-eval's runner names a model to the checker
AST_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES
_V3_STEMS = {"simple_python": "simple", "simple_java": "java", "simple_javascript": "javascript"}
BFCL_DOWNLOAD = (
    "the BFCL_v4_<category>.json files and possible_answer/ from bfcl-eval's data folder "
    "(pip download bfcl-eval, or gorilla/berkeley-function-call-leaderboard/bfcl_eval/data) "
    "and pass --data FOLDER"
)


@dataclass(frozen=True)
class BFCLProblem:
    """One BFCL entry as published: question turns, function documents, possible answers."""

    id: str
    category: str
    question: list[list[dict[str, Any]]]
    function: list[dict[str, Any]]
    ground_truth: list[dict[str, Any]] | None = field(default=None)


@dataclass(frozen=True)
class BFCLVerdict:
    """bfcl-eval's verdict on one response: valid, or the error type and messages it gave."""

    valid: bool
    error_type: str | None = None
    errors: tuple[str, ...] = ()


def bundled_data() -> Path:
    """The data folder inside the installed bfcl-eval wheel (used when no --data is given)."""
    import importlib.util

    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        raise ScorerDataError(
            f"bfcl-eval is not installed: install it, or download {BFCL_DOWNLOAD}"
        )
    return Path(spec.origin).parent / "data"


def load_bfcl(category: str, data: Path | None = None) -> list[BFCLProblem]:
    """The entries of one category, from `data` (a folder) or the wheel's own files."""
    if category not in CATEGORIES:
        raise ScorerDataError(f"unknown BFCL category {category!r}; one of {', '.join(CATEGORIES)}")
    folder = data if data is not None else bundled_data()
    prompt_file = _find(folder, category)
    entries = _load_file(prompt_file)
    for n, entry in enumerate(entries, 1):
        require_fields(entry, ("id", "question", "function"), where=f"{prompt_file}:{n}")
    answers: dict[str, list[dict[str, Any]]] = {}
    if category in AST_CATEGORIES:
        answer_file = prompt_file.parent / "possible_answer" / prompt_file.name
        if not answer_file.is_file():
            raise ScorerDataError(
                f"BFCL {category} possible answers not found at {answer_file}: download {BFCL_DOWNLOAD}"
            )
        rows = _load_file(answer_file)
        for n, row in enumerate(rows, 1):
            require_fields(row, ("id", "ground_truth"), where=f"{answer_file}:{n}")
        answers = {row["id"]: row["ground_truth"] for row in rows}
        missing = [e["id"] for e in entries if e["id"] not in answers]
        if missing:
            raise ScorerDataError(
                f"{answer_file} lacks answers for {len(missing)} ids, first {missing[0]}"
            )
    return [
        BFCLProblem(
            id=e["id"],
            category=category,
            question=e["question"],
            function=e["function"],
            ground_truth=answers.get(e["id"]),
        )
        for e in entries
    ]


def bfcl_prompt(problem: BFCLProblem) -> str:
    """BFCL's prompt for a Qwen function-calling model: the full chat-formatted text."""
    messages, tools = bfcl_messages(problem)
    return _handler()._format_prompt(messages, tools)


def bfcl_messages(problem: BFCLProblem) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first turn and the tools with BFCL's language hints, for a chat template."""
    entry = copy.deepcopy(_entry(problem))
    _utils().add_language_specific_hint_to_function_doc([entry])
    return entry["question"][0], entry["function"]


def score_bfcl(problem: BFCLProblem, response: str) -> BFCLVerdict:
    """bfcl-eval's per-entry verdict on the model's raw text output for this problem."""
    runner, handler = _runner(), _handler()
    from bfcl_eval.constants.enums import Language, ReturnFormat

    model_result = handler._parse_query_response_prompting(_completion(response))["model_responses"]
    if problem.category in RELEVANCE_CATEGORIES:
        out = runner._evaluate_single_relevance_entry(
            handler, problem.id, model_result, _entry(problem), MODEL_NAME, problem.category
        )
    else:
        language = {"simple_java": "JAVA", "simple_javascript": "JAVASCRIPT"}.get(
            problem.category, "PYTHON"
        )
        out = runner._evaluate_single_ast_entry(
            handler,
            problem.id,
            model_result,
            copy.deepcopy(problem.ground_truth),
            _entry(problem),
            MODEL_NAME,
            problem.category,
            language=Language[language],
            return_format=ReturnFormat[language],
            has_tool_call_tag=False,
        )
    return BFCLVerdict(
        valid=bool(out["valid"]),
        error_type=out.get("error_type"),
        errors=tuple(str(e) for e in out.get("error", [])),
    )


def summarize_bfcl(verdicts: dict[str, list[BFCLVerdict]]) -> dict[str, float]:
    """Accuracy per category, and BFCL's non-live and live AST summaries when all parts ran."""
    helper = _helper()
    scores = {
        cat: {
            "accuracy": sum(v.valid for v in vs) / len(vs),
            "total_count": len(vs),
            "display_accuracy": 0.0,
        }
        for cat, vs in verdicts.items()
        if vs
    }
    out = {cat: s["accuracy"] for cat, s in scores.items()}
    if {
        "simple_python",
        "simple_java",
        "simple_javascript",
        "multiple",
        "parallel",
        "parallel_multiple",
    } <= scores.keys():
        simple = helper.calculate_unweighted_accuracy(
            [scores["simple_python"], scores["simple_java"], scores["simple_javascript"]]
        )
        parts = [simple, scores["multiple"], scores["parallel"], scores["parallel_multiple"]]
        out["non_live_ast"] = helper.calculate_unweighted_accuracy(parts)["accuracy"]
    live = ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"]
    if set(live) <= scores.keys():
        out["live_ast"] = helper.calculate_weighted_accuracy([scores[c] for c in live])["accuracy"]
    return out


def _find(folder: Path, category: str) -> Path:
    names = [f"BFCL_v4_{category}.json", f"BFCL_v3_{_V3_STEMS.get(category, category)}.json"]
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ScorerDataError(
        f"BFCL {category} data not found in {folder} ({' or '.join(names)}): download {BFCL_DOWNLOAD}"
    )


def _load_file(path: Path) -> list[dict[str, Any]]:
    """bfcl-eval's own reader of its JSON-lines files, with a one-line error for bad input."""
    try:
        entries = _utils().load_file(path, use_lock=False)
    except ValueError as e:  # json.JSONDecodeError included
        raise ScorerDataError(f"{path}: not BFCL JSON lines ({e})") from None
    if not entries or not all(isinstance(e, dict) for e in entries):
        raise ScorerDataError(f"{path}: expected one JSON object per line")
    return entries


def _entry(problem: BFCLProblem) -> dict[str, Any]:
    return {"id": problem.id, "question": problem.question, "function": problem.function}


def _completion(text: str) -> types.SimpleNamespace:
    """The shape of an OpenAI completion that the handler's response parser reads."""
    usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
    return types.SimpleNamespace(choices=[types.SimpleNamespace(text=text)], usage=usage)


def _stand_in_registry() -> None:
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__dict__["MODEL_CONFIG_MAPPING"] = {
        REGISTRY_NAME: types.SimpleNamespace(model_name="Qwen/Qwen3-14B", underscore_to_dot=False)
    }
    sys.modules[name] = module


@functools.cache
def _runner() -> Any:
    """bfcl-eval's evaluation runner module, whose per-entry checks give every verdict."""
    _stand_in_registry()
    from bfcl_eval.eval_checker import eval_runner

    return eval_runner


@functools.cache
def _utils() -> Any:
    _stand_in_registry()
    from bfcl_eval import utils

    return utils


@functools.cache
def _helper() -> Any:
    _stand_in_registry()
    from bfcl_eval.eval_checker import eval_runner_helper

    return eval_runner_helper


@functools.cache
def _handler() -> Any:
    _stand_in_registry()
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler

    return QwenFCHandler("Qwen/Qwen3-14B", 0.0, REGISTRY_NAME, True)

"""Row mappings for the paper's RL sources and verl's parquet layout (`source.preset`).

A preset turns one raw row into a `Problem`, or raises `RowError` with the counted reason. The
column names were checked against the datasets' published schemas (see the package README for
where):

- `dapo`: BytedTsinghua-SIA/DAPO-Math-17k (verl layout: `prompt` is a chat list whose user
  message wraps the problem in DAPO's "Solve the following math problem step by step ... Answer:"
  instruction, `reward_model.ground_truth`, `data_source`, `extra_info.index`) and
  open-r1/DAPO-Math-17k-Processed (`prompt` is the bare problem text, `solution` the answer).
  DAPO's instruction is removed: the agent loop writes the paper's own.
- `openmathreasoning`: nvidia/OpenMathReasoning (`problem`, `expected_answer`, `problem_type`,
  `problem_source`, `pass_rate_72b_tir`). Only `problem_type == "has_answer_extracted"` rows are
  kept (others are proofs or have no answer: reason `problem_type:<value>`). The dataset holds
  many solutions per problem; cleaning's dedup keeps one row per problem.
- `project_euler`: Project Euler dumps such as alexandonian/project-euler (`id`, `problem`,
  `numerical_answer`, `title`, `diff_rate`); `answer` is read when `numerical_answer` is absent.
- `verl`: verl's RL parquet (`data_source`, `prompt` as a chat list, `ability`,
  `reward_model.ground_truth`, `extra_info`): the question is the last user message, with the
  instruction wrappers verl's own example scripts add (GSM8K's "Let's think step by step ...",
  MATH's "Let's think step by step and output the final answer within \\boxed{}.") and DAPO's
  removed; `id` is `<data_source>/<extra_info.index>` when there is an index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from rstar2_curriculum.problem import Problem
from rstar2_curriculum.rows import RowError, get_path, text_at

Preset = Literal["dapo", "openmathreasoning", "project_euler", "verl"]

# Instruction text that data preparation scripts wrap around a problem (prefix, suffix).
_WRAPPERS: tuple[tuple[str, str], ...] = (
    (  # DAPO-Math-17k
        "Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        "problem.",
        'Remember to put your answer on its own line after "Answer:".',
    ),
    ("", 'Let\'s think step by step and output the final answer after "####".'),  # verl GSM8K
    ("", "Let's think step by step and output the final answer within \\boxed{}."),  # verl MATH
    ("", "Please reason step by step, and put your final answer within \\boxed{}."),
)


def strip_instructions(text: str) -> str:
    """The problem without the known instruction wrappers around it."""
    out = text.strip()
    for prefix, suffix in _WRAPPERS:
        if prefix and out.startswith(prefix) and (not suffix or out.endswith(suffix)):
            out = out[len(prefix) : len(out) - len(suffix)].strip()
        elif not prefix and out.endswith(suffix):
            out = out[: len(out) - len(suffix)].strip()
    return out


def _chat_question(row: dict[str, Any], column: str = "prompt") -> str:
    prompt = row.get(column)
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise RowError(f"no_user_message:{column}")
        text = users[-1]["content"]
    elif prompt is None:
        raise RowError(f"missing_field:{column}")
    else:
        raise RowError(f"bad_type:{column}")
    question = strip_instructions(text)
    if not question:
        raise RowError(f"empty_field:{column}")
    return question


def _index_id(row: dict[str, Any], origin: str) -> str | None:
    index = get_path(row, "extra_info.index")
    if isinstance(index, bool) or not isinstance(index, int | str) or str(index) == "":
        return None
    return f"{origin}/{index}"


def _extra(row: dict[str, Any]) -> dict[str, Any]:
    extra = row.get("extra_info")
    return dict(extra) if isinstance(extra, dict) else {}


def _dapo(row: dict[str, Any], label: str, index: int) -> Problem:
    question = _chat_question(row)
    if isinstance(row.get("prompt"), str) and get_path(row, "solution") is not None:
        answer = text_at(row, "solution", required=True)
    else:
        answer = text_at(row, "reward_model.ground_truth", required=True)
    origin = text_at(row, "data_source", required=False) or label
    assert answer is not None
    ident = _index_id(row, "dapo") or f"{label}/{index}"
    return Problem(id=ident, question=question, answer=answer, source=origin, metadata=_extra(row))


def _verl(row: dict[str, Any], label: str, index: int) -> Problem:
    question = _chat_question(row)
    answer = text_at(row, "reward_model.ground_truth", required=True)
    origin = text_at(row, "data_source", required=False) or label
    assert answer is not None
    metadata = _extra(row)
    if isinstance(ability := row.get("ability"), str):
        metadata["ability"] = ability
    ident = _index_id(row, origin) or f"{label}/{index}"
    return Problem(id=ident, question=question, answer=answer, source=origin, metadata=metadata)


def _openmath(row: dict[str, Any], label: str, index: int) -> Problem:
    kind = row.get("problem_type")
    if kind is not None and kind != "has_answer_extracted":
        raise RowError(f"problem_type:{kind}")
    question = text_at(row, "problem", required=True)
    answer = text_at(row, "expected_answer", required=True)
    origin = text_at(row, "problem_source", required=False) or label
    assert question is not None and answer is not None
    keys = ("problem_type", "problem_source", "pass_rate_72b_tir")
    metadata = {k: row[k] for k in keys if row.get(k) is not None}
    return Problem(
        id=f"{label}/{index}", question=question, answer=answer, source=origin, metadata=metadata
    )


def _euler(row: dict[str, Any], label: str, index: int) -> Problem:
    question = text_at(row, "problem", required=False) or text_at(row, "question", required=False)
    if not question:
        raise RowError("missing_field:problem")
    column = "numerical_answer" if get_path(row, "numerical_answer") is not None else "answer"
    answer = text_at(row, column, required=True)
    number = text_at(row, "id", required=False)
    assert answer is not None
    ident = f"euler/{number}" if number else f"{label}/{index}"
    keys = ("title", "diff_rate", "solved_by")
    metadata = {k: row[k] for k in keys if row.get(k) is not None}
    return Problem(
        id=ident, question=question, answer=answer, source="project_euler", metadata=metadata
    )


PRESETS: dict[str, Callable[[dict[str, Any], str, int], Problem]] = {
    "dapo": _dapo,
    "openmathreasoning": _openmath,
    "project_euler": _euler,
    "verl": _verl,
}

# The columns a source must have for the preset to apply (any one of each group).
REQUIRED_COLUMNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "dapo": (("prompt",), ("reward_model", "solution")),
    "openmathreasoning": (("problem",), ("expected_answer",)),
    "project_euler": (("problem", "question"), ("numerical_answer", "answer")),
    "verl": (("prompt",), ("reward_model",)),
}


def preset_problem(preset: str, row: Any, label: str, index: int) -> Problem:
    """One row through a preset; RowError for a row it cannot use."""
    if not isinstance(row, dict):
        raise RowError("not_an_object")
    return PRESETS[preset](row, label, index)


def missing_columns(preset: str, row: Any) -> list[str]:
    """The required column groups a (first) row lacks, as 'a' or 'a|b'."""
    if not isinstance(row, dict):
        return []
    return ["|".join(g) for g in REQUIRED_COLUMNS[preset] if not any(c in row for c in g)]

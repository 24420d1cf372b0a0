"""The grader in the shapes other trainers call a reward function: verl and TRL. No torch.

- verl: `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`,
  the custom reward function its reward managers call with keyword arguments
  (`custom_reward_function.path=<this file>`, `custom_reward_function.name=compute_score`).
  Returns 1.0 when `solution_str` answers `ground_truth`, else 0.0; `ground_truth` may also be a
  list of accepted answers (any one counts). Extra keyword arguments (verl's `reward_kwargs`)
  are accepted and ignored.
- TRL: `trl_reward(answer_column="answer", config=None)` returns a `reward_funcs` callable
  `(completions, **dataset_columns) -> list[float]`; completions are plain strings or chat
  message lists (`[{"role": "assistant", "content": ...}]`, the assistant turns are graded);
  the gold answers are read from the dataset column `answer_column`. TRL's own keyword
  arguments (`prompts`, `completion_ids`, `trainer_state`, other columns) are ignored.
  `answer_reward` and `solution_reward` are ready-made for columns `answer` and `solution`.

Both never raise and are bounded in time: each grade is bounded by `VerifyConfig.timeout_s`
(`grader.py`), and a bad input (a missing column, a non-text completion, a length mismatch)
scores 0.0 and is logged once per kind. The whole response is graded (`extract_answer`'s
rules: the last box, an `<answer>` block, an answer line, ...).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rstar2_verify.config import VerifyConfig
from rstar2_verify.grader import shared_grader

__all__ = ["answer_reward", "compute_score", "solution_reward", "trl_reward"]

log = logging.getLogger(__name__)
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(kind: str, message: str) -> None:
    with _warned_lock:
        if kind in _warned:
            return
        _warned.add(kind)
    log.warning("rstar2-verify reward: %s (scored 0.0; logged once)", message)


def _golds(ground_truth: Any) -> list[Any]:
    if isinstance(ground_truth, list | tuple):
        return list(ground_truth)
    tolist = getattr(ground_truth, "tolist", None)  # a numpy array from a parquet column
    if callable(tolist) and not isinstance(ground_truth, str | bytes):
        value = tolist()
        return list(value) if isinstance(value, list) else [value]
    return [ground_truth]


def _score(response: Any, ground_truth: Any, config: VerifyConfig | None) -> float:
    grader = shared_grader(config)
    golds = _golds(ground_truth)
    if not golds:
        _warn_once("empty_gold", "an empty list of gold answers")
        return 0.0
    for gold in golds[:16]:
        grade = grader.grade(response, gold)
        if grade.correct:
            return 1.0
        if grade.reason in {"empty_gold", "error"} or grade.reason.startswith("error"):
            _warn_once(grade.reason, f"grade reason {grade.reason!r}")
    return 0.0


def compute_score(
    data_source: Any = None,
    solution_str: Any = None,
    ground_truth: Any = None,
    extra_info: Any = None,
    **kwargs: Any,
) -> float:
    """verl's custom reward function: 1.0 when `solution_str` answers `ground_truth`, else 0.0."""
    del data_source, extra_info, kwargs  # one grader for every data source
    try:
        if not isinstance(solution_str, str | bytes):
            _warn_once("solution_type", f"solution_str of type {type(solution_str).__name__}")
            return 0.0
        return _score(solution_str, ground_truth, None)
    except Exception as exc:  # a reward must never stop a training step
        _warn_once(f"exc:{type(exc).__name__}", f"{type(exc).__name__}: {exc}"[:300])
        return 0.0


def _completion_text(completion: Any) -> str | None:
    """A plain completion, or the assistant turns of a chat completion joined by newlines."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, Sequence):
        return None
    parts: list[str] = []
    for message in completion:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "\n".join(parts) if parts else None


def trl_reward(
    answer_column: str = "answer", config: VerifyConfig | None = None
) -> Callable[..., list[float]]:
    """A TRL `reward_funcs` entry grading completions against the dataset column `answer_column`."""

    def reward(completions: Any, **kwargs: Any) -> list[float]:
        try:
            n = len(completions)
        except Exception:
            _warn_once("completions_type", f"completions of type {type(completions).__name__}")
            return []
        try:
            golds = kwargs.get(answer_column)
            if golds is None:
                columns = sorted(k for k in kwargs if k not in {"prompts", "completion_ids"})
                _warn_once(
                    f"column:{answer_column}",
                    f"no dataset column {answer_column!r} (columns: {columns}); "
                    f"name it with trl_reward(answer_column=...)",
                )
                return [0.0] * n
            golds = list(golds)
            if len(golds) != n:
                _warn_once("length", f"{n} completions but {len(golds)} gold answers")
                return [0.0] * n
            texts = [_completion_text(c) for c in completions]
            if any(t is None for t in texts):
                _warn_once("completion_shape", "a completion that is neither text nor messages")
            grader = shared_grader(config)
            scores = [0.0] * n
            plain = [k for k in range(n) if texts[k] is not None and isinstance(golds[k], str)]
            grades = grader.grade_many((texts[k], golds[k]) for k in plain)
            for k, grade in zip(plain, grades, strict=True):
                scores[k] = 1.0 if grade.correct else 0.0
            for k in range(n):  # lists of accepted answers, numbers: one by one
                if texts[k] is not None and not isinstance(golds[k], str):
                    scores[k] = _score(texts[k], golds[k], config)
            return scores
        except Exception as exc:  # a reward must never stop a training step
            _warn_once(f"exc:{type(exc).__name__}", f"{type(exc).__name__}: {exc}"[:300])
            return [0.0] * n

    reward.__name__ = f"rstar2_verify_{answer_column}"  # TRL logs rewards under this name
    reward.__qualname__ = reward.__name__
    return reward


answer_reward = trl_reward("answer")
solution_reward = trl_reward("solution")

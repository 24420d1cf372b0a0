"""BFCL through our path gives bfcl-eval's own file runner's verdict on every response.

For the entries bfcl-eval's wheel ships, each category gets responses a model could write in
Qwen's `<tool_call>` format: the possible answer as a call, the same after a `<think>` block, a
wrong function name, an argument left out, an unknown argument, plain text and a broken call.
The expected verdicts come from bfcl-eval's leaderboard runner (`ast_file_runner` and
`relevance_file_runner`) on the same outputs, with the prompts and answers loaded by its own
`load_dataset_entry` / `load_ground_truth_entry`; the runner writes the failures to a score file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rstar2_evaluator.scorers import bfcl
from rstar2_evaluator.scorers._data import ScorerDataError


def _first(options: Any) -> Any:
    if not isinstance(options, list):
        return options
    return next((o for o in options if o != ""), None)


def _value(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _value(_first(o)) for k, o in v.items() if _first(o) is not None}
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v


def _calls(problem: bfcl.BFCLProblem) -> list[dict[str, Any]]:
    if problem.ground_truth is None:
        name = problem.function[0]["name"] if problem.function else "lookup"
        return [{"name": name, "arguments": {}}]
    calls = []
    for call in problem.ground_truth:
        ((name, params),) = call.items()
        args = {k: _value(_first(v)) for k, v in params.items() if _first(v) is not None}
        calls.append({"name": name, "arguments": args})
    return calls


def _text(calls: list[dict[str, Any]]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)


def _responses(problem: bfcl.BFCLProblem) -> list[str]:
    calls = _calls(problem)
    renamed = [dict(calls[0], name=calls[0]["name"] + "_v2"), *calls[1:]]
    args = dict(calls[0]["arguments"])
    dropped = [dict(calls[0], arguments=dict(list(args.items())[1:])), *calls[1:]]
    extra = [dict(calls[0], arguments=args | {"unexpected_arg": 1}), *calls[1:]]
    return [
        _text(calls),
        "<think>\nThe user wants a call.\n</think>\n\n" + _text(calls),
        _text(renamed),
        _text(dropped),
        _text(extra),
        "I cannot call a function for this.",
        "<tool_call>\n{name: broken}\n</tool_call>",
    ]


def _reference_verdicts(category: str, outputs: list[tuple[str, str]], tmp: Path) -> list[bool]:
    """bfcl-eval's file runner on (id, cleaned output) pairs; True where it found no error."""
    runner, utils, handler = bfcl._runner(), bfcl._utils(), bfcl._handler()
    prompts = {e["id"]: e for e in utils.load_dataset_entry(category, False, False)}
    ids = [i for i, _ in outputs]
    model_result = [{"id": f"{i}#{n}", "result": r} for n, (i, r) in enumerate(outputs)]
    prompt = [dict(prompts[i], id=f"{i}#{n}") for n, i in enumerate(ids)]
    if category in bfcl.RELEVANCE_CATEGORIES:
        runner.relevance_file_runner(handler, model_result, prompt, bfcl.MODEL_NAME, category, tmp)
    else:
        answers = {e["id"]: e for e in utils.load_ground_truth_entry(category)}
        possible = [answers[i] for i in ids]
        runner.ast_file_runner(
            handler, model_result, prompt, possible, category, bfcl.MODEL_NAME, tmp
        )
    (score_file,) = tmp.rglob(f"*_{category}_score.json")
    rows = [json.loads(line) for line in score_file.read_text().splitlines()]
    failed = {row["id"] for row in rows[1:]}
    return [f"{i}#{n}" not in failed for n, i in enumerate(ids)]


def _check(category: str, limit: int | None, tmp: Path) -> None:
    problems = bfcl.load_bfcl(category)[:limit]
    ours, outputs = [], []
    for problem in problems:
        for response in _responses(problem):
            ours.append(bfcl.score_bfcl(problem, response).valid)
            cleaned = response.split("</think>")[-1].lstrip("\n")  # BFCL's parser keeps this
            outputs.append((problem.id, cleaned))
    reference = _reference_verdicts(category, outputs, tmp)
    assert ours == reference
    assert any(ours) and not all(ours)


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_verdicts_equal_bfcls_runner(category: str, tmp_path: Path) -> None:
    _check(category, 12, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_verdicts_equal_bfcls_runner_on_every_entry(category: str, tmp_path: Path) -> None:
    _check(category, None, tmp_path)


def test_prompt_is_bfcls_qwen_template_with_its_hints() -> None:
    (problem,) = bfcl.load_bfcl("simple_java")[:1]
    prompt = bfcl.bfcl_prompt(problem)
    assert prompt.startswith("<|im_start|>system\n# Tools\n")
    assert "Note that the provided function is in Java 8 SDK syntax." in prompt
    assert prompt.endswith(
        problem.question[0][-1]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        "Java 8 SDK" not in problem.function[0]["description"]
    )  # the checker sees them as published


def test_summary_is_bfcls_leaderboard_arithmetic() -> None:
    ok, bad = bfcl.BFCLVerdict(True), bfcl.BFCLVerdict(False)
    parts = {
        "simple_python": [ok, ok],
        "simple_java": [ok, bad],
        "simple_javascript": [bad, bad],
        "multiple": [ok],
        "parallel": [bad],
        "parallel_multiple": [ok, bad, bad, bad],
        "live_simple": [ok, ok, ok],
        "live_multiple": [bad],
        "live_parallel": [ok],
        "live_parallel_multiple": [bad, bad, bad, bad, bad],
    }
    summary = bfcl.summarize_bfcl(parts)
    simple = (1.0 + 0.5 + 0.0) / 3
    assert summary["non_live_ast"] == pytest.approx((simple + 1.0 + 0.0 + 0.25) / 4)
    assert summary["live_ast"] == pytest.approx(4 / 10)
    assert "live_ast" not in bfcl.summarize_bfcl({"live_simple": [ok]})


def test_loader_reads_v3_names_and_names_what_to_download(tmp_path: Path) -> None:
    src = bfcl.bundled_data()
    (tmp_path / "possible_answer").mkdir()
    lines = (src / "BFCL_v4_simple_python.json").read_text().splitlines()[:3]
    answers = (src / "possible_answer" / "BFCL_v4_simple_python.json").read_text().splitlines()[:3]
    (tmp_path / "BFCL_v3_simple.json").write_text("\n".join(lines) + "\n")
    (tmp_path / "possible_answer" / "BFCL_v3_simple.json").write_text("\n".join(answers) + "\n")
    problems = bfcl.load_bfcl("simple_python", tmp_path)
    assert [p.id for p in problems] == [json.loads(x)["id"] for x in lines]
    assert bfcl.score_bfcl(problems[0], _text(_calls(problems[0]))).valid
    with pytest.raises(ScorerDataError, match=r"BFCL_v4_multiple\.json or BFCL_v3_multiple\.json"):
        bfcl.load_bfcl("multiple", tmp_path)
    (tmp_path / "possible_answer" / "BFCL_v3_simple.json").unlink()
    with pytest.raises(ScorerDataError, match="possible answers not found"):
        bfcl.load_bfcl("simple_python", tmp_path)
    with pytest.raises(ScorerDataError, match="unknown BFCL category"):
        bfcl.load_bfcl("multi_turn_base", tmp_path)

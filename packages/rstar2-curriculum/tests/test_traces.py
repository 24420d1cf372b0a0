import json
import re
import subprocess
import sys

import pytest

from rstar2_curriculum import (
    PYTHON_TOOL_NAME,
    Problem,
    SFTExample,
    generate_problems,
    read_sft_jsonl,
    sft_traces,
    write_sft_jsonl,
)

CALL = re.compile(r"^<reason>[^<]+</reason>\n<tool_call>(\{.*\})</tool_call>$", re.DOTALL)
FINAL = re.compile(r"^<reason>[^<]+</reason>\n<answer>[^<]*\\boxed\{(-?\d+)\}[^<]*</answer>$")


@pytest.fixture(scope="module")
def traced():
    problems = generate_problems(36, seed=4)
    return problems, sft_traces(problems, seed=9, failure_rate=0.4)


def _payload(text: str) -> dict:
    match = CALL.match(text)
    assert match, text
    return json.loads(match.group(1))


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def test_traces_have_the_papers_format_and_the_right_answer(traced):
    problems, examples = traced
    assert len(examples) == len(problems)
    for problem, example in zip(problems, examples, strict=True):
        roles = [m.role for m in example.messages]
        assert roles in (
            ["user", "assistant", "tool", "assistant"],
            ["user", "assistant", "tool", "assistant", "tool", "assistant"],
        )
        assert example.tools is None  # the default python tool
        assert example.messages[0].content == problem.question
        for call in example.messages[1:-1:2]:
            payload = _payload(call.content)
            assert payload["name"] == PYTHON_TOOL_NAME
            assert set(payload["arguments"]) == {"code", "input"}
        final = FINAL.match(example.messages[-1].content)
        assert final and final.group(1) == problem.answer
        assert [m.trainable for m in example.messages] == [
            m.role == "assistant" for m in example.messages
        ]
        # short enough for a tiny model: ~4 characters a token
        assert sum(len(m.content) for m in example.messages) < 1400


def test_tool_messages_are_what_the_code_really_prints(traced):
    _, examples = traced
    pairs = []
    for example in examples:
        for call, tool in zip(example.messages[1::2], example.messages[2::2], strict=False):
            payload = _payload(call.content)
            pairs.append((payload["arguments"]["code"], tool.content))
    assert len(pairs) > len(examples)
    assert [_python(code) for code, _ in pairs] == [content for _, content in pairs]


def test_some_traces_fail_first_and_recover(traced):
    _, examples = traced
    failing = [e for e in examples if len(e.messages) == 6]
    assert 5 <= len(failing) <= 25
    kinds = set()
    for e in failing:
        error = e.messages[2].content
        assert "Error" in error
        kinds.add(error.strip().splitlines()[-1].split(":")[0])
        code = _payload(e.messages[1].content)["arguments"]["code"]
        assert _python(code) == error
    assert {"NameError", "SyntaxError"} <= kinds


def test_traces_are_seeded_and_round_trip_through_jsonl(traced, tmp_path):
    problems, examples = traced
    assert sft_traces(problems[:6], seed=9, failure_rate=0.4) == examples[:6]
    assert sft_traces(problems[:6], seed=10, failure_rate=0.4) != examples[:6]
    write_sft_jsonl(examples, tmp_path / "sft.jsonl")
    assert list(read_sft_jsonl(tmp_path / "sft.jsonl")) == examples


def test_problems_without_a_solution_are_refused():
    with pytest.raises(ValueError, match="no reference solution"):
        sft_traces([Problem(id="x", question="Q?", answer="1")], seed=0)
    with pytest.raises(ValueError, match="failure_rate"):
        sft_traces([], seed=0, failure_rate=2.0)
    with pytest.raises(ValueError, match="direct_share"):
        sft_traces([], seed=0, direct_share=-0.1)


def test_a_direct_share_of_traces_answers_without_the_tool(traced):
    problems, with_tool = traced
    mixed = sft_traces(problems, seed=9, failure_rate=0.4, direct_share=0.5)
    direct = [e for e in mixed if len(e.messages) == 2]
    by_id = {p.id: p for p in problems}
    short = [p for p in problems if len(p.answer) <= 3]
    assert 0.2 * len(short) <= len(direct) <= 0.8 * len(short)  # half of them expected
    assert all(len(by_id[e.id].answer) <= 3 for e in direct)  # long answers keep the tool
    for example in direct:
        user, answer = example.messages
        assert user.content == by_id[example.id].question
        final = FINAL.match(answer.content)
        assert final and final.group(1) == by_id[example.id].answer
        assert "<tool_call>" not in answer.content
    # the others are the very traces a run without direct answers makes
    kept = {e.id: e for e in with_tool}
    assert all(e == kept[e.id] for e in mixed if len(e.messages) > 2)
    assert sft_traces(problems, seed=9, failure_rate=0.4, direct_share=0.0) == with_tool
    everything = sft_traces(problems, seed=1, direct_share=1.0, direct_max_digits=99)
    assert all(len(e.messages) == 2 for e in everything)


def test_a_wrong_reference_answer_can_never_become_a_trace():
    (p,) = generate_problems(1, seed=0)
    wrong = p.model_copy(update={"answer": str(int(p.answer) + 1)})
    with pytest.raises(RuntimeError, match="expected"):
        sft_traces([wrong], seed=0)


def test_examples_validate_as_sft_examples(traced):
    _, examples = traced
    for e in examples:
        assert SFTExample.model_validate_json(e.model_dump_json()) == e


def test_failure_rate_sets_the_share_of_traces_that_fail_first_and_recover():
    problems = generate_problems(40, seed=5)

    def failing(rate: float) -> int:
        traces = sft_traces(problems, seed=3, failure_rate=rate)
        return sum(1 for ex in traces if len(ex.messages) == 6)  # call, error, fixed call

    assert failing(0.0) == 0
    assert failing(1.0) == len(problems)
    assert 0.3 * len(problems) < failing(0.6) < 0.9 * len(problems)


def test_a_check_failure_share_fails_a_second_call_and_answers_anyway(traced):
    problems, plain = traced
    checked = sft_traces(problems, seed=9, failure_rate=0.4, check_failure_rate=0.5)
    by_id = {p.id: p for p in problems}
    with_check = [e for e in checked if any("NameError" in m.content for m in e.messages[-2:-1])]
    assert 0.2 * len(problems) <= len(with_check) <= 0.8 * len(problems)
    for e in with_check:
        problem = by_id[e.id]
        call, error, final = e.messages[-3:]
        code = _payload(call.content)["arguments"]["code"]
        assert code == f"print({problem.metadata['var']} == {problem.answer})"
        assert _python(code) == error.content  # what the code really prints
        answer = FINAL.match(final.content)
        assert answer and answer.group(1) == problem.answer
        # the trace before the check is the one a run without checks makes
        before = next(p for p in plain if p.id == e.id)
        assert e.messages[: len(before.messages) - 1] == before.messages[:-1]
    # a rate of 0 changes nothing, and the rate is checked
    assert sft_traces(problems, seed=9, failure_rate=0.4, check_failure_rate=0.0) == plain
    with pytest.raises(ValueError, match="check_failure_rate"):
        sft_traces([], seed=0, check_failure_rate=1.5)

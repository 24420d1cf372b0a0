"""The paper's format, and SFT encoding equal to the agent loop's token stream."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from rstar2_rollout import (
    TOOL_NAME,
    ChatFormat,
    RolloutConfig,
    RolloutTask,
    encode_conversation,
    render_call,
    run_agent,
    system_prompt,
)
from rstar2_rollout.chat import PYTHON_TOOL


@dataclass
class Message:
    role: str
    content: str


def test_the_prompt_is_the_papers(tokenizer):
    fmt = ChatFormat(tokenizer)
    text = tokenizer.decode(fmt.prompt_ids("What is 2+2?"), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nA conversation between User and Assistant.")
    assert f"<tools>{json.dumps(PYTHON_TOOL)}</tools>" in text
    assert '"required": ["code", "input"]' in text and TOOL_NAME in text
    assert text.endswith(
        "<|im_start|>user\nYou must put your answer inside <answer> </answer> tags, i.e., "
        "<answer> answer here </answer>. And your final answer will be extracted automatically "
        "by the \\boxed{} tag. This is the problem: What is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<reason>"
    )
    assert system_prompt(()) == system_prompt().split("\n\n# Tools")[0]


CONVERSATION = [
    Message("user", "What is 6*7?"),
    Message("assistant", f"<reason> Let me compute. </reason>{render_call('print(6 * 7)')}"),
    Message("tool", "42\n"),
    Message("assistant", f"<reason> Check. </reason>{render_call('print(7 * 6)')}"),
    Message("tool", "42\n"),
    Message("assistant", "<reason> Both agree. </reason><answer> \\boxed{42} </answer>"),
]


def test_encoding_a_conversation_equals_the_loops_token_stream(
    runner, sandbox, tokenizer, scripted
):
    turns = [m.content.removeprefix("<reason>") for m in CONVERSATION if m.role == "assistant"]
    model = scripted(tokenizer, {"p": turns})
    problem = RolloutTask("p", "What is 6*7?")
    traj = runner.run(run_agent(model, sandbox, tokenizer, problem, RolloutConfig(temperature=0)))
    assert traj.finish_reason == "answered" and traj.tool_outcome_counts["ok"] == 2

    ids, mask = encode_conversation(tokenizer, CONVERSATION)
    assert ids == traj.prompt_ids + traj.response_ids
    assert mask == [0] * len(traj.prompt_ids) + traj.loss_mask

    as_dicts = [{"role": m.role, "content": m.content} for m in CONVERSATION]
    assert encode_conversation(tokenizer, as_dicts) == (ids, mask)


def test_masks_cover_exactly_the_assistant_bodies_and_their_im_end(tokenizer):
    ids, mask = encode_conversation(tokenizer, CONVERSATION)
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m], False)
    expected = "".join(
        m.content.removeprefix("<reason>") + "<|im_end|>"
        for m in CONVERSATION
        if m.role == "assistant"
    )
    assert trained == expected


def test_a_system_message_and_no_tools(tokenizer):
    convo = [
        Message("system", "Be brief."),
        Message("user", "hi"),
        Message("assistant", "<reason>ok"),
    ]
    ids, _ = encode_conversation(tokenizer, convo, wrap_first_user=False)
    assert tokenizer.decode(ids, False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<reason>ok<|im_end|>"
    )
    ids, _ = encode_conversation(tokenizer, convo[1:], tools=[])
    assert "# Tools" not in tokenizer.decode(ids, False)


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([Message("user", "q"), Message("assistant", "no prefix")], "must start with <reason>"),
        ([Message("user", "q"), Message("system", "late")], "may only come first"),
        ([Message("robot", "q")], "unknown role 'robot'"),
        ([{"role": "user", "content": 3}], "content must be a string"),
    ],
)
def test_bad_conversations_are_refused_with_a_reason(tokenizer, messages, error):
    with pytest.raises((ValueError, TypeError), match=error):
        encode_conversation(tokenizer, messages)

"""The reward rule: which text is graded, truncation, and the one correctness threshold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from rstar2_verify import (
    CORRECT_THRESHOLD,
    grade,
    graded_text,
    is_correct,
    reward_of,
)


@dataclass(frozen=True)
class RewardConfig:
    """The two settings the rule reads (rstar2-rollout's pydantic model in the apps)."""

    graded: Literal["answer_block", "response"] = "answer_block"
    truncated: Literal["zero", "graded"] = "zero"


TRAINING = RewardConfig()
FREE_FORM = RewardConfig(graded="response", truncated="graded")
BOXED_IN_REASONING = "So the result is \\boxed{12}. Let me stop here."


def test_training_grades_only_the_answer_block():
    assert graded_text(TRAINING, response=BOXED_IN_REASONING, final_answer=None) == ""
    text = graded_text(TRAINING, response=BOXED_IN_REASONING, final_answer="\\boxed{12}")
    assert text == "<answer>\\boxed{12}</answer>" and grade(text, "12").correct


def test_free_form_grades_the_whole_response():
    text = graded_text(FREE_FORM, response=BOXED_IN_REASONING, final_answer=None)
    assert text == BOXED_IN_REASONING
    assert reward_of(grade(text, "12"), "no_tool_call", FREE_FORM) == 1.0


@pytest.mark.parametrize(
    ("config", "finish_reason", "want"),
    [
        (TRAINING, "answered", 1.0),
        (TRAINING, "max_length", 0.0),  # the paper: a truncated rollout earns nothing
        (RewardConfig(truncated="graded"), "max_length", 1.0),
        (TRAINING, "max_turns", 1.0),
    ],
)
def test_truncation_rule(config, finish_reason, want):
    right = grade("<answer>\\boxed{7}</answer>", "7")
    assert right.correct
    assert reward_of(right, finish_reason, config) == want


def test_wrong_or_ungraded_is_zero():
    assert reward_of(grade("<answer>\\boxed{8}</answer>", "7"), "answered", TRAINING) == 0.0
    assert reward_of(None, "answered", TRAINING) == 0.0


def test_one_threshold():
    assert CORRECT_THRESHOLD == 0.5
    assert is_correct(1.0) and not is_correct(0.0) and not is_correct(CORRECT_THRESHOLD)


def test_a_multi_turn_transcript_is_graded_on_its_last_answer():
    """The agent loop's decoded response holds several turns joined by template tokens; the
    stray-token rule must not cut it after the first turn."""
    transcript = (
        "I will compute it.\n<tool_call>{}</tool_call><|im_end|>\n<|im_start|>user\n"
        "<tool_response>\n41\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"
        "The tool gave 41.</reason>\n<answer>\\boxed{41}</answer><|im_end|>"
    )
    assert grade(transcript, "41").correct
    assert not grade(transcript, "42").correct
    assert grade("so the probability is $3/7$.<|im_end|>junk", "3/7").correct

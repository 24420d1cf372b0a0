"""rstar2-verify: answer extraction and equivalence, the reward of agentic maths RL."""

from rstar2_verify.choice import extract_choice, grade_choice
from rstar2_verify.config import VerifyConfig
from rstar2_verify.extract import Extraction, extract_answer
from rstar2_verify.grader import Grade, Grader, agrade, agrade_many, grade, grade_many
from rstar2_verify.reward import (
    CORRECT_THRESHOLD,
    RewardRule,
    graded_text,
    is_correct,
    reward_of,
)
from rstar2_verify.scorer import Scorer, Verifier

__all__ = [
    "CORRECT_THRESHOLD",
    "Extraction",
    "Grade",
    "Grader",
    "RewardRule",
    "Scorer",
    "Verifier",
    "VerifyConfig",
    "agrade",
    "agrade_many",
    "extract_answer",
    "extract_choice",
    "grade",
    "grade_choice",
    "grade_many",
    "graded_text",
    "is_correct",
    "reward_of",
]

"""Shared settings of the tests that run `rstar2-train` for real."""

import pytest

# A run small enough for a 2-core machine: a few SFT traces, tiny batches, a short evaluation.
TINY_RUN = [
    "sft.examples=24",
    "sft.epochs=1",
    "sft.batch_size=8",
    "eval.problems=4",
    "eval.max_response_tokens=96",
    "curriculum.batch_size=2",
    "curriculum.source.n=40",
    "algo.group_size=2",
]


@pytest.fixture
def tiny_run() -> list[str]:
    """`a.b=value` overrides that make the tiny recipe a seconds-long run."""
    return list(TINY_RUN)

"""The KV bound kv_progress admits on: hand-computed cases, and equal to stepping every future
step by brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_rollout.research.kvbound import peak_kv_tokens


def test_a_request_close_to_its_end_leaves_before_a_fresh_one_peaks() -> None:
    # A: 1,000 tokens in the cache, 100 to go. B: fresh, 1,000 to go. Summed worst cases: 2,100.
    # 100 steps on, A peaks at 1,100 while B holds 100 (1,200); then A is gone and B grows alone.
    assert peak_kv_tokens([(1_000, 100), (0, 1_000)]) == 1_200


def test_equal_ends_peak_at_the_sum_of_worst_cases() -> None:
    running = [(100, 500), (300, 500), (50, 500)]
    assert peak_kv_tokens(running) == sum(c + r for c, r in running) == 1_950


def test_pending_held_lag_and_blocks() -> None:
    assert peak_kv_tokens([], held=700) == 700
    # not started: grows at most a token a step from now, and may stay at its top for good
    assert peak_kv_tokens([(1_000, 100)], pending=[(0, 1_000)]) == 1_200
    assert peak_kv_tokens([(1_000, 100)], pending=[(0, 50)]) == 1_100 + 50
    # a lag of 10 steps: every curve is taken to grow 10 steps longer
    assert peak_kv_tokens([(1_000, 100)], pending=[(0, 1_000)], lag=10) == 1_110 + 110
    # blocks of 16 tokens: each request may waste 15
    assert peak_kv_tokens([(1_000, 100), (0, 1_000)], block=16) == 1_200 + 2 * 15
    # a request past its budget (remaining <= 0) holds its context now, then leaves
    assert peak_kv_tokens([(400, -5), (10, 20)]) == 400 + 10


def _stepped(running, pending, held, lag, block) -> int:
    """Every future step, one by one, until every running request is gone."""
    horizon = max([0] + [max(0, x) + lag for _, x in [*running, *pending]])
    return max(
        held
        + sum(c + s + block - 1 for c, r in running if max(0, r) + lag >= s)
        + sum(c + min(s, max(0, m) + lag) + block - 1 for c, m in pending)
        for s in range(horizon + 2)
    )


@settings(max_examples=300, deadline=None)
@given(
    running=st.lists(st.tuples(st.integers(0, 300), st.integers(-5, 300)), max_size=8),
    pending=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=3),
    held=st.integers(0, 500),
    lag=st.integers(0, 20),
    block=st.integers(1, 16),
)
def test_equals_the_maximum_over_every_future_step(running, pending, held, lag, block) -> None:
    peak = peak_kv_tokens(running, pending, held, lag, block)
    assert peak == _stepped(running, pending, held, lag, block)
    # never above what a scheduler that ignores progress would count
    everyone = [*running, *pending]
    assert peak <= held + sum(c + max(0, r) + lag + block - 1 for c, r in everyone)

"""What a step line and an evaluation report about a set of graded trajectories."""

import pytest

from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.stats import trajectory_stats


def _traj(reward: float, ok: int = 0, error: int = 0, reason: str = "answered") -> Trajectory:
    t = Trajectory(group_id="p", response_ids=[1] * (10 + ok + error), reward=reward)
    t.tool_outcome_counts = {"ok": ok, "error": error}
    t.finish_reason = reason  # type: ignore[assignment]
    return t


def test_tool_use_and_tool_error_ratios_by_sign():
    stats = trajectory_stats(
        [
            _traj(1.0, ok=2),  # correct with the tool
            _traj(1.0, ok=1, error=1),  # correct after a failed call
            _traj(0.0),  # answered straight away, wrong
            _traj(0.0, error=1, reason="max_turns"),
        ]
    )
    assert stats["reward"] == 0.5
    assert stats["tool_use_share"] == 0.75
    assert stats["tool_calls_mean"] == 5 / 4
    assert stats["tool_error_ratio_pos"] == pytest.approx(1 / 4)
    assert stats["tool_error_ratio_neg"] == 1.0
    assert stats["finish_answered"] == 0.75 and stats["finish_max_turns"] == 0.25


def test_no_tool_calls_means_no_error_ratio():
    stats = trajectory_stats([_traj(1.0), _traj(0.0)])
    assert stats["tool_use_share"] == 0.0
    assert stats["tool_error_ratio_pos"] is None
    assert trajectory_stats([]) == {"trajectories": 0}


def test_format_penalty_of_positives_is_rocs_p_format():
    once, twice, none = _traj(1.0, ok=1), _traj(1.0, ok=1), _traj(1.0)
    once.answer_blocks, once.turns = 1, 2  # one answer: 0
    twice.answer_blocks, twice.turns = 2, 2  # one extra answer over 2 turns: 0.5
    none.answer_blocks, none.turns = 0, 1  # no answer: 1
    stats = trajectory_stats([once, twice, none, _traj(0.0)])
    assert stats["format_penalty_pos"] == pytest.approx(0.5)
    assert trajectory_stats([_traj(0.0)])["format_penalty_pos"] is None

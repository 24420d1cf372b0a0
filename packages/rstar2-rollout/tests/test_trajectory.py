"""Trajectory bookkeeping, and the Protocol rstar2-algos consumes (declared here, not imported)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import pytest

from rstar2_rollout import ToolCallRecord, Trajectory, staleness_stats
from rstar2_rollout.trajectory import TOOL_OUTCOMES, outcome_of
from rstar2_sandbox import ExecutionStatus


@runtime_checkable
class ScoredTrajectory(Protocol):
    """What rstar2-algos reads of a trajectory (names as agreed in the issue)."""

    group_id: str
    reward: float
    response_ids: list[int]
    loss_mask: list[int]
    tool_outcome_counts: Mapping[str, int]
    answer_blocks: int
    turns: int


def _check(t: ScoredTrajectory) -> ScoredTrajectory:  # pyright checks the structural match
    return t


def test_satisfies_the_algos_protocol():
    traj = _check(Trajectory(group_id="p"))
    assert isinstance(traj, ScoredTrajectory)
    assert traj.reward == 0.0 and dict(traj.tool_outcome_counts) == dict.fromkeys(TOOL_OUTCOMES, 0)
    traj.reward = 1.0  # the trainer sets it from the grader


def test_append_keeps_ids_mask_and_logprobs_aligned():
    traj = Trajectory(group_id="p")
    traj.append([1, 2], sampled=True, logprobs=[-0.1, -0.2])
    traj.append([3], sampled=False, logprobs=[-9.0])  # not sampled: logprob is dropped
    traj.validate()
    assert (traj.response_ids, traj.loss_mask, traj.logprobs) == (
        [1, 2, 3],
        [1, 1, 0],
        [-0.1, -0.2, 0.0],
    )
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        traj.append([4, 5], sampled=True, logprobs=[-1.0])


def test_tokens_keep_the_weights_version_they_were_sampled_with():
    traj = Trajectory(group_id="p")
    assert traj.oldest_version is None
    traj.append([1, 2], sampled=True, logprobs=[-0.1, -0.2], version=4)
    traj.append([3], sampled=False, version=9)  # a tool response: no version
    traj.append([4], sampled=True, logprobs=[-0.3], version=5)
    traj.append([5], sampled=True, logprobs=[-0.4])  # an engine that cannot tell
    traj.validate()
    assert traj.versions == [4, 4, -1, 5, -1] and traj.oldest_version == 4


def _at(*versions: int | None) -> Trajectory:
    traj = Trajectory(group_id="p")
    traj.append([7], sampled=True, logprobs=[-1.0], version=versions[0])
    for v in versions[1:]:
        traj.append([8], sampled=True, logprobs=[-1.0], version=v)
    return traj


def test_staleness_is_the_trainers_version_minus_each_oldest():
    # oldest versions 5, 3 and 6 (its later tokens newer), one unknown; trainer at 6: ages 1, 3, 0
    batch = [_at(5), _at(3, 6), _at(6, 6), _at(None)]
    assert staleness_stats(batch, 6) == {
        "staleness_mean": pytest.approx(4 / 3),
        "staleness_max": 3.0,
        "staleness_unknown": 1.0,
        "turns_resumed": 1.0,  # _at(3, 6): one turn whose tokens carry two versions
    }
    synchronous = [_at(2), _at(2, 2)]
    assert staleness_stats(synchronous, 2) == {
        "staleness_mean": 0.0,
        "staleness_max": 0.0,
        "staleness_unknown": 0.0,
        "turns_resumed": 0.0,
    }
    assert staleness_stats([_at(None)], 2)["staleness_unknown"] == 1.0


def test_staleness_counts_policy_versions_when_a_push_repeats_the_weights():
    # pushes 1, 2, 3 carried policy versions 1, 1 (a checkpoint's push of the same weights), 2
    pushed = [0, 1, 1, 2]
    batch = [_at(1), _at(2), _at(3)]  # engine versions: all three sampled one update ago or less
    assert staleness_stats(batch, 2, pushed)["staleness_max"] == 1.0
    assert staleness_stats(batch, 3)["staleness_max"] == 2.0  # counted in pushes: looks staler
    assert staleness_stats([_at(9)], 2, pushed)["staleness_max"] == 0.0  # beyond: the newest


def test_a_turn_is_resumed_only_where_the_version_changes_inside_it():
    traj = Trajectory(group_id="p")
    traj.append([1, 2], sampled=True, logprobs=[-1.0, -1.0], version=4)
    traj.append([3], sampled=False)  # a tool response between turns
    traj.append([4], sampled=True, logprobs=[-1.0], version=5)  # next turn, new weights
    assert traj.resumed_turns == 0
    traj.append([5, 6], sampled=True, logprobs=[-1.0, -1.0], version=6)  # same turn, resumed
    traj.append([7], sampled=True, logprobs=[-1.0], version=None)  # unknown: not counted
    assert traj.resumed_turns == 1


def test_validate_catches_inconsistent_bookkeeping():
    traj = Trajectory(group_id="p", response_ids=[1], loss_mask=[0], logprobs=[-1.0])
    with pytest.raises(ValueError, match="1 ids, 1 mask, 1 logprobs, 0 versions"):
        traj.validate()
    traj.versions = [-1]
    with pytest.raises(ValueError, match=r"0\.0 where the mask is 0"):
        traj.validate()
    traj = Trajectory(group_id="p", response_ids=[1], loss_mask=[0], logprobs=[0.0], versions=[3])
    with pytest.raises(ValueError, match="versions must be -1 where the mask is 0"):
        traj.validate()
    traj = Trajectory(group_id="p")
    traj.record(ToolCallRecord(turn=0, name="t", code="", stdin="", outcome="timeout"))
    traj.validate()
    traj.tool_outcome_counts = {"ok": 1}
    with pytest.raises(ValueError, match="tool_outcome_counts"):
        traj.validate()


def test_every_sandbox_status_has_an_outcome():
    assert {s: outcome_of(s) for s in ExecutionStatus} == {
        ExecutionStatus.OK: "ok",
        ExecutionStatus.OUTPUT_TRUNCATED: "ok",
        ExecutionStatus.ERROR: "error",
        ExecutionStatus.MEMORY_EXCEEDED: "error",
        ExecutionStatus.REJECTED: "error",
        ExecutionStatus.TIMEOUT: "timeout",
        ExecutionStatus.SANDBOX_ERROR: "error",  # the loop ends such a trajectory as "error"
    }

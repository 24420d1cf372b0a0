"""Kept for `placement/cluster.py`'s import only: grading and the reward rule live in rstar2-verify.

`rstar2_verify.Verifier` (one async `grade_many` wherever grading runs) and
`rstar2_verify.Scorer` (the reward rule on a trajectory, the grader `rstar2_rollout.collect`
takes). New code imports them from `rstar2_verify`.
"""

from rstar2_verify import Scorer, Verifier

__all__ = ["Scorer", "Verifier"]

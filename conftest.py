"""Hypothesis profiles for every test of the workspace (pytest loads this for each package).

- `ci` (the default): derandomized, so each property test draws the same examples on every run
  and a submission fails only for what it changed; no example database, no deadline, and a
  failure prints the blob that reproduces it (`@reproduce_failure`). Each test keeps the
  `max_examples` its own `@settings` gives it (sized for its cost).
- `fuzz`: randomized, new examples every run, each test's `max_examples` times
  `HYPOTHESIS_FUZZ_FACTOR` (20), failures saved in `.hypothesis/`. For deliberate fuzzing:
  `HYPOTHESIS_PROFILE=fuzz uv run pytest packages/rstar2-rollout/tests/test_scheduler.py`.
  A failure it finds becomes an `@example(...)` on the test.

`HYPOTHESIS_PROFILE` picks the profile. A package installed alone without hypothesis skips this.
"""

from __future__ import annotations

import os

import pytest

try:
    from hypothesis import Verbosity, settings
except ImportError:  # an environment without hypothesis has no property tests
    settings = None

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ_FACTOR = int(os.environ.get("HYPOTHESIS_FUZZ_FACTOR", "20"))

if settings is not None:
    settings.register_profile(
        "ci", derandomize=True, database=None, deadline=None, print_blob=True, max_examples=100
    )
    settings.register_profile(
        "fuzz",
        derandomize=False,
        deadline=None,
        print_blob=True,
        max_examples=2_000,
        verbosity=Verbosity.normal,
    )
    settings.load_profile(PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `fuzz`, multiply each property test's own `max_examples` by the fuzz factor."""
    if settings is None or PROFILE != "fuzz":
        return
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and getattr(test, "_hypothesis_internal_settings_applied", False):
            test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                own, max_examples=own.max_examples * FUZZ_FACTOR
            )

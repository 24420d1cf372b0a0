"""The dependency graph is part of the design (ARCHITECTURE.md): pin it.

Three checks: every workspace edge a member's pyproject declares is in the agreed list; every
first-party module a member's source imports is one it declares; and the members that have no
tensors install no torch, read from the lock's transitive closure. Inside the trainer, its
layers (cli -> train -> placement -> training -> rundir -> config) are imported downwards only:
training and the run directory import nothing from the placement (where the weights go is the
placement's weight mover, which imports training, never the other way), and no trainer module
imports itself through others (an import anywhere in a file counts, inside functions too).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = tomllib.loads((REPO / "pyproject.toml").read_text())
MEMBERS = {
    tomllib.loads((REPO / m / "pyproject.toml").read_text())["project"]["name"]: REPO / m
    for m in ROOT["tool"]["uv"]["workspace"]["members"]
}

# The agreed edges (ARCHITECTURE.md), by distribution name. rstar2-config (pydantic and pyyaml) depends on
# no sibling; the apps and `rstar2-rollout serve` read their configs with it. The evaluator starts a sandbox server for
# the tool, so it may name rstar2-sandbox as well (ARCHITECTURE.md says why). The curriculum's
# label check (`verify-labels`) samples with the rollout package's engines and agent loop (on a
# sandbox) and grades with rstar2-verify: those edges exist only through its optional
# `label-check` extra (OPTIONAL_ONLY), so its base install stays pydantic-only and torch-free.
ALLOWED: dict[str, set[str]] = {
    "rstar2-proto": set(),
    "rstar2-config": set(),
    "rstar2-sandbox": {"rstar2-proto"},
    "rstar2-verify": {"rstar2-proto"},
    "rstar2-algos": set(),
    "rstar2-curriculum": {"rstar2-rollout", "rstar2-verify", "rstar2-sandbox"},
    "rstar2-rollout": {"rstar2-proto", "rstar2-sandbox", "rstar2-config"},
    "rstar2-trainer": {
        "rstar2-config",
        "rstar2-proto",
        "rstar2-sandbox",
        "rstar2-verify",
        "rstar2-rollout",
        "rstar2-algos",
        "rstar2-curriculum",
    },
    "rstar2-evaluator": {
        "rstar2-config",
        "rstar2-proto",
        "rstar2-sandbox",
        "rstar2-rollout",
        "rstar2-verify",
        "rstar2-curriculum",
    },
}
OPTIONAL_ONLY: dict[str, set[str]] = {
    "rstar2-curriculum": {"rstar2-rollout", "rstar2-verify", "rstar2-sandbox"},
}
NO_TORCH = [
    "rstar2-proto",
    "rstar2-config",
    "rstar2-sandbox",
    "rstar2-verify",
    "rstar2-curriculum",
    "rstar2-rollout",
]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared(member: str) -> set[str]:
    project = tomllib.loads((MEMBERS[member] / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_name(r) for r in reqs} & MEMBERS.keys()


def imported(member: str) -> set[str]:
    """First-party distributions imported anywhere in the member's shipped source."""
    found: set[str] = set()
    src = MEMBERS[member] / "src"
    files = src.rglob("*.py") if src.is_dir() else MEMBERS[member].glob("rstar2_proto/**/*.py")
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0].replace("_", "-")
                if top in MEMBERS:
                    found.add(top)
    found.discard(member)
    return found


def test_the_workspace_lists_every_member_explicitly():
    assert all("*" not in m for m in ROOT["tool"]["uv"]["workspace"]["members"])
    assert set(MEMBERS) == set(ALLOWED)


@pytest.mark.parametrize("member", sorted(ALLOWED))
def test_declared_edges_are_agreed(member):
    extra = declared(member) - ALLOWED[member]
    assert not extra, f"{member} declares {sorted(extra)}, not an agreed edge (ARCHITECTURE.md)"


@pytest.mark.parametrize("member", sorted(OPTIONAL_ONLY))
def test_optional_edges_stay_out_of_the_base_install(member):
    project = tomllib.loads((MEMBERS[member] / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project.get("dependencies", [])}
    assert not base & OPTIONAL_ONLY[member], (
        f"{member} needs {sorted(base & OPTIONAL_ONLY[member])}"
    )


@pytest.mark.parametrize("member", sorted(ALLOWED))
def test_imports_are_declared(member):
    undeclared = imported(member) - declared(member)
    assert not undeclared, f"{member} imports {sorted(undeclared)} without declaring it"


def test_no_package_imports_an_app():
    for member in MEMBERS:
        if not member.startswith("rstar2-") or "apps" in MEMBERS[member].parts:
            continue
        assert not imported(member) & {"rstar2-trainer", "rstar2-evaluator"}, member


def _closure(lock: dict, start: str) -> set[str]:
    """Packages `start` pulls in from the lock, through its dependencies (no extras, no groups)."""
    by_name = {p["name"]: p for p in lock["package"]}
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for dep in by_name[name].get("dependencies", []):
            todo.append(dep["name"])
            for extra in dep.get("extra", []):
                for edep in by_name[dep["name"]].get("optional-dependencies", {}).get(extra, []):
                    todo.append(edep["name"])
    return seen


@pytest.mark.parametrize("member", NO_TORCH)
def test_torch_free_members_pull_no_torch(member):
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    pulled = _closure(lock, member)
    assert "torch" not in pulled, f"{member} pulls torch"
    assert not any(p.startswith("nvidia-") for p in pulled)


def test_the_lock_holds_no_local_path():
    text = (REPO / "uv.lock").read_text()
    assert "file://" not in text and "/opt/" not in text and "/root/" not in text


TRAINER = REPO / "apps" / "trainer" / "src" / "rstar2_trainer"


def trainer_graph() -> dict[str, set[str]]:
    """Each rstar2_trainer module and the rstar2_trainer modules it imports (anywhere in it)."""
    modules: dict[str, Path] = {}
    for path in TRAINER.rglob("*.py"):
        parts = path.relative_to(TRAINER.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


# The trainer's layers, lowest first: a module imports only from its own layer or those below
# (cli -> train -> placement -> training -> rundir -> config). A module not named here sits in
# the top layer, with the app's entry points, unless it imports no rstar2_trainer module at all
# (a leaf such as `meter` or `stats`, usable from any layer).
LAYERS = ("config", "rundir", "training", "placement")
LOWEST = {"asyncsteps": "config"}  # a leaf the config composes


def _layer(module: str, graph: dict[str, set[str]]) -> int:
    part = module.split(".")[1] if "." in module else ""
    part = LOWEST.get(part, part)
    if part in LAYERS:
        return LAYERS.index(part)
    return -1 if not graph[module] else len(LAYERS)  # a leaf, or the top


def test_trainer_arrows_point_down_its_layers():
    graph = trainer_graph()
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(target, graph) > _layer(module, graph) and _layer(module, graph) >= 0
    )
    assert not upward, upward


def test_rundir_and_training_import_nothing_from_placement():
    graph = trainer_graph()
    found = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if module.startswith(("rstar2_trainer.training", "rstar2_trainer.rundir"))
        and target.startswith("rstar2_trainer.placement")
    )
    assert not found, found


def test_no_trainer_module_imports_itself_through_others():
    graph = trainer_graph()
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError(
                "import cycle: " + " -> ".join([*path[path.index(module) :], module])
            )
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)

"""bench/results/faults.json, committed from `uv run python bench/faults.py --json
bench/results/faults.json`: issue 41's contract, every fault injected into a real run and
survived with at most one step lost and no call misattributed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _fault_names() -> list[str]:
    """bench/faults.py's FAULTS, read from its source (importing it would start nothing, but
    needs the trainer's environment)."""
    tree = ast.parse((REPO / "bench" / "faults.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FAULTS":
            return list(ast.literal_eval(node.value))
    raise AssertionError("bench/faults.py has no FAULTS")


def test_every_fault_was_injected_and_survived():
    faults = json.loads((REPO / "bench" / "results" / "faults.json").read_text())["faults"]
    assert [f["name"] for f in faults] == _fault_names()
    assert len(faults) == 9
    for fault in faults:
        assert set(fault) == {"name", "survived", "steps_lost", "misattributed_calls", "recover_s"}
        assert fault["survived"] is True, fault
        assert 0 <= fault["steps_lost"] <= 1, fault
        assert fault["misattributed_calls"] == 0, fault
        assert isinstance(fault["recover_s"], float) and fault["recover_s"] >= 0, fault

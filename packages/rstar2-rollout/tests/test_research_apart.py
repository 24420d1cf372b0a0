"""The research code (simulator, engine model, losing policies) stays off the main surface;
every policy name still runs (tests/test_policies.py runs a batch under each)."""

from __future__ import annotations

import json
import subprocess
import sys

RESEARCH = "rstar2_rollout.research"


def test_import_rstar2_rollout_loads_no_research_module() -> None:
    code = "import json, sys, rstar2_rollout; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    assert "rstar2_rollout.scheduler" in loaded  # the probe sees the main surface
    assert [m for m in loaded if m.startswith(RESEARCH)] == []

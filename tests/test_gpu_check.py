"""`scripts/gpu_check.sh` on a machine without a GPU: one line that says so, exit status 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_says_one_line_and_exits_2_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the check would run for real")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 2
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == ["gpu_check: no CUDA or ROCm GPU is visible here; run it on a GPU machine"]
    assert not (tmp_path / "out").exists()  # nothing half-written

"""Fixtures of the repository-level tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/NAME.py imported as the module NAME, its siblings importable as when it runs."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def bench(request: pytest.FixtureRequest) -> ModuleType:
    """The bench script the test module names in its `BENCH` ("roc_vs_grpo": bench/roc_vs_grpo.py)."""
    return load_bench(request.module.BENCH)


@pytest.fixture(scope="session")
def bench_script():
    """`load_bench`, for a test that needs a second script."""
    return load_bench

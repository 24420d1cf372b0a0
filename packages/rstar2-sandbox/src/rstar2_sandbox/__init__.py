"""rstar2-sandbox: isolated, high-throughput execution of model-written Python.

The public names are imported on first use (PEP 562), not when the package is: every call is
forked from a zygote that starts as `python -m rstar2_sandbox._worker`, and a package import that
pulled in grpc, pydantic and httpx would put them in the warm image every call inherits and
tears down (more pages to copy at each fork for nothing a call needs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2_sandbox.backends import ChildSandbox, SandboxStartError, open_sandbox
    from rstar2_sandbox.client import SandboxClient, ServerInfo
    from rstar2_sandbox.config import (
        ChildSandboxConfig,
        FusionSandboxConfig,
        LocalSandboxConfig,
        RemoteSandboxConfig,
        SandboxBackendConfig,
        SandboxConfig,
        ServerConfig,
    )
    from rstar2_sandbox.execution import (
        ExecutionRequest,
        ExecutionResult,
        ExecutionStatus,
        Sandbox,
    )
    from rstar2_sandbox.fusion import FusionSandbox
    from rstar2_sandbox.local import LocalSandbox, RequestError, SandboxBusyError
    from rstar2_sandbox.server import SandboxServer

_HOMES = {
    "backends": ("ChildSandbox", "SandboxStartError", "open_sandbox"),
    "client": ("SandboxClient", "ServerInfo"),
    "config": (
        "ChildSandboxConfig",
        "FusionSandboxConfig",
        "LocalSandboxConfig",
        "RemoteSandboxConfig",
        "SandboxBackendConfig",
        "SandboxConfig",
        "ServerConfig",
    ),
    "execution": ("ExecutionRequest", "ExecutionResult", "ExecutionStatus", "Sandbox"),
    "fusion": ("FusionSandbox",),
    "local": ("LocalSandbox", "RequestError", "SandboxBusyError"),
    "server": ("SandboxServer",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "ChildSandbox",
    "ChildSandboxConfig",
    "ExecutionRequest",
    "ExecutionResult",
    "ExecutionStatus",
    "FusionSandbox",
    "FusionSandboxConfig",
    "LocalSandbox",
    "LocalSandboxConfig",
    "RemoteSandboxConfig",
    "RequestError",
    "Sandbox",
    "SandboxBackendConfig",
    "SandboxBusyError",
    "SandboxClient",
    "SandboxConfig",
    "SandboxServer",
    "SandboxStartError",
    "ServerConfig",
    "ServerInfo",
    "open_sandbox",
]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'rstar2_sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rstar2_sandbox.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

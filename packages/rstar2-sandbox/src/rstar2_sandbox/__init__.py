"""rstar2-sandbox: isolated, high-throughput execution of model-written Python."""

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
from rstar2_sandbox.execution import ExecutionRequest, ExecutionResult, ExecutionStatus, Sandbox
from rstar2_sandbox.fusion import FusionSandbox
from rstar2_sandbox.local import LocalSandbox, RequestError, SandboxBusyError
from rstar2_sandbox.server import SandboxServer

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

"""Configuration of the sandbox: the executor's limits and the server's shape.

One root model, `SandboxConfig`; defaults, bounds and a line of documentation per field live here
and only here. `ServerConfig` adds what only the gRPC server needs. `SandboxBackendConfig` says
where calls run (a discriminated union on `kind`): `local` (a pool in this process), `child` (a
`rstar2-sandbox serve` child on loopback that dies with this process), `remote` (servers at
addresses) or `fusion` (a SandboxFusion endpoint); `open_sandbox` in `backends` opens any of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_PRELOAD = (
    "math",
    "cmath",
    "itertools",
    "functools",
    "fractions",
    "decimal",
    "collections",
    "statistics",
    "random",
    "re",
    "heapq",
    "bisect",
    "numpy",
    "sympy",
)

# Run once in each worker after the imports, so that lazily built parts of sympy and numpy (solve,
# factor, simplify, linalg...) are warm in every forked call instead of rebuilt per call.
DEFAULT_WARMUP = """
import sympy, numpy
x = sympy.Symbol("x")
sympy.solve(x**2 - 5*x - 3, x); sympy.factor(x**12 - 1); sympy.expand((x + 1)**5)
sympy.simplify(sympy.sin(x)**2 + sympy.cos(x)**2); sympy.integrate(x * sympy.exp(x), x)
sympy.factorint(1234567); sympy.isprime(97); sympy.limit(sympy.sin(x) / x, x, 0)
sympy.series(sympy.exp(x), x, 0, 4); sympy.nsimplify(0.5); sympy.N(sympy.pi, 20)
sympy.Matrix([[1, 2], [3, 4]]).det(); sympy.diff(x**3, x); sympy.Rational(1, 3) + 1
numpy.linalg.matrix_rank(numpy.eye(3)); numpy.linalg.inv(numpy.eye(3)); numpy.linalg.eig(numpy.eye(3))
"""


class SandboxConfig(BaseModel):
    """Limits and pool size of a sandbox executor or server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: int = Field(default=2, gt=0, description="Warm worker processes that fork the calls.")
    default_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Time limit of one call: its CPU time, and its wall time less what it waited "
        "for a CPU (README, Results).",
    )
    max_timeout_s: float = Field(
        default=60.0, gt=0, description="Largest timeout a caller may ask."
    )
    memory_bytes: int = Field(
        default=1 << 30,
        gt=0,
        description="Address space one call may add (RLIMIT_AS headroom); callers may ask less.",
    )
    max_output_bytes: int = Field(
        default=16 * 1024,
        gt=0,
        description="Cap on each of stdout and stderr; callers may ask less.",
    )
    max_code_bytes: int = Field(default=1 << 20, gt=0, description="Largest accepted source.")
    max_stdin_bytes: int = Field(default=1 << 20, gt=0, description="Largest accepted stdin.")
    max_files_bytes: int = Field(
        default=16 << 20, gt=0, description="Largest total of a call's `files` (names and bytes)."
    )
    max_in_flight: int = Field(
        default=32,
        gt=0,
        description="Children running at once over all workers (a worker runs at most 1000).",
    )
    max_queue: int = Field(
        default=4096, ge=0, description="Calls waiting for a free slot; beyond it, refused."
    )
    max_sessions: int = Field(default=64, ge=0, description="Live stateful sessions at most.")
    session_idle_s: float = Field(
        default=600.0, gt=0, description="A session unused this long is closed."
    )
    file_size_bytes: int = Field(
        default=64 << 20, gt=0, description="Largest file a call may write (RLIMIT_FSIZE)."
    )
    open_files: int = Field(default=256, ge=16, description="Open descriptors (RLIMIT_NOFILE).")
    processes: int = Field(
        default=64, gt=0, description="RLIMIT_NPROC of the call's uid (when not root)."
    )
    tmpfs_bytes: int = Field(
        default=64 << 20, gt=0, description="Size of each call's private /tmp (its cwd)."
    )
    session_cpu_s: float = Field(
        default=120.0, gt=0, description="CPU seconds a session may use over all its cells."
    )
    wall_ceiling_factor: float = Field(
        default=30.0,
        ge=1,
        description="A call still running after this many times its limit in wall time, without "
        "having used its limit, is stopped as a sandbox_error (the host starved it).",
    )
    demote_after_s: float = Field(
        default=0.1,
        ge=0,
        description="A call that has used this much CPU, or half a core for this long, is "
        "reniced to 10 so short ones go first.",
    )
    demote_again_after_s: float = Field(
        default=0.5,
        ge=0,
        description="A call that has used this much CPU is reniced to 19, behind those that "
        "have used less.",
    )
    worker_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="cgroup v2 memory.max of one worker with its zygote, sessions and calls, "
        "where the host delegates cgroups; None: its share of max_in_flight x (memory_bytes + "
        "tmpfs_bytes) + 1 GiB.",
    )
    worker_pids: int | None = Field(
        default=None,
        gt=0,
        description="cgroup v2 pids.max (processes and threads) of one worker; None: 64 per call "
        "it may hold (its share of max_in_flight, plus max_sessions) + 16.",
    )
    uid_base: int = Field(
        default=61000,
        ge=1000,
        description="Calls run as uid uid_base + slot when the server runs as root.",
    )
    seccomp: bool = Field(
        default=True,
        description="Install the seccomp filter (off: calls may start processes; still no network).",
    )
    require_isolation: bool = Field(
        default=True,
        description="Refuse to start unless every confinement is active (False: weak isolation, "
        "with a warning in every Info).",
    )
    preload: tuple[str, ...] = Field(
        default=DEFAULT_PRELOAD, description="Modules each warm worker imports before forking."
    )
    warmup_code: str = Field(
        default=DEFAULT_WARMUP,
        description="Run once per worker after the imports (empty: none); failures are logged.",
    )
    profile: bool = Field(
        default=False,
        description="Bench only: stamp each call's phases (perf_counter_ns, CPU ns) in the "
        "child, zygote, worker and pool; `LocalSandbox.profiles` collects them.",
    )

    @property
    def calls_per_worker(self) -> int:
        """Calls one worker may run at once: calls go to the least busy worker."""
        return -(-self.max_in_flight // self.workers)

    def cgroup_limits(self) -> dict[str, int | None]:
        """The cgroup v2 limits of one worker (`_cgroup.WorkerCgroups`)."""
        memory = self.calls_per_worker * (self.memory_bytes + self.tmpfs_bytes) + (1 << 30)
        pids = 64 * (self.calls_per_worker + self.max_sessions) + 16
        return {
            "memory.max": self.worker_memory_bytes or memory,
            "pids.max": self.worker_pids or pids,
        }

    @model_validator(mode="after")
    def _timeouts_ordered(self) -> SandboxConfig:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        if self.calls_per_worker + self.max_sessions > 1000:
            raise ValueError(
                "max_in_flight / workers + max_sessions must be at most 1000 (uids per worker)"
            )
        return self


class ServerConfig(BaseModel):
    """The gRPC server around a sandbox executor."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address to bind; loopback by default.")
    port: int = Field(default=50051, ge=0, le=65535, description="Port; 0 picks a free one.")
    token: str | None = Field(
        default=None, description="Shared secret callers send as `authorization: Bearer ...`."
    )
    tls_cert_file: str | None = Field(default=None, description="PEM certificate chain for TLS.")
    tls_key_file: str | None = Field(default=None, description="PEM private key for TLS.")
    insecure: bool = Field(
        default=False, description="Allow a non-loopback host with no token (anyone may call)."
    )
    grace_s: float = Field(
        default=10.0, ge=0, description="Shutdown waits this long for in-flight calls."
    )
    max_batch: int = Field(default=4096, gt=0, description="Largest ExecuteBatch accepted.")
    http_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Also serve SandboxFusion's and code-judge's HTTP APIs here (0: a free port).",
    )
    http_max_body_bytes: int = Field(
        default=32 << 20, gt=0, description="Largest HTTP request body (413 beyond)."
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="The executor.")

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self


class LocalSandboxConfig(BaseModel):
    """Calls run in a warm pool inside this process (`LocalSandbox`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["local"] = "local"
    workers: int = Field(default=2, gt=0, description="Warm worker processes.")
    max_in_flight: int = Field(default=32, gt=0, description="Calls running at once.")
    allow_weak_isolation: bool = Field(
        default=False, description="Start even when a confinement is missing (with a warning)."
    )


class ChildSandboxConfig(BaseModel):
    """Calls run in a `rstar2-sandbox serve` child on 127.0.0.1 that dies with this process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["child"] = "child"
    workers: int = Field(default=2, gt=0, description="Warm worker processes of the child.")
    max_in_flight: int = Field(default=32, gt=0, description="Calls running at once.")
    allow_weak_isolation: bool = Field(
        default=False, description="Start even when a confinement is missing (with a warning)."
    )
    ready_timeout_s: float = Field(
        default=180.0, gt=0, description="How long the child may take to start serving."
    )


class RemoteSandboxConfig(BaseModel):
    """Calls go to running `rstar2-sandbox serve` servers (`SandboxClient`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["remote"] = "remote"
    addresses: list[str] = Field(min_length=1, description="host:port of each server.")
    token_file: Path | None = Field(
        default=None, description="File holding the servers' token (never put it in argv)."
    )
    tls_ca_file: Path | None = Field(
        default=None, description="PEM root certificates: connect with TLS, verified by these."
    )
    retry_after_s: float = Field(
        default=1.0, gt=0, description="A server that failed is set aside this long."
    )


class FusionSandboxConfig(BaseModel):
    """Calls go to a SandboxFusion-compatible HTTP endpoint (`FusionSandbox`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["fusion"] = "fusion"
    url: str = Field(description="Base URL; calls POST to {url}/run_code.")
    max_concurrency: int = Field(default=32, gt=0, description="Requests in flight at most.")


SandboxBackendConfig = Annotated[
    LocalSandboxConfig | ChildSandboxConfig | RemoteSandboxConfig | FusionSandboxConfig,
    Field(discriminator="kind"),
]

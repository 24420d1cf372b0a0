"""The placement sections of `TrainerConfig`: a Ray cluster (`cluster:`) and remote rollout
workers (`remote:`). Only the schemas, and `ClusterError`, the one-line refusal of a cluster
that cannot host the run; `cluster`, `ranks` and `remote` in this package act on them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_sandbox import SandboxConfig


class ClusterError(RuntimeError):
    """The cluster cannot host the run as configured; the message says what to change."""


class ClusterConfig(BaseModel):
    """Where the run's parts are placed on a Ray cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["ray"] = Field(default="ray", description="The cluster kind (only Ray).")
    address: str | None = Field(
        default=None, description="Ray address ('auto', 'host:6379'); None: start a local cluster."
    )
    num_cpus: int | None = Field(
        default=None, gt=0, description="CPUs of a local cluster (None: all); ignored when joining."
    )
    services_host: str | None = Field(
        default=None,
        description="IP the per-node servers bind to; None: each node's IP (127.0.0.1: one box).",
    )
    namespace: str = Field(default="rstar2", description="Ray namespace of the run's actors.")
    engines_per_node: int = Field(
        default=1, gt=0, description="vLLM engine actors on each node that has room for them."
    )
    gpus_per_engine: int = Field(
        default=0, ge=0, description="GPUs of one engine (its tensor-parallel size); 0: CPU vLLM."
    )
    cpus_per_engine: float = Field(default=1.0, ge=0, description="Ray CPUs one engine holds.")
    engine_threads: int = Field(default=1, gt=0, description="torch threads of an engine actor.")
    colocate: bool = Field(
        default=False,
        description="Training and rollout share the GPUs: with train_workers, each rank's actor "
        "also holds one engine (asleep while the ranks train).",
    )
    sleep_level: Literal[1, 2] = Field(
        default=1,
        description="Colocated sleep: 1 copies engine weights to host RAM and back, 2 drops "
        "them (the push reloads every weight; what the GPU recipes use).",
    )
    train_workers: int = Field(
        default=0,
        ge=0,
        description="FSDP2 ranks (Ray actors) the RL update runs on; 0: the driver trains alone.",
    )
    gpus_per_train_worker: int = Field(
        default=0, ge=0, le=1, description="GPUs of one training rank; 0: CPU ranks over gloo."
    )
    cpus_per_train_worker: float = Field(
        default=1.0, ge=0, description="Ray CPUs one training rank holds."
    )
    train_threads: int = Field(default=1, gt=0, description="torch threads of a training rank.")
    activation_checkpointing: bool = Field(
        default=True, description="Training ranks recompute each block in backward."
    )
    offload_train_state: bool | None = Field(
        default=None,
        description="Ranks move parameters, gradients and AdamW state to host memory while the "
        "engines roll out; None: on when colocated.",
    )
    device_memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="Memory of one GPU; the run is refused at start when the memory model's "
        "per-device peak exceeds it. None: read from the driver's GPU (no check without one).",
    )
    memory_overhead_gib: float = Field(
        default=8.0,
        ge=0,
        description="What that check adds beyond the model's tensors for the CUDA context, NCCL "
        "and the caching allocator's slack, in both phases and at engine start (the slack "
        "measured 2-7 GiB on one H200: apps/trainer/SCALE.md).",
    )
    bucket_bytes: int = Field(
        default=1 << 30,
        gt=0,
        description="Weight sync streams the policy to the engines in buckets of this size.",
    )
    sandbox_workers: int = Field(default=8, gt=0, description="Sandbox workers on each node.")
    sandbox_max_in_flight: int | None = Field(
        default=None,
        gt=0,
        description="Tool calls running at once on each node's sandbox (the paper: about 1,024); "
        "None: 16 per sandbox worker.",
    )
    verify_workers: int = Field(default=2, gt=0, description="Verify workers on each node.")
    start_timeout_s: float = Field(
        default=900.0, gt=0, description="Limit for servers and engines to come up."
    )
    sync_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Split placement: a weight sync's channel (its group's set-up and every "
        "bucket's collective) gives up after this many seconds; an engine that died in the sync "
        "is then dropped and the survivors are synced again, once (gloo; over NCCL torch tears "
        "rank 0's process down and the run restarts from its checkpoint, run.max_restarts).",
    )

    engine_health_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Split placement: seconds between health checks of each engine actor.",
    )
    engine_health_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Split placement: an engine actor that does not answer a health check in "
        "this many seconds hangs; it is killed and started again, its turns sent to the others.",
    )
    engine_restarts: int = Field(
        default=3,
        ge=0,
        description="Split placement: times each engine actor is started again after it died "
        "or hung (then it is dropped and the run goes on with the others).",
    )

    @model_validator(mode="after")
    def _sandbox_fits_its_workers(self) -> ClusterConfig:
        if self.sandbox_max_in_flight is not None:  # the sandbox's own rule, said at load
            SandboxConfig(workers=self.sandbox_workers, max_in_flight=self.sandbox_max_in_flight)
        return self

    @model_validator(mode="after")
    def _colocated_ranks_hold_one_engine_each(self) -> ClusterConfig:
        if not (self.train_workers and self.colocate):
            return self
        if self.gpus_per_engine != self.gpus_per_train_worker:
            raise ValueError(
                f"colocated, each training rank holds one engine on its own GPU: set "
                f"cluster.gpus_per_engine to {self.gpus_per_train_worker} (engines with tensor "
                "parallelism across ranks are not built yet)"
            )
        # A written config.yaml holds every field: its default 1 comes back on `--resume`.
        if "engines_per_node" in self.model_fields_set and self.engines_per_node != 1:
            raise ValueError(
                "colocated, the engines are the training ranks' (one each): remove "
                "cluster.engines_per_node"
            )
        return self

    @property
    def colocated_ranks(self) -> bool:
        """Each training rank's actor holds an engine (colocate with train_workers)."""
        return self.colocate and self.train_workers > 0

    @property
    def offloads(self) -> bool:
        """Whether the ranks offload their training state while the engines roll out."""
        if self.offload_train_state is None:
            return self.colocated_ranks
        return self.offload_train_state


class RemoteRolloutConfig(BaseModel):
    """Rollouts on `rstar2-rollout serve` workers on other machines (apps/trainer/README.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: list[str] = Field(
        min_length=1, description="host:port of each rollout service; problems spread over them."
    )
    connect_timeout_s: float = Field(
        default=120.0, gt=0, description="How long to wait for a worker to answer at start-up."
    )
    chunk_bytes: int = Field(
        default=4 << 20, gt=0, le=32 << 20, description="Piece size of the weight-update stream."
    )
    in_flight_per_engine: int = Field(
        default=4,
        gt=0,
        description="Problems a worker runs at once per healthy engine; more wait in one queue.",
    )
    token_file: str | None = Field(
        default=None, description="Token file (0600) the workers were started with (--token-file)."
    )

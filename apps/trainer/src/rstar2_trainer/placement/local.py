"""Build the run's parts from a `TrainerConfig`: model and tokenizer, engines, tool, grader.

`Parts` owns everything that must be stopped at the end (engines, child servers, clients), and
`open_parts` is an async context manager that stops them in reverse order on any exit.
The tool runs where `tool` says (rstar2-sandbox's backend union: a child `rstar2-sandbox serve`
on loopback by default, reached over gRPC exactly as on a cluster; running servers; an in-process
pool; a SandboxFusion endpoint), opened by the sandbox package's `open_sandbox`. The verify
server runs as a child process too; `mode=address` connects to a running one, `mode=local`
grades in-process. Trajectories come from one `rstar2_rollout.TrajectorySource`: an in-process
`RolloutService` (the rollout package's scheduler and agent loop over local engines), or, with a
`remote` section, the `rstar2-rollout serve` services (`remote.RemoteServices`; no local engine
or sandbox). The weights move through `Parts.mover` (placement/weights.py): a `TensorMover`
streaming the driver's weights into the local engines, or a `RemoteMover` to the services.

The child services are supervised (`run.service_restarts`, `run.service_retry_s`): the verify
server by its `ChildServer` (restarted on the same port), the sandbox child by rstar2-sandbox's
`ChildSandbox` (restarted on a new port, its client re-pointed); both clients send a call again
while the service comes back. `Parts.check_servers` raises a restartable `ServerError` for a
service dead for good, and `Parts.service_counts` says how many restarts and resent calls there
were.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rstar2_rollout import (
    ChatFormat,
    Engine,
    RequestLimits,
    RolloutService,
    TrajectorySource,
    build_engine,
    system_prompt,
)
from rstar2_rollout.scheduler import Scheduler
from rstar2_rollout.service import agent_producer
from rstar2_sandbox import Sandbox, open_sandbox
from rstar2_trainer.config import (
    ConfigError,
    PretrainedModelConfig,
    ServiceConfig,
    TrainerConfig,
    context_tokens,
)
from rstar2_trainer.meter import EngineMeter
from rstar2_trainer.placement.engines import Engines
from rstar2_trainer.placement.remote import RemoteServices
from rstar2_trainer.placement.servers import (
    ChildServer,
    RunToken,
    ServerError,
    console_script,
    service_token,
)
from rstar2_trainer.placement.weights import RemoteMover, TensorMover, WeightMover
from rstar2_verify import Scorer, Verifier


@dataclass
class Parts:
    """The live parts of a run."""

    model_dir: Path
    model: Any  # transformers PreTrainedModel trained in the driver; None when ranks train
    tokenizer: Any
    engines: Engines  # each engine, metered for idle time (none when remote)
    source: TrajectorySource  # RolloutService over `engines`, or the RemoteServices
    sandbox: Sandbox | None  # None when rollouts run on remote services (they call their own)
    scorer: Scorer
    mover: WeightMover  # sleeps the engines and pushes the policy's weights (weights.py)
    servers: list[ChildServer] = field(default_factory=list)
    remote: RemoteServices | None = None  # the rollout services, in remote mode
    train_group: Any = None  # the FSDP2 ranks (a TrainGroup) the placement started, if any

    def check_servers(self) -> None:
        """Raise ServerError (restartable) if a child service died and cannot come back."""
        for server in self.servers:
            server.check()
        if getattr(self.sandbox, "alive", True) is False:
            restarts = getattr(self.sandbox, "restarts", 0)
            raise ServerError(
                f"the sandbox child server died and {restarts} restarts did not bring it back",
                restartable=True,
            )

    def service_counts(self) -> dict[str, int]:
        """Since the start: restarts of the child services, calls sent more than once, engine
        actors started again and the turns sent to another engine (ray_engine.py)."""
        restarts = sum(s.restarts_done for s in self.servers)
        restarts += int(getattr(self.sandbox, "restarts", 0))
        retried = int(getattr(self.sandbox, "retried", 0)) + self.scorer.verifier.retried
        inner = [getattr(e, "inner", e) for e in self.engines]
        return {
            "service_restarts": restarts,
            "calls_retried": retried,
            "engine_restarts": sum(int(getattr(e, "restarts", 0)) for e in inner),
            "turns_moved": sum(int(getattr(e, "turns_moved", 0)) for e in inner),
        }


def local_source(
    config: TrainerConfig, engines: Sequence[EngineMeter], sandbox: Sandbox, tokenizer: Any
) -> tuple[RolloutService, Scheduler]:
    """The rollout package's scheduler and agent loop over `engines`, as a trajectory source."""
    fmt = ChatFormat(tokenizer, system_prompt(style=config.rollout.system_prompt))
    produce, prompt_tokens = agent_producer(sandbox, fmt, config.rollout)
    scheduler: Scheduler = Scheduler(list(engines), config.scheduler)
    limits = RequestLimits(max_trajectories=1 << 30)  # the recipe sizes the batches
    service = RolloutService(
        scheduler,
        produce,
        prompt_tokens,
        limits,
        engines=engines,
        system_prompt_style=config.rollout.system_prompt,
    )
    return service, scheduler


def prepare_model_dir(config: TrainerConfig, run_dir: Path, corpus: Sequence[str] = ()) -> Path:
    """The model folder: a tiny model built into the run directory, or the given path.

    A tiny model's tokenizer is trained on `corpus` (the text the model will see: the system
    prompt, questions, SFT traces), so the long system prompt costs few tokens.
    """
    if config.init is not None and getattr(config.model, "lora", None) is not None:
        return run_dir / "base"  # a LoRA run from a checkpoint: its weights (origin.py)
    if isinstance(config.model, PretrainedModelConfig):
        return Path(config.model.path)
    out = run_dir / "model"
    if not (out / "config.json").exists():
        from rstar2_rollout.tiny import build_tiny_model

        m = config.model
        build_tiny_model(
            out,
            seed=config.run.seed,
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            layers=m.layers,
            heads=m.heads,
            kv_heads=m.kv_heads,
            max_position_embeddings=m.max_position_embeddings,
            corpus=list(corpus) or None,
        )
    return out


def load_model(model_dir: Path, *, weights: bool = True) -> tuple[Any, Any]:
    """The model (fp32; None without `weights`: the training ranks load it) and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not weights:
        return None, tokenizer
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def check_local_engines(config: TrainerConfig) -> None:
    """Refuse what the local engines cannot do on this machine, before anything starts."""
    local = config.cluster is None and config.remote is None
    several = config.engine.kind == "vllm" and config.engine_replicas > 1
    if local and several and not torch.cuda.is_available():
        raise ConfigError(
            "engine_replicas > 1: the CPU build of vLLM runs one engine per process (two in "
            "one corrupt each other's output); use engine_replicas: 1, or the cluster mode, "
            "which runs each engine in its own Ray actor"
        )


def build_engines(config: TrainerConfig, model_dir: Path) -> list[Engine]:
    """`engine_replicas` engines on the policy's folder, built by rstar2-rollout's factory."""
    return [
        build_engine(config.engine_for(str(model_dir), replica=i), name=f"{config.engine.kind}-{i}")
        for i in range(config.engine_replicas)
    ]


def max_model_len(config: TrainerConfig) -> int:
    """The engines' context: engine.max_model_len where the recipe sets it, else `context_tokens`."""
    return int(getattr(config.engine_for("", replica=0), "max_model_len", context_tokens(config)))


def grpc_healthy(address: str) -> bool:
    """True when the server at `address` answers the standard health check with SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            request = health_pb2.HealthCheckRequest(service="")
            reply = stub.Check(request, timeout=2)  # pyright: ignore[reportAttributeAccessIssue]
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


async def _open_verifier(
    config: TrainerConfig,
    service: ServiceConfig,
    servers: list[ChildServer],
    token: RunToken | None = None,
) -> Verifier:
    if service.mode == "local":
        return Verifier.local(config.verify)
    address = service.address
    if service.mode == "child":
        argv = [
            *console_script("rstar2-verify"),
            "serve",
            "--workers",
            str(service.workers),
            "--timeout-s",
            str(config.verify.timeout_s),
        ]
        server = ChildServer(
            "verify",
            argv,
            port=service.port,
            health=grpc_healthy,
            token_file=_path(token),
            restarts=config.run.service_restarts,
        )
        servers.append(server)
        address = server.start()
    assert address is not None
    token_value = service_token(service, token)
    return Verifier.remote(address, token=token_value, retry_for_s=config.run.service_retry_s)


def _path(token: RunToken | None) -> Path | None:
    return token.path if token is not None else None


@contextlib.asynccontextmanager
async def open_parts(
    config: TrainerConfig, run_dir: Path, corpus: Sequence[str] = ()
) -> AsyncIterator[Parts]:
    """Build every part; stop them all, in reverse order, however the block exits."""
    async with contextlib.AsyncExitStack() as stack:
        servers: list[ChildServer] = []
        stack.callback(_stop_all, servers)
        model_dir = prepare_model_dir(config, run_dir, corpus)
        model, tokenizer = load_model(model_dir)
        token = RunToken.create(run_dir)
        verifier = await _open_verifier(config, config.verify_service, servers, token)
        stack.push_async_callback(verifier.close)
        scorer = Scorer(verifier, config.reward, tokenizer)
        if config.remote is not None:
            fmt = ChatFormat(tokenizer, system_prompt(style=config.rollout.system_prompt))
            remote = await RemoteServices.connect(config.remote, fmt.prompt_ids)
            stack.push_async_callback(remote.close)
            engines = Engines([])
            mover = RemoteMover(engines, remote)
            yield Parts(
                model_dir, model, tokenizer, engines, remote, None, scorer, mover, servers, remote
            )
            return
        sandbox = await stack.enter_async_context(
            open_sandbox(
                config.tool,
                config.sandbox,
                restarts=config.run.service_restarts,
                retry_for_s=config.run.service_retry_s,
            )
        )
        engines = Engines([EngineMeter(e) for e in build_engines(config, model_dir)])
        for engine in engines:
            stack.push_async_callback(engine.close)
        source, scheduler = local_source(config, engines, sandbox, tokenizer)
        stack.push_async_callback(scheduler.close)
        mover = TensorMover(engines)
        yield Parts(model_dir, model, tokenizer, engines, source, sandbox, scorer, mover, servers)


def _stop_all(servers: Sequence[ChildServer]) -> None:
    for server in reversed(servers):
        server.stop()

"""The rollout service: problems and sampling settings in, trajectories out, on this node's engines.

`RolloutService` owns a `Scheduler` over the node's engines and an injected coroutine
`produce(problem, sample_index, engine, sampling, request_id) -> Trajectory`; `agent_producer`
builds it from the agent loop (`run_agent`, which derives per-sample, per-turn seeds from the
request seed). For every problem it runs `sampling.n` jobs, each reserving prompt +
max_response_tokens on one engine, and yields `RolloutResult`s in completion order. A failed job
(its engine died, the loop raised) comes back as a trajectory with finish_reason "error" and the
reason, rather than ending the stream.

Every job gets a request id no running job of the service has, which the loop extends per turn
(`/turn`): `problem id/sample index`, or, while that one runs in another stream (an asynchronous
step's pool drew the problem again), `problem id/sample index@stream` (streams counted per
service). So an engine, which refuses a request id that is running (vLLM), is never sent one.
`generate_gated` is `generate_samples` whose jobs wait on a gate (an `asyncio.Event`, open when
set) before each engine call: the rollout pool's pause (groups.py), used only where the scheduler
starts every job at once (least_requests without a cap), so that no held job keeps a place
another job needs.

Bad requests raise `InvalidRolloutRequest` before any work starts; a node with no healthy engine
raises `NoHealthyEngine`. The gRPC servicer maps them to INVALID_ARGUMENT and UNAVAILABLE.

`update_weights` loads new weights into every healthy engine at once (each resets its prefix
cache), between generations: it waits for running `generate` calls to end and holds new ones
until it is done. The payload is checked against the model's `WeightSpec` first, so a bad one
(`InvalidWeights`: unknown name, wrong shape) leaves every engine as it was.

`max_weight_bytes` is the largest update payload accepted: the model's own size (the servicer
refuses a longer stream before holding it). Not covered: building engines or the agent loop
(the caller injects them; `cli.py` builds real ones), authentication (the server's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rstar2_rollout.chat import ChatFormat, Tokenizer
from rstar2_rollout.config import (
    LeastRequestsPolicy,
    RequestLimits,
    RolloutConfig,
    SchedulerConfig,
)
from rstar2_rollout.engine import Engine, Generation, KVCapacity, SamplingParams
from rstar2_rollout.loop import RolloutTask, chat_format, run_agent
from rstar2_rollout.scheduler import EngineStatus, Job, Scheduler
from rstar2_rollout.trajectory import Trajectory
from rstar2_rollout.weights import TensorInfo, WeightSpec
from rstar2_sandbox import Sandbox


@dataclass(frozen=True)
class RolloutSampling:
    """Carries the settings of one request; 0 for max_response_tokens / max_turns means the service's default,
    None for an agent-loop setting keeps the service's own (its `RolloutConfig`).

    `of(config, n)` carries every setting of a `RolloutConfig` that shapes a trajectory, so a
    remote service rolls out exactly as a local one (only the system prompt is the service's:
    it renders the prompts, and a request naming another is refused)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_tokens: int = 0
    max_turns: int = 0
    seed: int = 0
    count_tool_tokens: bool | None = None
    max_tokens_per_turn: int | None = None
    max_context_tokens: int | None = None
    max_tool_calls_per_turn: int | None = None
    max_tool_response_chars: int | None = None
    tool_timeout_s: float | None = None
    system_prompt: str = ""  # "" : the service's

    @classmethod
    def of(cls, config: RolloutConfig, n: int) -> RolloutSampling:
        """Copies every trajectory-shaping setting of `config`, for `n` samples per problem."""
        return cls(
            n=n,
            temperature=config.temperature,
            top_p=config.top_p,
            max_response_tokens=config.max_response_tokens,
            max_turns=config.max_turns,
            seed=config.seed,
            count_tool_tokens=config.count_tool_tokens,
            max_tokens_per_turn=config.max_tokens_per_turn,
            max_context_tokens=config.max_context_tokens,
            max_tool_calls_per_turn=config.max_tool_calls_per_turn,
            max_tool_response_chars=config.max_tool_response_chars,
            tool_timeout_s=config.tool_timeout_s,
            system_prompt=config.system_prompt,
        )

    def apply(self, base: RolloutConfig) -> RolloutConfig:
        """Returns `base` with this request's settings (defaults already filled by the service)."""
        update: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_turns": self.max_turns,
            "max_response_tokens": self.max_response_tokens,
            "seed": self.seed,
        }
        for key in _LOOP_SETTINGS:
            value = getattr(self, key)
            if value is not None:
                update[key] = value
        return base.model_copy(update=update)


# Agent-loop settings a request may carry (None: the service's own).
_LOOP_SETTINGS = (
    "count_tool_tokens",
    "max_tokens_per_turn",
    "max_context_tokens",
    "max_tool_calls_per_turn",
    "max_tool_response_chars",
    "tool_timeout_s",
)


@dataclass(frozen=True)
class RolloutResult:
    """Reports one finished job: its trajectory (finish_reason "error" when the job failed), the engine
    that ran it, and how long it waited for one."""

    trajectory: Trajectory
    engine: str
    queued_s: float


Produce = Callable[[RolloutTask, int, Engine, RolloutSampling, str], Awaitable[Trajectory]]


def agent_producer(
    sandbox: Sandbox | None, tokenizer: Tokenizer | ChatFormat, base: RolloutConfig
) -> tuple[Produce, Callable[[RolloutTask], int]]:
    """`produce` over the agent loop (`run_agent`) and the prompt-length function it implies.

    A request's settings override `base` (`RolloutSampling.apply`); the rest (the system prompt)
    comes from `base`.
    """
    fmt = chat_format(tokenizer, base)

    async def produce(
        problem: RolloutTask,
        index: int,
        engine: Engine,
        sampling: RolloutSampling,
        request_id: str,
    ) -> Trajectory:
        config = sampling.apply(base)
        return await run_agent(
            engine, sandbox, fmt, problem, config, sample_index=index, request_id=request_id
        )

    return produce, lambda problem: len(fmt.prompt_ids(problem.question))


def one_engine_service(
    engine: Engine, sandbox: Sandbox | None, tokenizer: Tokenizer, config: RolloutConfig
) -> RolloutService:
    """A service over one engine running the agent loop, `config.max_concurrency` samples at once
    (an evaluation's, a label check's); the caller closes `service.scheduler`. `sandbox` may be
    None only with `config.tool` False."""
    produce, prompt_tokens = agent_producer(sandbox, tokenizer, config)
    policy = LeastRequestsPolicy(max_running_per_engine=config.max_concurrency)
    scheduler: Scheduler[Trajectory] = Scheduler([engine], SchedulerConfig(policy=policy))
    return RolloutService(
        scheduler, produce, prompt_tokens, system_prompt_style=config.system_prompt
    )


class InvalidRolloutRequest(ValueError):
    """The request cannot be served as asked (INVALID_ARGUMENT)."""


class NoHealthyEngine(RuntimeError):
    """Every engine on this node is dead (UNAVAILABLE)."""


class WeightsUnsupported(RuntimeError):
    """This service cannot take weight updates as started (FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class WeightLoad:
    """Reports what one weight update did: tensors loaded, into which engines, in how long."""

    tensors: int
    engines: list[str]
    load_s: float


class RolloutService:
    """Turns problems into trajectories on the engines of one scheduler (see module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler[Trajectory],
        produce: Produce,
        prompt_tokens: Callable[[RolloutTask], int],
        config: RequestLimits | None = None,
        engines: Sequence[Engine] = (),
        weights: WeightSpec | None = None,
        system_prompt_style: str = "",
    ) -> None:
        """`engines` are the scheduler's (for weight updates); `weights` checks their payloads;
        `system_prompt_style` is the style `produce` renders prompts in ("" : not checked)."""
        self.scheduler = scheduler
        self.config = config or RequestLimits()
        self.engines = list(engines)
        self.weights = weights
        self._produce = produce
        self._prompt_tokens = prompt_tokens
        self._system_prompt = system_prompt_style
        self._gate: asyncio.Condition | None = None  # created on the serving loop
        self._generating = 0
        self._updates = 0  # updates waiting or running: new generations wait behind them
        self._loading: asyncio.Lock | None = None  # one update at a time
        self._streams = 0  # streams opened
        self._running_ids: set[str] = set()  # request ids of the jobs running now

    def check(self, problems: Sequence[RolloutTask], sampling: RolloutSampling) -> RolloutSampling:
        """Validate a request and fill its defaults; raise InvalidRolloutRequest/NoHealthyEngine."""
        if not problems:
            raise InvalidRolloutRequest("no problems in the request")
        if sampling.n <= 0:
            raise InvalidRolloutRequest(f"n must be > 0 trajectories per problem, got {sampling.n}")
        if sampling.max_response_tokens < 0:
            raise InvalidRolloutRequest(
                f"max_response_tokens must be >= 0 (0: default), got {sampling.max_response_tokens}"
            )
        if sampling.max_turns < 0:
            raise InvalidRolloutRequest(
                f"max_turns must be >= 0 (0: default), got {sampling.max_turns}"
            )
        for key in _LOOP_SETTINGS:
            value = getattr(sampling, key)
            if value is not None and not isinstance(value, bool) and value <= 0:
                raise InvalidRolloutRequest(f"{key} must be > 0 when set, got {value}")
        if sampling.temperature < 0:
            raise InvalidRolloutRequest(f"temperature must be >= 0, got {sampling.temperature}")
        style = sampling.system_prompt
        if style and self._system_prompt and style != self._system_prompt:
            raise InvalidRolloutRequest(
                f"the request asks for system prompt {style!r}, this service renders "
                f"{self._system_prompt!r}: start it with --system-prompt {style}"
            )
        if not 0 <= sampling.top_p <= 1:
            raise InvalidRolloutRequest(f"top_p must be in (0, 1] (0: 1.0), got {sampling.top_p}")
        total = len(problems) * sampling.n
        if total > self.config.max_trajectories:
            raise InvalidRolloutRequest(
                f"{len(problems)} problems x n={sampling.n} = {total} trajectories exceeds"
                f" {self.config.max_trajectories} per request"
            )
        ids = [p.id for p in problems]
        if any(not i for i in ids):
            raise InvalidRolloutRequest(f"problem {ids.index('')} has an empty id")
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise InvalidRolloutRequest(f"problem id {dup!r} appears more than once")
        if not any(s.healthy for s in self.scheduler.status()):
            raise NoHealthyEngine("no healthy engine on this service: " + self._reasons())
        resolved = replace(
            sampling,
            max_response_tokens=sampling.max_response_tokens or self.config.max_response_tokens,
            max_turns=sampling.max_turns or self.config.max_turns,
            top_p=sampling.top_p or 1.0,
        )
        biggest = max(self._prompt_tokens(p) for p in problems) + resolved.max_response_tokens
        if not self.scheduler.fits(biggest):
            raise InvalidRolloutRequest(
                f"a trajectory needs up to {biggest} KV tokens (prompt + max_response_tokens);"
                " no engine on this service holds that many: lower max_response_tokens"
            )
        return resolved

    async def generate(
        self, problems: Sequence[RolloutTask], sampling: RolloutSampling
    ) -> AsyncGenerator[RolloutResult, None]:
        """Yield one result per (problem, sample) as each finishes; closing early cancels the rest."""
        samples = [(p, i) for p in problems for i in range(max(sampling.n, 0))]
        async for result in self.generate_samples(samples, sampling, problems=problems):
            yield result

    async def generate_samples(
        self,
        samples: Sequence[tuple[RolloutTask, int]],
        sampling: RolloutSampling,
        *,
        problems: Sequence[RolloutTask] | None = None,
        gate: asyncio.Event | None = None,
    ) -> AsyncGenerator[RolloutResult, None]:
        """`generate` for chosen (problem, sample index) pairs (a resumed evaluation's missing
        ones): the index, not the position, seeds a sample. With `gate`, each job waits for it
        to be set before each engine call."""
        if problems is None:
            problems = list({p.id: p for p, _ in samples}.values())
        resolved = self.check(problems, sampling)
        hold, updates = gate, self._condition()
        async with updates:
            await updates.wait_for(lambda: self._updates == 0)
            self._generating += 1
        try:
            async for result in self._generate(samples, resolved, hold):
                yield result
        finally:
            async with updates:
                self._generating -= 1
                updates.notify_all()

    def generate_gated(
        self,
        samples: Sequence[tuple[RolloutTask, int]],
        sampling: RolloutSampling,
        gate: asyncio.Event,
    ) -> AsyncGenerator[RolloutResult, None]:
        """`generate_samples` whose jobs wait on `gate` before each engine call (`GatedSource`),
        where the scheduler starts every job at once; under a policy that caps or reserves per
        job (kv_aware, `max_running_per_engine`) a held job would keep its place from the very
        jobs the pause makes room for, so the gate is not used there."""
        hold = gate if self.scheduler.starts_every_job else None
        return self.generate_samples(samples, sampling, gate=hold)

    async def _generate(
        self,
        samples: Sequence[tuple[RolloutTask, int]],
        resolved: RolloutSampling,
        hold: asyncio.Event | None,
    ) -> AsyncGenerator[RolloutResult, None]:
        self._streams += 1
        stream = self._streams
        jobs: list[Job[Trajectory]] = []
        for problem, i in samples:
            reserve = self._prompt_tokens(problem)

            async def run(engine: Engine, p=problem, i=i) -> Trajectory:
                held = engine if hold is None else _Gated(engine, hold)
                rid = f"{p.id}/{i}"
                rid = rid if rid not in self._running_ids else f"{rid}@{stream}"
                self._running_ids.add(rid)
                try:
                    return await self._produce(p, i, held, resolved, rid)
                finally:
                    self._running_ids.discard(rid)

            jobs.append(Job(run, reserve, resolved.max_response_tokens, (problem.id, i)))
        results = self.scheduler.stream(jobs)
        try:
            async for r in results:
                problem_id, index = r.tag
                start = r.started_at if r.started_at is not None else r.finished_at
                traj = r.value
                if traj is None or r.error:
                    traj = Trajectory(group_id=problem_id, sample_index=index)
                    traj.finish_reason, traj.error = "error", r.error or "the job returned nothing"
                yield RolloutResult(traj, r.engine or "", start - r.submitted_at)
        finally:
            await results.aclose()

    def _weight_spec(self) -> WeightSpec:
        """The names and shapes updates are checked against; WeightsUnsupported when this
        service takes no updates (no engines, or no *.safetensors to learn them from)."""
        if not self.engines:
            raise WeightsUnsupported("this service was given no engines to update")
        if self.weights is None:
            raise WeightsUnsupported(
                "this service knows no weight names and shapes (its model folder has no"
                " *.safetensors), so it cannot check an update"
            )
        return self.weights

    def check_weights(self, payload: dict[str, TensorInfo]) -> None:
        """Raise InvalidWeights / WeightsUnsupported for a payload this service cannot load."""
        self._weight_spec().check(payload)

    def max_weight_bytes(self) -> int:
        """Returns the largest weight update accepted (the model's own size, see
        `WeightSpec.max_payload_bytes`); WeightsUnsupported when this service takes none."""
        return self._weight_spec().max_payload_bytes()

    async def update_weights(self, named_tensors: Sequence[tuple[str, Any]]) -> WeightLoad:
        """Load checked (name, tensor) pairs into every healthy engine between generations."""
        self.check_weights({n: TensorInfo(str(t.dtype), tuple(t.shape)) for n, t in named_tensors})
        gate = self._condition()
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with gate:
            self._updates += 1
        try:
            async with gate:
                await gate.wait_for(lambda: self._generating == 0)
            async with self._loading:
                return await self._load(named_tensors)
        finally:
            async with gate:
                self._updates -= 1
                gate.notify_all()

    async def _load(self, named_tensors: Sequence[tuple[str, Any]]) -> WeightLoad:
        healthy = {s.name for s in self.scheduler.status() if s.healthy}
        targets = [e for e in self.engines if e.name in healthy]
        if not targets:
            raise NoHealthyEngine("no healthy engine on this service: " + self._reasons())
        start = time.perf_counter()
        await asyncio.gather(*(e.update_weights(named_tensors) for e in targets))
        names = [e.name for e in targets]
        return WeightLoad(len(named_tensors), names, time.perf_counter() - start)

    def info(self) -> list[EngineStatus]:
        return self.scheduler.status()

    def _condition(self) -> asyncio.Condition:
        if self._gate is None:
            self._gate = asyncio.Condition()
        return self._gate

    def _reasons(self) -> str:
        return "; ".join(f"{s.name}: {s.dead_reason}" for s in self.scheduler.status())


class _Gated:
    """An engine whose `generate` waits for `gate` to be set first; the rest is the engine's."""

    def __init__(self, engine: Engine, gate: asyncio.Event) -> None:
        self._engine = engine
        self._gate = gate
        self.name = engine.name

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        await self._gate.wait()
        return await self._engine.generate(prompt_ids, params, request_id)

    def kv_capacity(self) -> KVCapacity | None:
        return self._engine.kv_capacity()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self._engine.update_weights(named_tensors)

    async def close(self) -> None:
        await self._engine.close()

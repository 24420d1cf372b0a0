"""Remote rollout services: engines on other machines, reached over rollout.v1 (`remote:` section).

    trainer (this process)                      each service (`rstar2-rollout serve`)
      policy model + optimizer, verifier   -->    Scheduler over its engines, agent loop, sandbox
      problems, as each service has room    -->    trajectories streamed back as they finish
      new weights after each update (safetensors pieces) --> loaded into every engine in place

- `RemoteServices` is a `rstar2_rollout.TrajectorySource`, like the in-process `RolloutService`. Problems
  are dispatched dynamically: one shared queue, each service keeps `in_flight_per_engine` problems
  per healthy engine running (a problem's n samples stay on one service, so its prefix is cached
  there) and takes the next one as soon as one finishes. A fast node therefore takes more of the
  batch and no node idles while another has a backlog, unlike a split fixed before the step.
- Every setting of the step's rollout config travels with the request (`RolloutSampling.of`); a
  service started with another system prompt is refused by the service, and a service serving
  another tokenizer is caught here: every trajectory's prompt must equal the trainer's rendering.
- `push_weights` serialises the state dict once and sends it to all services at once; the seconds
  are the weight-sync phase.

Not measured here: engine idle time on the services (`engine_idle_share` reads 0 in this mode).
A service that fails mid-step ends the step with a `ServerError` (the run resumes from its last
checkpoint); its problems are not moved to another service.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_rollout import RolloutClient, RolloutError, RolloutResult, RolloutSampling, RolloutTask
from rstar2_rollout.weights import to_safetensors
from rstar2_trainer.config.cluster import RemoteRolloutConfig
from rstar2_trainer.placement.servers import ServerError, read_service_token


@dataclass
class RemoteService:
    """Holds one `rstar2-rollout serve` process the run reaches: its address, client and engines."""

    address: str
    client: RolloutClient
    engines: int  # healthy engines at start-up


class RemoteServices:
    """Spreads the run's problems over its remote rollout services (a trajectory source) and pushes
    new weights to all of them."""

    def __init__(
        self,
        services: list[RemoteService],
        config: RemoteRolloutConfig,
        prompt_ids: Callable[[str], list[int]] | None = None,
    ) -> None:
        self.services = services
        self.config = config
        self.prompt_ids = prompt_ids  # the trainer's rendering of a question, to check services
        self.last_push: list[Any] = []  # the WeightUpdate of each service, last push
        self.dispatched: dict[str, int] = {}  # problems each service took in the last generate

    @classmethod
    async def connect(
        cls, config: RemoteRolloutConfig, prompt_ids: Callable[[str], list[int]] | None = None
    ) -> RemoteServices:
        """Reach every service (retrying until `connect_timeout_s`) and read its engines."""
        services: list[RemoteService] = []
        token = read_service_token(config.token_file) if config.token_file else None
        try:
            for address in config.workers:
                client = RolloutClient(address, token=token)
                services.append(RemoteService(address, client, 0))
                services[-1].engines = await _healthy_engines(client, address, config)
        except BaseException:
            await asyncio.gather(*(w.client.close() for w in services))
            raise
        return cls(services, config, prompt_ids)

    async def generate(
        self, problems: Sequence[RolloutTask], sampling: RolloutSampling
    ) -> AsyncIterator[RolloutResult]:
        """Every problem's `sampling.n` trajectories, from whichever service has room first."""
        queue = collections.deque(problems)
        results: asyncio.Queue[RolloutResult | None] = asyncio.Queue()
        checked: set[str] = set()
        self.dispatched = {w.address: 0 for w in self.services}

        async def one(service: RemoteService, problem: RolloutTask) -> None:
            try:
                async for result in service.client.generate([problem], sampling):
                    traj = result.trajectory
                    if traj.prompt_ids and traj.group_id not in checked:
                        self._check_prompt(problem, traj.prompt_ids, service)
                        checked.add(traj.group_id)
                    engine = f"{service.address}/{result.engine}"
                    await results.put(dataclasses.replace(result, engine=engine))
            except RolloutError as exc:
                raise ServerError(
                    f"rollout service at {service.address} failed: {exc}; the run can be resumed"
                    " with `rstar2-train --resume RUN_DIR`"
                ) from None

        async def feed(service: RemoteService) -> None:
            slots = max(1, service.engines * self.config.in_flight_per_engine)
            running: set[asyncio.Task[None]] = set()
            try:
                while queue or running:
                    while queue and len(running) < slots:
                        self.dispatched[service.address] += 1
                        running.add(asyncio.create_task(one(service, queue.popleft())))
                    done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
            finally:
                for task in running:
                    task.cancel()

        feeders = asyncio.gather(*(feed(w) for w in self.services))
        feeders.add_done_callback(lambda _: results.put_nowait(None))
        try:
            while (item := await results.get()) is not None:
                yield item
            await feeders  # a service's failure surfaces here
        finally:
            feeders.cancel()
            await asyncio.gather(feeders, return_exceptions=True)

    def _check_prompt(self, problem: RolloutTask, got: list[int], service: RemoteService) -> None:
        if self.prompt_ids is None:
            return
        expected = self.prompt_ids(problem.question)
        if list(got) != expected:
            raise ServerError(
                f"rollout service at {service.address} rendered problem {problem.id!r} as"
                f" {len(got)} prompt tokens, the trainer as {len(expected)}: start it on"
                " the run's model folder with the recipe's --system-prompt"
            )

    async def push_weights(self, named_tensors: Any) -> float:
        """Send new weights to every service at once; seconds from serialising to the last ack."""
        start = time.perf_counter()
        payload = await asyncio.to_thread(to_safetensors, named_tensors)
        chunk = self.config.chunk_bytes
        try:
            self.last_push = list(
                await asyncio.gather(
                    *(w.client.update_weights(payload, chunk_bytes=chunk) for w in self.services)
                )
            )
        except RolloutError as exc:
            raise ServerError(f"weight sync to a rollout service failed: {exc}") from None
        return time.perf_counter() - start

    async def close(self) -> None:
        await asyncio.gather(*(w.client.close() for w in self.services))


async def _healthy_engines(client: RolloutClient, address: str, config: RemoteRolloutConfig) -> int:
    deadline = time.monotonic() + config.connect_timeout_s
    while True:
        try:
            info = await client.info()
            break
        except RolloutError as exc:
            if time.monotonic() > deadline:
                raise ServerError(
                    f"no rollout service answered at {address} within {config.connect_timeout_s:.0f}"
                    f" s ({exc}); start it with `rstar2-rollout serve` or fix remote.workers"
                ) from None
            await asyncio.sleep(0.5)
    healthy = sum(e.healthy for e in info.engines)
    if not healthy:
        raise ServerError(f"rollout service at {address} has no healthy engine")
    return healthy

"""Remote rollout workers: engines on other machines, reached over rollout.v1 (`remote:` section).

    trainer (this process)                      each worker (`rstar2-rollout serve`)
      policy model + optimizer, verifier   -->    Scheduler over its engines, agent loop, sandbox
      problems of a step, spread by engines  -->  trajectories streamed back as they finish
      new weights after each update (safetensors pieces) --> loaded into every engine in place

- `open_remote_parts` yields the same `Parts` as `build.open_parts`, with `remote` set and no
  local engine, scheduler or sandbox: the workers run the agent loop and call their own sandbox.
- `collect_remote` splits a batch across workers in proportion to their healthy engines (a
  problem's n samples stay on one worker), sends each worker its problems with the step's
  sampling and seed, and grades each trajectory as it arrives, as the local path does. A job
  that failed on a worker (an engine died) comes back as an error and counts as a failed job.
- Every trajectory's prompt must equal the trainer's own rendering of the question: a worker
  serving another tokenizer or system prompt is refused with a message saying so.
- `RemoteWorkers.push_weights` serialises the state dict once and sends it to all workers at
  once; the seconds are the weight-sync phase.

The workers' agent-loop settings (system prompt, tool-output truncation, tool timeout) are their
`serve` flags; the request carries temperature, top_p, budget, turns and seed. Not measured here:
engine idle time on the workers (`engine_idle_share` reads 0 in this mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2_curriculum import Problem
from rstar2_rollout import Problem as RolloutProblem
from rstar2_rollout import RolloutClient, RolloutConfig, RolloutError, RolloutSampling
from rstar2_rollout.trajectory import Trajectory
from rstar2_rollout.weights import to_safetensors
from rstar2_trainer.config import RemoteRolloutConfig, TrainerConfig
from rstar2_trainer.servers import RunToken, ServerError, read_service_token

if TYPE_CHECKING:
    from rstar2_trainer.build import Parts
    from rstar2_trainer.collect import Collected


@dataclass
class Worker:
    address: str
    client: RolloutClient
    engines: int  # healthy engines at start-up


class RemoteWorkers:
    """The run's rollout workers: where problems go and where new weights are pushed."""

    def __init__(self, workers: list[Worker], config: RemoteRolloutConfig) -> None:
        self.workers = workers
        self.config = config
        self.last_push: list[Any] = []  # the WeightUpdate of each worker, last push

    @classmethod
    async def connect(cls, config: RemoteRolloutConfig) -> RemoteWorkers:
        """Reach every worker (retrying until `connect_timeout_s`) and read its engines."""
        workers: list[Worker] = []
        token = read_service_token(config.token_file) if config.token_file else None
        try:
            for address in config.workers:
                client = RolloutClient(address, token=token)
                workers.append(Worker(address, client, 0))
                workers[-1].engines = await _healthy_engines(client, address, config)
        except BaseException:
            await asyncio.gather(*(w.client.close() for w in workers))
            raise
        return cls(workers, config)

    def split(self, problems: Sequence[Problem]) -> list[list[Problem]]:
        """Each worker's share: problems go where the fewest are queued per engine."""
        shares: list[list[Problem]] = [[] for _ in self.workers]
        for problem in problems:
            k = min(
                range(len(self.workers)), key=lambda i: len(shares[i]) / self.workers[i].engines
            )
            shares[k].append(problem)
        return shares

    async def push_weights(self, named_tensors: Any) -> float:
        """Send new weights to every worker at once; seconds from serialising to the last ack."""
        start = time.perf_counter()
        payload = await asyncio.to_thread(to_safetensors, named_tensors)
        chunk = self.config.chunk_bytes
        try:
            self.last_push = list(
                await asyncio.gather(
                    *(w.client.update_weights(payload, chunk_bytes=chunk) for w in self.workers)
                )
            )
        except RolloutError as exc:
            raise ServerError(f"weight sync to a rollout worker failed: {exc}") from None
        return time.perf_counter() - start

    async def close(self) -> None:
        await asyncio.gather(*(w.client.close() for w in self.workers))


async def _healthy_engines(client: RolloutClient, address: str, config: RemoteRolloutConfig) -> int:
    deadline = time.monotonic() + config.connect_timeout_s
    while True:
        try:
            info = await client.info()
            break
        except RolloutError as exc:
            if time.monotonic() > deadline:
                raise ServerError(
                    f"no rollout worker answered at {address} within {config.connect_timeout_s:.0f}"
                    f" s ({exc}); start it with `rstar2-rollout serve` or fix remote.workers"
                ) from None
            await asyncio.sleep(0.5)
    healthy = sum(e.healthy for e in info.engines)
    if not healthy:
        raise ServerError(f"rollout worker at {address} has no healthy engine")
    return healthy


@contextlib.asynccontextmanager
async def open_remote_parts(
    config: TrainerConfig, run_dir: Path, corpus: Sequence[str] = ()
) -> AsyncIterator[Parts]:
    """The trainer's parts when rollouts run on remote workers (see the module docstring)."""
    from rstar2_trainer.build import (
        Parts,
        _open_verifier,
        _stop_all,
        load_policy,
        prepare_model_dir,
    )

    assert config.remote is not None
    async with contextlib.AsyncExitStack() as stack:
        servers: list = []
        stack.callback(_stop_all, servers)
        model_dir = prepare_model_dir(config, run_dir, corpus)
        model, tokenizer = load_policy(model_dir)
        token = RunToken.create(run_dir)
        verifier = await _open_verifier(config, config.verify_service, servers, token)
        stack.push_async_callback(verifier.close)
        remote = await RemoteWorkers.connect(config.remote)
        stack.push_async_callback(remote.close)
        yield Parts(model_dir, model, tokenizer, [], None, None, verifier, servers, remote=remote)


async def collect_remote(
    problems: Sequence[Problem],
    n: int,
    parts: Parts,
    config: RolloutConfig,
    on_done: Callable[[], None] | None = None,
) -> Collected:
    """`collect` over the remote workers: same result, same grading as trajectories arrive."""
    from rstar2_rollout.chat import ChatFormat, system_prompt
    from rstar2_trainer.collect import Collected, grade_trajectory

    remote = parts.remote
    assert remote is not None
    fmt = ChatFormat(parts.tokenizer, system_prompt(style=config.system_prompt))
    by_id = {p.id: p for p in problems}
    sampling = RolloutSampling(
        n=n,
        temperature=config.temperature,
        top_p=config.top_p,
        max_response_tokens=config.max_response_tokens,
        max_turns=config.max_turns,
        seed=config.seed,
    )
    trajectories: list[Trajectory] = []
    failed: list[str] = []
    grading: list[asyncio.Task] = []
    checked: set[str] = set()

    async def run(worker: Worker, share: list[Problem]) -> None:
        asked = [RolloutProblem(p.id, p.question) for p in share]
        try:
            async for result in worker.client.generate(asked, sampling):
                traj = result.trajectory
                if traj.finish_reason == "error" and not traj.prompt_ids:
                    failed.append(f"{worker.address} {result.engine}: {traj.error}")
                else:
                    if traj.group_id not in checked:
                        _check_prompt(traj, fmt.prompt_ids(by_id[traj.group_id].question), worker)
                        checked.add(traj.group_id)
                    trajectories.append(traj)
                    grading.append(
                        asyncio.create_task(
                            grade_trajectory(parts.verifier, by_id[traj.group_id], traj)
                        )
                    )
                if on_done is not None:
                    on_done()
        except RolloutError as exc:
            raise ServerError(
                f"rollout worker at {worker.address} failed: {exc}; the run can be resumed"
                " with `rstar2-train --resume RUN_DIR`"
            ) from None

    start = time.perf_counter()
    shares = remote.split(problems)
    try:
        await asyncio.gather(*(run(w, s) for w, s in zip(remote.workers, shares, strict=True) if s))
    finally:
        rollout_s = time.perf_counter() - start
        tail_start = time.perf_counter()
        await asyncio.gather(*grading, return_exceptions=True)
    for task in grading:
        task.result()  # a grading error surfaces here, as in the local path
    return Collected.of(
        problems,
        trajectories,
        failed,
        rollout_s=rollout_s,
        grade_tail_s=time.perf_counter() - tail_start,
        engine_idle_s=0.0,
    )


def _check_prompt(traj: Trajectory, expected: list[int], worker: Worker) -> None:
    if traj.prompt_ids != expected:
        raise ServerError(
            f"rollout worker at {worker.address} rendered problem {traj.group_id!r} as"
            f" {len(traj.prompt_ids)} prompt tokens, the trainer as {len(expected)}: start it on"
            " the run's model folder with the recipe's --system-prompt"
        )

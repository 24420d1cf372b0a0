"""The rollout.v1 client: send problems to a remote service, get trajectories as they finish.

    async with RolloutClient("node-3:50061") as client:
        async for r in client.generate(problems, RolloutSampling(n=32, max_response_tokens=8192)):
            r.trajectory, r.engine, r.queued_s
        update = await client.update_weights(model.state_dict().items())  # between generations

`RolloutClient(target, token=..., root_certificates=...)` sends the run's token with every call
(a service started with `--token-file` answers UNAUTHENTICATED without it) and uses TLS when given
root certificates (PEM). gRPC failures surface as `RolloutError` with the status code name and the server's message
(`INVALID_ARGUMENT: n must be > 0 ...`). Not covered: retries and load balancing across services
(the trainer decides which service gets which problems).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rstar2_proto.auth import open_channel
from rstar2_proto.rollout.v1 import rollout_pb2 as pb
from rstar2_proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
from rstar2_rollout import _wire
from rstar2_rollout.loop import RolloutTask
from rstar2_rollout.scheduler import EngineStatus
from rstar2_rollout.server import MAX_MESSAGE_BYTES
from rstar2_rollout.service import RolloutResult, RolloutSampling
from rstar2_rollout.weights import pieces, to_safetensors


class RolloutError(RuntimeError):
    """A rollout RPC failed; `code` is the gRPC status name (e.g. "UNAVAILABLE")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ServiceInfo:
    version: str
    policy: str
    engines: list[EngineStatus]


@dataclass(frozen=True)
class WeightUpdate:
    """Reports one weight update as the service saw it, plus the sender's own wall time."""

    tensors: int
    bytes: int
    receive_s: float  # service: first piece in -> payload parsed
    load_s: float  # service: every engine loaded (in parallel)
    engines: list[str]
    total_s: float  # sender: serialise + send + wait for the answer


class RolloutClient:
    """Talks to one rollout service over rollout.v1, asynchronously."""

    def __init__(
        self, target: str, *, token: str | None = None, root_certificates: bytes | None = None
    ) -> None:
        self._channel = open_channel(
            target,
            token=token,
            root_certificates=root_certificates,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = pb_grpc.RolloutServiceStub(self._channel)

    async def generate(
        self, problems: Sequence[RolloutTask], sampling: RolloutSampling, request_id: str = ""
    ) -> AsyncGenerator[RolloutResult, None]:
        """Yield results (trajectory, engine, queued_s) in completion order; leaving early cancels
        the rest on the service."""
        call = self._stub.Generate(_wire.encode_request(list(problems), sampling, request_id))
        try:
            async for msg in call:
                yield _wire.decode_result(msg)
        except grpc.aio.AioRpcError as exc:
            raise RolloutError(exc.code().name, exc.details() or "") from None
        finally:
            call.cancel()

    async def info(self) -> ServiceInfo:
        try:
            msg = await self._stub.Info(pb.InfoRequest())
        except grpc.aio.AioRpcError as exc:
            raise RolloutError(exc.code().name, exc.details() or "") from None
        return ServiceInfo(*_wire.decode_info(msg))

    async def update_weights(
        self,
        named_tensors: Iterable[tuple[str, Any]] | bytes,
        chunk_bytes: int = 4 << 20,
    ) -> WeightUpdate:
        """Send (name, tensor) pairs, or a ready safetensors payload, and have every engine of
        the service load them (after its running generations end). Needs torch for tensors."""
        start = time.perf_counter()
        data = named_tensors if isinstance(named_tensors, bytes) else to_safetensors(named_tensors)

        async def chunks() -> AsyncIterator[pb.WeightChunk]:
            for piece in pieces(data, chunk_bytes):
                yield pb.WeightChunk(data=piece)

        try:
            msg = await self._stub.UpdateWeights(chunks())
        except grpc.aio.AioRpcError as exc:
            raise RolloutError(exc.code().name, exc.details() or "") from None
        return WeightUpdate(
            msg.tensors,
            msg.bytes,
            msg.receive_s,
            msg.load_s,
            list(msg.engines),
            time.perf_counter() - start,
        )

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

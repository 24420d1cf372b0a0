"""The rollout.v1 gRPC server: a thin servicer over `RolloutService`.

`Generate` validates the request (INVALID_ARGUMENT with the reason; UNAVAILABLE when no engine is
healthy), then streams one `Trajectory` per (problem, sample) in completion order; a trajectory
whose job failed carries FINISH_REASON_ERROR and the reason. A client that hangs up cancels the
jobs it asked for. `Info` lists the engines with their free and total KV tokens.
`UpdateWeights` reads a stream of pieces of one safetensors payload, checks it against the
model's names and shapes (INVALID_ARGUMENT naming the tensor; nothing loaded), then loads it into
every engine between generations (see `RolloutService.update_weights`) and answers with the
seconds spent receiving and loading. It holds at most the model's own size
(`RolloutService.max_weight_bytes`): a longer stream is answered RESOURCE_EXHAUSTED as soon as it
passes the cap (the rest of the stream is read and dropped, never held, for at most 30 s, so that
the sender sees that status), and the engines keep their weights.

`bind(address, token=...)` binds the port before anything slow is built (a port in use fails at
once); `start_server` is bind plus start for callers that already have a service. With a token,
every call (Generate, Info, UpdateWeights) needs it (UNAUTHENTICATED otherwise,
`rstar2_proto.auth`); a non-loopback address without a token is refused unless `insecure`; TLS
when given a PEM certificate and key. Not covered: building engines and the agent loop
(`cli.py` does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import grpc

from rstar2_proto.auth import check_bind, server_credentials, server_interceptors
from rstar2_proto.rollout.v1 import rollout_pb2 as pb
from rstar2_proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
from rstar2_rollout import _wire
from rstar2_rollout.service import (
    InvalidRolloutRequest,
    NoHealthyEngine,
    RolloutService,
    WeightsUnsupported,
)
from rstar2_rollout.weights import InvalidWeights, load_tensors, read_header

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a 30K-token trajectory with logprobs is ~0.5 MB
_DRAIN_S = 30.0  # how long a refused weight stream is read (and dropped) to its end


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    """Decodes each RPC, calls the service and encodes its answer."""

    def __init__(self, service: RolloutService) -> None:
        self._service = service

    async def Generate(
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Trajectory]:
        problems, sampling = _wire.decode_request(request)
        try:
            self._service.check(problems, sampling)
        except InvalidRolloutRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NoHealthyEngine as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        stream = self._service.generate(problems, sampling)
        try:
            async for result in stream:
                yield _wire.encode_result(result)
        finally:
            await stream.aclose()

    async def Info(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.InfoResponse:
        policy = self._service.scheduler.config.policy.kind
        return _wire.encode_info(version("rstar2-rollout"), policy, self._service.info())

    async def UpdateWeights(
        self, request_iterator: AsyncIterator[pb.WeightChunk], context: grpc.aio.ServicerContext
    ) -> pb.UpdateWeightsResponse:
        start = time.perf_counter()
        try:
            cap = self._service.max_weight_bytes()
        except WeightsUnsupported as exc:
            await _drop(request_iterator)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        data = bytearray()
        async for chunk in request_iterator:
            if len(data) + len(chunk.data) > cap:
                received = len(data) + len(chunk.data)
                data = bytearray()  # freed before the rest is read and dropped
                await _drop(request_iterator)
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"weight update of more than {received} bytes exceeds this model's size cap of"
                    f" {cap} bytes (its tensors at float32 or wider, plus header); nothing was"
                    " loaded",
                )
            data += chunk.data
        try:
            self._service.check_weights(read_header(data))
            tensors = await asyncio.to_thread(load_tensors, bytes(data))
            receive_s = time.perf_counter() - start
            done = await self._service.update_weights(tensors)
        except InvalidWeights as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except WeightsUnsupported as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except NoHealthyEngine as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:  # an engine failed mid-load: its state is unknown
            await context.abort(grpc.StatusCode.INTERNAL, f"loading weights failed: {exc!r}")
        return pb.UpdateWeightsResponse(
            tensors=done.tensors,
            bytes=len(data),
            receive_s=receive_s,
            load_s=done.load_s,
            engines=done.engines,
        )


async def _drop(requests: AsyncIterator[pb.WeightChunk]) -> None:
    """Read and drop (never hold) what is left of a refused stream, for at most `_DRAIN_S`
    seconds, so that the sender sees the status rather than grpc/grpc#36066's INTERNAL."""
    try:
        async with asyncio.timeout(_DRAIN_S):
            async for _ in requests:
                pass
    except (TimeoutError, grpc.RpcError):
        return


@dataclass
class RolloutServer:
    """Holds a bound (then started) gRPC server and the port it bound."""

    server: grpc.aio.Server
    port: int

    async def start(self, service: RolloutService) -> None:
        """Serve `service` on the bound port."""
        pb_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(service), self.server)
        await self.server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace_s: float | None = 1.0) -> None:
        await self.server.stop(grace_s)


def bind(
    address: str = "127.0.0.1:0",
    *,
    token: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    insecure: bool = False,
) -> RolloutServer:
    """Bind `address` (port 0 picks a free one) without serving yet; OSError when it is taken
    (or the TLS pair cannot be read), InsecureBindError for a non-loopback host with no token
    (unless `insecure`). With `token`, callers must send it."""
    if (tls_cert_file is None) != (tls_key_file is None):
        raise ValueError("tls_cert_file and tls_key_file go together")
    check_bind(address.rsplit(":", 1)[0], token, insecure)
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a second listener
    ]
    server = grpc.aio.server(options=options, interceptors=server_interceptors(token))
    try:
        if tls_cert_file and tls_key_file:
            port = server.add_secure_port(address, server_credentials(tls_cert_file, tls_key_file))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot bind the rollout server to {address} (in use or not local)")
    return RolloutServer(server, port)


async def start_server(
    service: RolloutService, address: str = "127.0.0.1:0", **access: Any
) -> RolloutServer:
    """Bind `address` (port 0 picks a free one), start serving, return the server and its port;
    `access` is `bind`'s token, TLS pair and insecure."""
    server = bind(address, **access)
    await server.start(service)
    return server

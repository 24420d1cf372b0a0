"""The gRPC `VerifyService`: grading off the generation path, as the paper offloads it.

`VerifyServer(config)` owns a `Grader` and a `grpc.aio` server with the standard health service
(`grpc.health.v1`, SERVING once started). `Grade` and `GradeBatch` decode, call
`Grader.agrade`, encode; a malformed request (empty gold, oversize response or batch, bad
timeout) is answered INVALID_ARGUMENT with a message that says what to change, and loses nothing
else in the batch because the whole batch is checked before any grading starts.
`serve(...)` runs a server until cancelled (the CLI's `serve`).

Access: with `token`, every call but the health check needs `authorization: Bearer <token>`
(UNAUTHENTICATED otherwise; `rstar2_proto.auth`). Binds loopback by default; any other host
without a token is refused (`InsecureBindError`) unless `insecure`. TLS when given a PEM
certificate and key.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rstar2_proto.auth import check_bind, server_credentials, server_interceptors
from rstar2_proto.verify.v1 import verify_pb2, verify_pb2_grpc
from rstar2_verify._wire import check_request, grade_to_proto
from rstar2_verify.config import VerifyConfig
from rstar2_verify.grader import Grader

__all__ = ["SERVICE_NAME", "VerifyServer", "VerifyServicer", "serve"]

SERVICE_NAME = "rstar2_proto.verify.v1.VerifyService"
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class VerifyServicer(verify_pb2_grpc.VerifyServiceServicer):
    """Thin: validate, grade, encode."""

    def __init__(self, grader: Grader) -> None:
        self.grader = grader

    async def _one(self, request: verify_pb2.GradeRequest) -> verify_pb2.GradeResponse:
        grade = await self.grader.agrade(request.response, request.gold, request.timeout_s or None)
        return grade_to_proto(grade, request.request_id)

    async def Grade(
        self, request: verify_pb2.GradeRequest, context: grpc.aio.ServicerContext
    ) -> verify_pb2.GradeResponse:
        problem = check_request(request, self.grader.config)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return await self._one(request)

    async def GradeBatch(
        self, request: verify_pb2.GradeBatchRequest, context: grpc.aio.ServicerContext
    ) -> verify_pb2.GradeBatchResponse:
        limit = self.grader.config.max_batch
        if len(request.requests) > limit:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"batch of {len(request.requests)} exceeds {limit} requests; split it",
            )
        for index, item in enumerate(request.requests):
            problem = check_request(item, self.grader.config)
            if problem is not None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"requests[{index}]: {problem}"
                )
        grades = await asyncio.gather(*(self._one(item) for item in request.requests))
        return verify_pb2.GradeBatchResponse(grades=grades)


class VerifyServer:
    """A running verify service: `await start()`, `.port`, `await stop()`; async context manager."""

    def __init__(
        self,
        config: VerifyConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        insecure: bool = False,
    ):
        """`token`: callers must send it; `tls_cert_file`/`tls_key_file`: PEM pair for TLS;
        `insecure`: allow a non-loopback `host` with no token."""
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        self.config = config or VerifyConfig()
        self.host = host
        self.requested_port = port
        self._token = token
        self._tls = (tls_cert_file, tls_key_file) if tls_cert_file and tls_key_file else None
        self._insecure = insecure
        self.port = 0
        self.grader = Grader(self.config)
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()  # pyright: ignore[reportAttributeAccessIssue]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind, start the workers, and report SERVING; raises RuntimeError when it cannot bind
        (or read the TLS pair), InsecureBindError for a tokenless non-loopback host."""
        check_bind(self.host, self._token, self._insecure)
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ]
        server = grpc.aio.server(options=options, interceptors=server_interceptors(self._token))
        verify_pb2_grpc.add_VerifyServiceServicer_to_server(VerifyServicer(self.grader), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"{self.host}:{self.requested_port}"
        try:
            if self._tls is not None:
                credentials = server_credentials(*self._tls)
                self.port = server.add_secure_port(address, credentials)
            else:
                self.port = server.add_insecure_port(address)
        except OSError as exc:
            raise RuntimeError(f"cannot read the TLS pair: {exc}") from None
        except RuntimeError as exc:
            raise RuntimeError(f"cannot bind {self.host}:{self.requested_port}: {exc}") from None
        self.grader.start()
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            await self._health.enter_graceful_shutdown()
            await self._server.stop(grace_s)
            self._server = None
        self.grader.close()

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def __aenter__(self) -> VerifyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve(
    config: VerifyConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    ready: asyncio.Event | None = None,
) -> None:
    """Run a server until cancelled; prints nothing (the CLI prints the address)."""
    server = VerifyServer(config, host, port)
    await server.start()
    try:
        if ready is not None:
            ready.set()
        await server.wait()
    finally:
        await server.stop()

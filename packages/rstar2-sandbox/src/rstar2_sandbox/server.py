"""The sandbox.v1 gRPC server on grpc.aio: a thin servicer over `LocalSandbox`.

Contract. `SandboxServer(config)` starts the warm pool, then serves Execute, ExecuteBatch,
ExecuteStream (many calls over one stream, answered in completion order), Info and CloseSession,
plus the standard grpc.health.v1 service. Bad input is INVALID_ARGUMENT with the reason (an
undecodable message, invalid UTF-8 included, is caught here rather than becoming INTERNAL); a full
queue is RESOURCE_EXHAUSTED; a missing or wrong token is UNAUTHENTICATED (`rstar2_proto.auth`;
health checks stay open). In batches and streams a
bad item is answered as a REJECTED result so that the others still run. A caller's deadline is
honoured: when it expires the call is cancelled and its child killed. `stop(grace)` refuses new
calls, lets running ones finish for `grace` seconds and cancels the rest (their callers get
CANCELLED), then closes the pool. Binds loopback unless told otherwise, and refuses any other
host without a token unless `insecure`; TLS when given a pair.
Limits are the server's: a request asking more memory, output or time than its maxima is
INVALID_ARGUMENT. A session id is scoped to its caller: the owner is the caller's token when one
is sent, else its connection (`context.peer()`), so nobody else can use or close it. Info
carries a warning when the pool runs with weak isolation.

With `http_port` set, the same pool also answers SandboxFusion's and code-judge's HTTP APIs on
that port of the same host, under the same token (`rstar2_sandbox.http_api`); it stops first.

Not covered: rate limits per caller, and authorisation beyond one shared token.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import _async as health_aio  # pyright: ignore[reportAttributeAccessIssue]
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rstar2_proto.auth import check_bind, server_credentials, server_interceptors
from rstar2_proto.sandbox.v1 import sandbox_pb2 as pb
from rstar2_sandbox import _wire
from rstar2_sandbox.config import ServerConfig
from rstar2_sandbox.execution import ExecutionResult, ExecutionStatus
from rstar2_sandbox.local import LocalSandbox, RequestError, SandboxBusyError

if TYPE_CHECKING:
    from rstar2_sandbox.http_api import HttpApi

logger = logging.getLogger(__name__)
SERVICE = "rstar2_proto.sandbox.v1.SandboxService"


class _Undecodable:
    """Stands in for a request the protobuf runtime could not parse."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return _Undecodable(exc)

    return deserialize


def _owner(context: grpc.aio.ServicerContext) -> str:
    """Whose sessions a call may use: its token if it sent one, else its connection."""
    sent = dict(context.invocation_metadata() or ()).get("authorization", "")
    if sent:
        digest = sent.encode() if isinstance(sent, str) else sent
        return "token:" + hashlib.sha256(digest).hexdigest()[:32]
    return "peer:" + context.peer()


class SandboxServicer:
    """Decode, call the pool, encode."""

    def __init__(self, sandbox: LocalSandbox, config: ServerConfig) -> None:
        self.sandbox = sandbox
        self.config = config

    async def _one(self, message: Any, owner: str) -> ExecutionResult:
        """Run one item of a batch or stream; bad or refused items become REJECTED results."""
        if isinstance(message, _Undecodable):
            return _rejected("", f"undecodable request: {message.error}")
        request = _wire.request_from_pb(message)
        try:
            return await self.sandbox.run(
                request,
                memory_bytes=message.memory_bytes,
                max_output_bytes=message.max_output_bytes,
                owner=owner,
            )
        except RequestError as exc:
            return _rejected(request.request_id, f"INVALID_ARGUMENT: {exc}")
        except SandboxBusyError as exc:
            return ExecutionResult(
                status=ExecutionStatus.SANDBOX_ERROR,
                request_id=request.request_id,
                message=f"RESOURCE_EXHAUSTED: {exc}",
            )

    async def Execute(self, message: Any, context: grpc.aio.ServicerContext) -> pb.ExecuteResponse:
        if isinstance(message, _Undecodable):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"undecodable ExecuteRequest (strings must be valid UTF-8): {message.error}",
            )
        try:
            async with asyncio.timeout(context.time_remaining()):
                result = await self.sandbox.run(
                    _wire.request_from_pb(message),
                    memory_bytes=message.memory_bytes,
                    max_output_bytes=message.max_output_bytes,
                    owner=_owner(context),
                )
        except TimeoutError:  # the caller's deadline: the call was cancelled and its child killed
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed")
        except RequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SandboxBusyError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return _wire.result_to_pb(result)

    async def ExecuteBatch(
        self, message: Any, context: grpc.aio.ServicerContext
    ) -> pb.ExecuteBatchResponse:
        if isinstance(message, _Undecodable):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"undecodable ExecuteBatchRequest: {message.error}",
            )
        if len(message.requests) > self.config.max_batch:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"batch of {len(message.requests)} exceeds {self.config.max_batch} requests",
            )
        try:
            async with asyncio.timeout(context.time_remaining()):
                owner = _owner(context)
                results = await asyncio.gather(
                    *(self._one(item, owner) for item in message.requests)
                )
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed")
        return pb.ExecuteBatchResponse(responses=[_wire.result_to_pb(r) for r in results])

    async def ExecuteStream(
        self, messages: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ExecuteResponse]:
        done: asyncio.Queue[ExecutionResult | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        owner = _owner(context)

        async def one(message: Any) -> None:
            await done.put(await self._one(message, owner))

        async def feed() -> None:
            async for message in messages:
                task = asyncio.create_task(one(message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks))
            await done.put(None)

        feeder = asyncio.create_task(feed())
        try:
            while (result := await done.get()) is not None:
                yield _wire.result_to_pb(result)
            await feeder
        finally:
            feeder.cancel()
            for task in list(tasks):
                task.cancel()

    async def Info(self, message: Any, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        c = self.sandbox.config
        active, unavailable = self.sandbox.confinements()
        return pb.InfoResponse(
            version=version("rstar2-sandbox"),
            workers=c.workers,
            confinements=active,
            unavailable=unavailable,
            limits=pb.Limits(
                default_timeout_s=c.default_timeout_s,
                max_timeout_s=c.max_timeout_s,
                memory_bytes=c.memory_bytes,
                max_output_bytes=c.max_output_bytes,
                max_code_bytes=c.max_code_bytes,
                max_queue=c.max_queue,
                max_sessions=c.max_sessions,
                session_cpu_s=c.session_cpu_s,
            ),
            in_flight=self.sandbox.in_flight,
            queued=self.sandbox.queued,
            preloaded=self.sandbox.preloaded(),
            sessions=self.sandbox.session_count,
            warning=self.sandbox.isolation_warning(),
        )

    async def CloseSession(
        self, message: Any, context: grpc.aio.ServicerContext
    ) -> pb.CloseSessionResponse:
        if not message.session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is empty")
        closed = await self.sandbox.close_session(message.session_id, owner=_owner(context))
        return pb.CloseSessionResponse(closed=closed)


def _rejected(request_id: str, message: str) -> ExecutionResult:
    return ExecutionResult(status=ExecutionStatus.REJECTED, request_id=request_id, message=message)


def _handlers(servicer: SandboxServicer) -> grpc.GenericRpcHandler:
    unary, stream = grpc.unary_unary_rpc_method_handler, grpc.stream_stream_rpc_method_handler
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Execute": unary(
                servicer.Execute,
                request_deserializer=_tolerant(pb.ExecuteRequest.FromString),
                response_serializer=pb.ExecuteResponse.SerializeToString,
            ),
            "ExecuteBatch": unary(
                servicer.ExecuteBatch,
                request_deserializer=_tolerant(pb.ExecuteBatchRequest.FromString),
                response_serializer=pb.ExecuteBatchResponse.SerializeToString,
            ),
            "ExecuteStream": stream(
                servicer.ExecuteStream,
                request_deserializer=_tolerant(pb.ExecuteRequest.FromString),
                response_serializer=pb.ExecuteResponse.SerializeToString,
            ),
            "Info": unary(
                servicer.Info,
                request_deserializer=pb.InfoRequest.FromString,
                response_serializer=pb.InfoResponse.SerializeToString,
            ),
            "CloseSession": unary(
                servicer.CloseSession,
                request_deserializer=pb.CloseSessionRequest.FromString,
                response_serializer=pb.CloseSessionResponse.SerializeToString,
            ),
        },
    )


class SandboxServer:
    """The warm pool behind a grpc.aio server."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.sandbox = LocalSandbox(self.config.sandbox)
        self.port = 0
        self._server = grpc.aio.server(
            interceptors=server_interceptors(self.config.token),
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )
        self._health = health_aio.HealthServicer()
        self._http: HttpApi | None = None
        self.http_port = 0

    async def start(self) -> int:
        """Bind (OSError if it cannot), start the pool (RuntimeError if isolation is required and
        missing), then serve; returns the bound port. InsecureBindError (before anything starts)
        for a non-loopback host with no token, unless `insecure`."""
        check_bind(self.config.host, self.config.token, self.config.insecure)
        address = f"{self.config.host}:{self.config.port}"
        try:
            if self.config.tls_cert_file and self.config.tls_key_file:
                credentials = server_credentials(
                    self.config.tls_cert_file, self.config.tls_key_file
                )
                self.port = self._server.add_secure_port(address, credentials)
            else:
                self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(
                f"cannot bind {address} (in use, or not an address of this host)"
            ) from exc
        await self.sandbox.start()
        active, unavailable = self.sandbox.confinements()
        logger.info("confinements active: %s", ", ".join(active))
        for name, why in unavailable.items():
            (logger.info if name == "cgroup" else logger.warning)(
                "confinement %s unavailable: %s", name, why
            )
        servicer = SandboxServicer(self.sandbox, self.config)
        self._server.add_generic_rpc_handlers((_handlers(servicer),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._server.start()
        if self.config.http_port is not None:
            from rstar2_sandbox.http_api import HttpApi

            self._http = HttpApi(self.sandbox, self.config.token, self.config.http_max_body_bytes)
            try:
                self.http_port = await self._http.start(self.config.host, self.config.http_port)
            except OSError as exc:
                await self._server.stop(0)
                await self.sandbox.close()
                raise OSError(
                    f"cannot bind HTTP {self.config.host}:{self.config.http_port}: {exc.strerror}"
                ) from exc
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE):
            await self._health.set(name, serving)
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new calls, let running ones finish for `grace` s, cancel the rest, close."""
        for name in ("", SERVICE):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._http is not None:
            await self._http.stop()
        await self._server.stop(self.config.grace_s if grace is None else grace)
        await self.sandbox.close()

    async def wait(self) -> None:
        await self._server.wait_for_termination()

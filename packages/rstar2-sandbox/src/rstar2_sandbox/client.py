"""`SandboxClient`: the `Sandbox` Protocol over one or many sandbox.v1 servers.

Contract. Each stateless call goes to the live server with the fewest calls outstanding from
this client. A server that answers UNAVAILABLE (down, restarting, unreachable) is set aside for
`retry_after_s` and the call is retried on another: safe, since a stateless call that never reached
a server ran nowhere, and one that died with its server left nothing behind. RESOURCE_EXHAUSTED
also moves the call to another server. A session always goes to the same server (rendezvous
hashing over the configured addresses) and is never retried elsewhere, since its state lives
there. Errors are results: INVALID_ARGUMENT comes back as REJECTED (the request was bad); a
refusal or failure of every server (full, down, deadline) as SANDBOX_ERROR, which a trainer does
not count as the model's tool error, with the servers' messages. Not covered: discovering servers (pass the addresses).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

import grpc
from pydantic import BaseModel, ConfigDict, Field

from rstar2_proto.sandbox.v1 import sandbox_pb2 as pb
from rstar2_proto.sandbox.v1 import sandbox_pb2_grpc as pb_grpc
from rstar2_sandbox import _wire
from rstar2_sandbox.config import SandboxConfig
from rstar2_sandbox.execution import ExecutionRequest, ExecutionResult, ExecutionStatus

_MOVE_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
_WALL_CEILING_FACTOR = SandboxConfig.model_fields["wall_ceiling_factor"].default


class ServerInfo(BaseModel):
    """What a server says about itself (the Info RPC)."""

    model_config = ConfigDict(frozen=True)

    address: str
    version: str
    workers: int
    confinements: list[str]
    unavailable: dict[str, str]
    preloaded: list[str]
    in_flight: int
    queued: int
    sessions: int
    limits: dict[str, float] = Field(default_factory=dict)
    warning: str = Field(default="", description="Set when the server runs with weak isolation.")


class _Server:
    def __init__(self, address: str, channel: grpc.aio.Channel) -> None:
        self.address = address
        self.channel = channel
        self.stub = pb_grpc.SandboxServiceStub(channel)
        self.outstanding = 0
        self.down_until = 0.0


class SandboxClient:
    """An async client over one or many servers, with load spreading and failover."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        retry_after_s: float = 1.0,
        deadline_margin_s: float = 30.0,
        wall_ceiling_factor: float = _WALL_CEILING_FACTOR,
    ) -> None:
        """Each RPC's deadline is its timeout times `wall_ceiling_factor` (the servers' own: a
        call slowed by a busy host may run that long before it is stopped) plus
        `deadline_margin_s` (queue and wire)."""
        addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not addresses:
            raise ValueError("SandboxClient needs at least one server address")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._retry_after_s = retry_after_s
        self._margin = deadline_margin_s
        self._ceiling = wall_ceiling_factor
        # A connection of its own (no subchannel shared with other clients in this process):
        # servers scope sessions to the caller's token or connection.
        options = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self._servers = []
        for address in addresses:
            if root_certificates is not None:
                creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
                channel = grpc.aio.secure_channel(address, creds, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._servers.append(_Server(address, channel))

    def _session_server(self, session_id: str) -> _Server:
        def weight(server: _Server) -> bytes:
            return hashlib.sha256(f"{server.address}/{session_id}".encode()).digest()

        return max(self._servers, key=weight)

    def _order(self) -> list[_Server]:
        now = time.monotonic()
        live = [s for s in self._servers if s.down_until <= now]
        down = [s for s in self._servers if s.down_until > now]
        return sorted(live, key=lambda s: s.outstanding) + sorted(down, key=lambda s: s.down_until)

    async def _call(self, server: _Server, message: pb.ExecuteRequest, timeout: float | None):
        server.outstanding += 1
        try:
            return await server.stub.Execute(
                message,
                timeout=(timeout or 60.0) * self._ceiling + self._margin,
                metadata=self._metadata,
            )
        finally:
            server.outstanding -= 1

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run one call; transport failures and refusals come back as results."""
        message = _wire.request_to_pb(request)
        if request.session_id is not None:
            candidates = [self._session_server(request.session_id)]
        else:
            candidates = self._order()
        errors: list[str] = []
        code = grpc.StatusCode.UNAVAILABLE
        for server in candidates:
            try:
                return _wire.result_from_pb(await self._call(server, message, request.timeout_s))
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                errors.append(f"{server.address}: {code.name}: {exc.details()}")
                if code == grpc.StatusCode.UNAVAILABLE:
                    server.down_until = time.monotonic() + self._retry_after_s
                if code not in _MOVE_ON:
                    break
        # Only a request the servers judged bad is the caller's fault; refusals and failures
        # of the servers themselves are the sandbox's.
        status = ExecutionStatus.SANDBOX_ERROR
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            status = ExecutionStatus.REJECTED
        return ExecutionResult(
            status=status, request_id=request.request_id, message="; ".join(errors)
        )

    async def execute_many(self, requests: Sequence[ExecutionRequest]) -> list[ExecutionResult]:
        """Run many calls concurrently over the servers; results in request order."""
        return list(await asyncio.gather(*(self.execute(r) for r in requests)))

    async def close_session(self, session_id: str) -> bool:
        """Close a session on the server that holds it; False if it was not open."""
        server = self._session_server(session_id)
        reply = await server.stub.CloseSession(
            pb.CloseSessionRequest(session_id=session_id), timeout=10, metadata=self._metadata
        )
        return reply.closed

    async def info(self) -> list[ServerInfo]:
        """Info from every server that answers."""
        infos = []
        for server in self._servers:
            try:
                reply = await server.stub.Info(
                    pb.InfoRequest(), timeout=10, metadata=self._metadata
                )
            except grpc.aio.AioRpcError:
                continue
            limits = reply.limits
            infos.append(
                ServerInfo(
                    address=server.address,
                    version=reply.version,
                    workers=reply.workers,
                    confinements=list(reply.confinements),
                    unavailable=dict(reply.unavailable),
                    preloaded=list(reply.preloaded),
                    in_flight=reply.in_flight,
                    queued=reply.queued,
                    sessions=reply.sessions,
                    limits={f.name: v for f, v in limits.ListFields()},
                    warning=reply.warning,
                )
            )
        return infos

    async def close(self) -> None:
        for server in self._servers:
            await server.channel.close()

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

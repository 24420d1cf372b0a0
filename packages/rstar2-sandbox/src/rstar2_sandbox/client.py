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

Retry (`retry_for_s` > 0). A stateless call that every server refused as UNAVAILABLE (all down,
e.g. the one server killed while the call ran) is sent again after a short backoff (0.1 s,
doubling to 2 s) until `retry_for_s` has passed since its first failure; a call a live server
answered with SANDBOX_ERROR (its worker was lost, every server was full) is sent again up to
`max_fault_retries` times, so a call that kills what runs it cannot do so forever. Before each
retry `_revive()` runs: a hook for a subclass that owns its server (`backends.ChildSandbox`
restarts a dead child there); it returns False when no server can come back, which ends the
retries at once. Channels reconnect within 2 s of a server coming back on the same address.
`retried` counts the calls sent more than once (failover to another server included). Sessions
are never retried: their state died with their server.
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
# Reconnect soon after a server comes back on the same address (gRPC's own backoff grows to 2 min).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


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
        retry_for_s: float = 0.0,
        max_fault_retries: int = 2,
    ) -> None:
        """Each RPC's deadline is its timeout times `wall_ceiling_factor` (the servers' own: a
        call slowed by a busy host may run that long before it is stopped) plus
        `deadline_margin_s` (queue and wire); `retry_for_s`, `max_fault_retries`: see the module
        docstring (0: no retry)."""
        addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not addresses:
            raise ValueError("SandboxClient needs at least one server address")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._retry_after_s = retry_after_s
        self._margin = deadline_margin_s
        self._ceiling = wall_ceiling_factor
        self._retry_for_s = retry_for_s
        self._max_fault_retries = max_fault_retries
        self._root_certificates = root_certificates
        self.retried = 0  # calls sent more than once
        self._servers = [self._connect(address) for address in addresses]

    def _connect(self, address: str) -> _Server:
        # A connection of its own (no subchannel shared with other clients in this process):
        # servers scope sessions to the caller's token or connection.
        options = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.use_local_subchannel_pool", 1),
            *CHANNEL_OPTIONS,
        ]
        if self._root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
            return _Server(address, grpc.aio.secure_channel(address, creds, options=options))
        return _Server(address, grpc.aio.insecure_channel(address, options=options))

    async def _repoint(self, old: str, new: str) -> None:
        """Reach the server that was at `old` at `new` from now on (a restarted server)."""
        for i, server in enumerate(self._servers):
            if server.address == old:
                self._servers[i] = self._connect(new)
                await server.channel.close()

    async def _revive(self) -> bool:
        """Called before a retry; False when no server can come back (no more retries)."""
        return True

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
        first_failure: float | None = None
        sends = faults = 0
        while True:
            result, code, tried = await self._attempt(request, message)
            if sends <= 1 < sends + tried:
                self.retried += 1  # once per call, when it is first sent again
            sends += tried
            if request.session_id is not None or self._retry_for_s <= 0:
                return result
            if result.status != ExecutionStatus.SANDBOX_ERROR:
                return result
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if code is None or code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                faults += 1  # a live server answered: its worker was lost, or all were full
                if faults > self._max_fault_retries:
                    return result
            elif code != grpc.StatusCode.UNAVAILABLE:
                return result  # a deadline or an internal error: the call may have run
            if now - first_failure >= self._retry_for_s:
                return result
            await asyncio.sleep(min(0.1 * 2 ** min(sends, 5), 2.0))
            if not await self._revive():
                return result

    async def _attempt(
        self, request: ExecutionRequest, message: pb.ExecuteRequest
    ) -> tuple[ExecutionResult, grpc.StatusCode | None, int]:
        """One pass over the candidate servers: the result, the last RPC error's code (None
        when a server answered) and how many servers the call was sent to."""
        if request.session_id is not None:
            candidates = [self._session_server(request.session_id)]
        else:
            candidates = self._order()
        errors: list[str] = []
        code = grpc.StatusCode.UNAVAILABLE
        sent = 0
        for server in candidates:
            sent += 1
            try:
                reply = await self._call(server, message, request.timeout_s)
                return _wire.result_from_pb(reply), None, sent
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
        result = ExecutionResult(
            status=status, request_id=request.request_id, message="; ".join(errors)
        )
        return result, code, sent

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

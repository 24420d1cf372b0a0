"""`VerifyClient`: the async client of `VerifyService`, returning the same `Grade` as the library.

`grade` and `grade_many` (one GradeBatch call, split into chunks of `batch_size`) raise
`grpc.aio.AioRpcError` when the server answers an error (INVALID_ARGUMENT for malformed input);
`health` returns whether the server reports SERVING. `token` is sent with every call (a server
started with `--token-file` answers UNAUTHENTICATED without it); `root_certificates` (PEM) turns
on TLS.

Retry (`retry_for_s` > 0): a call the server refuses as UNAVAILABLE (down, restarting on the same
address, as the trainer's supervised servers do) is sent again after a short backoff (0.1 s,
doubling to 2 s) until `retry_for_s` has passed since its first failure, then the error is
raised; grading is a pure function of its input, so a call cut off with its server runs again
with the same verdict. Channels reconnect within 2 s of a server coming back. `retried` counts
the calls sent more than once. Other errors (INVALID_ARGUMENT, a deadline) are raised at once.

`VerifyPool` grades over several servers (a cluster's nodes): each call goes to the one with the
fewest outstanding calls and fails over to the next when one is UNAVAILABLE; when every one is,
it waits and tries them again, as one client does, for `retry_for_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rstar2_proto.auth import open_channel
from rstar2_proto.verify.v1 import verify_pb2, verify_pb2_grpc
from rstar2_verify._wire import grade_from_proto, request_to_proto
from rstar2_verify.grader import Grade

__all__ = ["VerifyClient", "VerifyPool"]

T = TypeVar("T")

# Reconnect soon after a server comes back on the same address (gRPC's own backoff grows to 2 min).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _unavailable(exc: grpc.aio.AioRpcError) -> bool:
    return exc.code() == grpc.StatusCode.UNAVAILABLE


async def _with_retry(call: Callable[[], Awaitable[T]], retry_for_s: float) -> tuple[T, bool]:
    """`call()`, sent again while it fails UNAVAILABLE, for up to `retry_for_s` seconds after
    its first failure; its value and whether it was sent more than once."""
    first: float | None = None
    tries = 0
    while True:
        try:
            return await call(), tries > 0
        except grpc.aio.AioRpcError as exc:
            now = time.monotonic()
            first = now if first is None else first
            if not _unavailable(exc) or now - first >= retry_for_s:
                raise
        tries += 1
        await asyncio.sleep(min(0.1 * 2 ** min(tries, 5), 2.0))


class VerifyClient:
    """`async with VerifyClient("127.0.0.1:50051") as client: await client.grade(r, g)`."""

    def __init__(
        self,
        address: str,
        batch_size: int = 1024,
        timeout_s: float = 600.0,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        retry_for_s: float = 0.0,
    ) -> None:
        self.address = address
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self.retried = 0  # calls sent more than once
        self._channel = open_channel(
            address,
            token=token,
            root_certificates=root_certificates,
            options=[
                ("grpc.max_receive_message_length", 256 * 1024 * 1024),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
                *CHANNEL_OPTIONS,
            ],
        )
        self._stub = verify_pb2_grpc.VerifyServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def __aenter__(self) -> VerifyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def health(self) -> bool:
        check = self._health.Check  # pyright: ignore[reportAttributeAccessIssue]
        reply = await check(health_pb2.HealthCheckRequest(), timeout=self.timeout_s)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def _send(self, call: Callable[[], Awaitable[T]]) -> T:
        value, again = await _with_retry(call, self.retry_for_s)
        self.retried += again
        return value

    async def grade(self, response: str, gold: str, timeout_s: float = 0.0) -> Grade:
        request = request_to_proto(response, gold, timeout_s=timeout_s)
        reply = await self._send(lambda: self._stub.Grade(request, timeout=self.timeout_s))
        return grade_from_proto(reply)

    async def grade_many(self, pairs: Iterable[tuple[str, str]]) -> list[Grade]:
        requests = [request_to_proto(r, g, str(k)) for k, (r, g) in enumerate(pairs)]
        grades: list[Grade] = []
        for start in range(0, len(requests), self.batch_size):
            batch = verify_pb2.GradeBatchRequest(requests=requests[start : start + self.batch_size])
            reply = await self._send(
                lambda b=batch: self._stub.GradeBatch(b, timeout=self.timeout_s)
            )
            grades.extend(grade_from_proto(g) for g in reply.grades)
        return grades


class VerifyPool:
    """Grades over many verify servers: least outstanding first, fail over when one is down."""

    def __init__(
        self, addresses: Sequence[str], token: str | None = None, retry_for_s: float = 0.0
    ) -> None:
        if not addresses:
            raise ValueError("VerifyPool needs at least one address")
        self._clients = [VerifyClient(a, token=token) for a in addresses]
        self._outstanding = [0] * len(self._clients)
        self.retry_for_s = retry_for_s
        self.retried = 0  # calls sent more than once (to another server, or again)

    async def grade_many(self, pairs: Sequence[tuple[str, str]]) -> list[Grade]:
        call = lambda: self._over_servers(pairs)  # noqa: E731
        (grades, moved), again = await _with_retry(call, self.retry_for_s)
        self.retried += moved or again
        return grades

    async def _over_servers(self, pairs: Sequence[tuple[str, str]]) -> tuple[list[Grade], bool]:
        """One pass, the least busy server first, the next when one is UNAVAILABLE: the grades
        and whether the call moved to another server."""
        order = sorted(range(len(self._clients)), key=lambda i: self._outstanding[i])
        for k, i in enumerate(order):
            self._outstanding[i] += 1
            try:
                return await self._clients[i].grade_many(pairs), k > 0
            except grpc.aio.AioRpcError as exc:
                if not _unavailable(exc) or k == len(order) - 1:
                    raise
            finally:
                self._outstanding[i] -= 1
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

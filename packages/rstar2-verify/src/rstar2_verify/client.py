"""`VerifyClient`: the async client of `VerifyService`, returning the same `Grade` as the library.

`grade` and `grade_many` (one GradeBatch call, split into chunks of `batch_size`) raise
`grpc.aio.AioRpcError` when the server answers an error (INVALID_ARGUMENT for malformed input);
`health` returns whether the server reports SERVING. `token` is sent with every call (a server
started with `--token-file` answers UNAUTHENTICATED without it); `root_certificates` (PEM) turns
on TLS. It does not retry.

`VerifyPool` grades over several servers (a cluster's nodes): each call goes to the one with the
fewest outstanding calls and fails over to the next when one is UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rstar2_proto.auth import open_channel
from rstar2_proto.verify.v1 import verify_pb2, verify_pb2_grpc
from rstar2_verify._wire import grade_from_proto, request_to_proto
from rstar2_verify.grader import Grade

__all__ = ["VerifyClient", "VerifyPool"]


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
    ) -> None:
        self.address = address
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self._channel = open_channel(
            address,
            token=token,
            root_certificates=root_certificates,
            options=[
                ("grpc.max_receive_message_length", 256 * 1024 * 1024),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
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

    async def grade(self, response: str, gold: str, timeout_s: float = 0.0) -> Grade:
        request = request_to_proto(response, gold, timeout_s=timeout_s)
        reply = await self._stub.Grade(request, timeout=self.timeout_s)
        return grade_from_proto(reply)

    async def grade_many(self, pairs: Iterable[tuple[str, str]]) -> list[Grade]:
        requests = [request_to_proto(r, g, str(k)) for k, (r, g) in enumerate(pairs)]
        grades: list[Grade] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            reply = await self._stub.GradeBatch(
                verify_pb2.GradeBatchRequest(requests=chunk), timeout=self.timeout_s
            )
            grades.extend(grade_from_proto(g) for g in reply.grades)
        return grades


class VerifyPool:
    """Grades over many verify servers: least outstanding first, fail over when one is down."""

    def __init__(self, addresses: Sequence[str], token: str | None = None) -> None:
        if not addresses:
            raise ValueError("VerifyPool needs at least one address")
        self._clients = [VerifyClient(a, token=token) for a in addresses]
        self._outstanding = [0] * len(self._clients)

    async def grade_many(self, pairs: Sequence[tuple[str, str]]) -> list[Grade]:
        order = sorted(range(len(self._clients)), key=lambda i: self._outstanding[i])
        for k, i in enumerate(order):
            self._outstanding[i] += 1
            try:
                return await self._clients[i].grade_many(pairs)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or k == len(order) - 1:
                    raise
            finally:
                self._outstanding[i] -= 1
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

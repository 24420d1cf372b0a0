"""The per-run token: files written owner-only and read with one-line errors, a real grpc.aio
server on 127.0.0.1:0 that refuses calls of every shape without the token and serves them with
it, and the bind check that keeps tokenless servers on loopback."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rstar2_proto.auth import (
    DENIED,
    InsecureBindError,
    TokenFileError,
    TokenInterceptor,
    call_metadata,
    check_bind,
    is_loopback,
    new_token,
    open_channel,
    read_token_file,
    write_token_file,
)

SERVICE = "test.Echo"


def test_a_written_token_file_is_owner_only_and_reads_back(tmp_path: Path) -> None:
    old = os.umask(0)  # the mode must not depend on the caller's umask
    try:
        path = tmp_path / "token"
        token = write_token_file(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(path) == token
    assert len(token) >= 40 and token != new_token()
    assert write_token_file(path, "second") == "second" and read_token_file(path) == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["token"]  # no temporary left behind


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (None, 0o600, "cannot read token file {path}: No such file or directory"),
        (b"\n", 0o600, "token file {path} is empty"),
        (b"abc def\n", 0o600, "token in {path} must not contain whitespace"),
        (b"\xff\xfe", 0o600, "token file {path} does not hold an ASCII token"),
        (
            b"s3cret\n",
            0o644,
            "token file {path} is readable by others (mode 0644): chmod 600 {path}",
        ),
    ],
)
def test_a_bad_token_file_is_one_line(tmp_path: Path, content, mode, message) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    with pytest.raises(TokenFileError) as info:
        read_token_file(path)
    assert str(info.value) == message.format(path=path)


def test_a_directory_is_not_a_token_file(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    with pytest.raises(TokenFileError, match="is not a regular file"):
        read_token_file(tmp_path)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("no-such-host.invalid", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_tokenless_server_stays_on_loopback_unless_insecure() -> None:
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "t0ken")
    check_bind("0.0.0.0", None, insecure=True)
    with pytest.raises(InsecureBindError) as info:
        check_bind("0.0.0.0", None)
    assert str(info.value) == (
        "refusing to listen on 0.0.0.0 without a token: pass --token-file PATH "
        "(or --insecure to accept calls from anyone who can reach this port)"
    )


def test_the_comparison_reads_only_the_authorization_entry() -> None:
    guard = TokenInterceptor("abc")
    assert guard.allows([("x", "y"), ("authorization", "Bearer abc")])
    assert guard.allows([("authorization", b"Bearer abc")])
    for metadata in (None, [], [("authorization", "Bearer abd")], [("authorization", "abc")]):
        assert not guard.allows(metadata)
    assert call_metadata("abc") == (("authorization", "Bearer abc"),)
    assert call_metadata(None) is None


# ---------------------------------------------------------------- a real server


class _Echo:
    """Counts the requests its handlers read, so a refused call is seen to read none."""

    def __init__(self) -> None:
        self.read = 0

    async def unary(self, request: bytes, context: Any) -> bytes:
        self.read += 1
        return request

    async def client_stream(self, requests: Any, context: Any) -> bytes:
        parts = []
        async for r in requests:
            self.read += 1
            parts.append(r)
        return b"".join(parts)

    async def server_stream(self, request: bytes, context: Any) -> Any:
        self.read += 1
        for b in request:
            yield bytes([b])

    async def both(self, requests: Any, context: Any) -> Any:
        async for r in requests:
            self.read += 1
            yield r


async def _serve(token: str | None) -> tuple[grpc.aio.Server, int, _Echo]:
    echo = _Echo()
    interceptors = [TokenInterceptor(token)] if token else []
    server = grpc.aio.server(interceptors=interceptors)
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(echo.unary),
        "ClientStream": grpc.stream_unary_rpc_method_handler(echo.client_stream),
        "ServerStream": grpc.unary_stream_rpc_method_handler(echo.server_stream),
        "Both": grpc.stream_stream_rpc_method_handler(echo.both),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, echo


async def _call_all(channel: grpc.aio.Channel) -> list[Any]:
    """Each of the four call shapes; an error comes back as (code, details)."""

    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"ab", b"cd"):
            yield part

    calls = [
        lambda: channel.unary_unary(f"/{SERVICE}/Unary")(b"hi", timeout=10),
        lambda: channel.stream_unary(f"/{SERVICE}/ClientStream")(chunks(), timeout=10),
        lambda: _collect(channel.unary_stream(f"/{SERVICE}/ServerStream")(b"xy", timeout=10)),
        lambda: _collect(channel.stream_stream(f"/{SERVICE}/Both")(chunks(), timeout=10)),
    ]
    out: list[Any] = []
    for call in calls:
        try:
            out.append(await call())
        except grpc.aio.AioRpcError as exc:
            out.append((exc.code(), exc.details()))
    return out


async def _collect(call: Any) -> list[bytes]:
    return [m async for m in call]


def test_every_call_shape_needs_the_token() -> None:
    async def main() -> tuple[list[Any], list[Any], list[Any], int]:
        server, port, echo = await _serve("right-token")
        target = f"127.0.0.1:{port}"
        try:
            results = []
            for token in (None, "wrong-token"):
                async with open_channel(target, token=token) as channel:
                    results.append(await _call_all(channel))
            refused_reads = echo.read
            async with open_channel(target, token="right-token") as channel:
                allowed = await _call_all(channel)
        finally:
            await server.stop(None)
        return results[0], results[1], allowed, refused_reads

    missing, wrong, allowed, refused_reads = asyncio.run(main())
    denied = (grpc.StatusCode.UNAUTHENTICATED, DENIED)
    assert missing == [denied] * 4
    assert wrong == [denied] * 4
    assert refused_reads == 0  # no handler read a request of a refused call
    assert allowed == [b"hi", b"abcd", [b"x", b"y"], [b"ab", b"cd"]]


def test_a_server_without_a_token_serves_anyone() -> None:
    async def main() -> list[Any]:
        server, port, _ = await _serve(None)
        try:
            async with open_channel(f"127.0.0.1:{port}", token="any") as channel:
                return await _call_all(channel)
        finally:
            await server.stop(None)

    assert asyncio.run(main()) == [b"hi", b"abcd", [b"x", b"y"], [b"ab", b"cd"]]

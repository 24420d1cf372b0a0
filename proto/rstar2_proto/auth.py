"""Per-run bearer tokens for the rstar2 gRPC services (sandbox, verify, rollout).

Contract. A run has one secret token. Whoever starts the services (the trainer) calls
`new_token()`, writes it with `write_token_file(path)` (mode 0600, owner only) and starts each
server with `--token-file PATH`; the token itself never appears on a command line or in an
environment variable, so it is not in `/proc/<pid>/cmdline` or `/proc/<pid>/environ`.

- Server: `TokenInterceptor(token)` answers every call that lacks `authorization: Bearer <token>`
  with UNAUTHENTICATED ("missing or wrong token: pass the run's token file with --token-file"),
  before the handler runs or reads a single request message; the comparison is constant-time
  (`hmac.compare_digest`). The standard health service (`/grpc.health.v1.Health/`) stays open:
  it tells only SERVING or NOT_SERVING, and readiness probes (the trainer's, a load balancer's)
  have no token. `check_bind(host, token, insecure)` refuses a non-loopback bind without a token
  (`InsecureBindError`) unless the operator passed `--insecure`. `server_credentials(cert, key)`
  reads a PEM pair for TLS.
- Client: `open_channel(target, token=..., root_certificates=...)` is a `grpc.aio` channel that
  sends the token with every call (TLS when given root certificates); `call_metadata(token)` is
  the same metadata for a stub call made by hand.
- `read_token_file(path)` raises `TokenFileError` with a one-line message: missing or unreadable
  file, empty file, or a file that group or others may read.

Not covered: per-caller identities or authorisation (one shared secret per run), token rotation,
mutual TLS. Only `grpcio` is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "DENIED",
    "METADATA_KEY",
    "InsecureBindError",
    "TokenFileError",
    "TokenInterceptor",
    "call_metadata",
    "check_bind",
    "client_interceptors",
    "is_loopback",
    "new_token",
    "open_channel",
    "read_token_file",
    "server_credentials",
    "server_interceptors",
    "write_token_file",
]

METADATA_KEY = "authorization"
DENIED = "missing or wrong token: pass the run's token file with --token-file"
_HEALTH = "/grpc.health.v1.Health/"
_MAX_TOKEN_BYTES = 4096


class TokenFileError(ValueError):
    """The token file cannot be used; the message is one line that says why."""


class InsecureBindError(ValueError):
    """A server was asked to listen beyond loopback with no token."""


def new_token() -> str:
    """A fresh random token: 256 bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def write_token_file(path: str | os.PathLike[str], token: str | None = None) -> str:
    """Write `token` (a new one when None) to `path` with mode 0600; return the token.

    The file is created owner-only from the start (never briefly world-readable); an existing
    file is replaced atomically.
    """
    token = token if token is not None else new_token()
    _check_token(token, str(path))
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return token


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in `path`; TokenFileError (one line) when it is missing, empty or exposed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TokenFileError(f"token file {path} is not a regular file")
        if mode & 0o077:
            raise TokenFileError(
                f"token file {path} is readable by others (mode {stat.S_IMODE(mode):04o}):"
                f" chmod 600 {path}"
            )
        data = os.read(fd, _MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path} does not hold an ASCII token") from None
    _check_token(token, str(path))
    return token


def _check_token(token: str, where: str) -> None:
    if not token:
        raise TokenFileError(f"token file {where} is empty")
    if len(token) > _MAX_TOKEN_BYTES or not token.isascii() or not token.isprintable():
        raise TokenFileError(f"token in {where} must be printable ASCII, at most 4096 bytes")
    if any(c.isspace() for c in token):
        raise TokenFileError(f"token in {where} must not contain whitespace")


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """Metadata that carries `token` on one call (None: no token)."""
    return ((METADATA_KEY, f"Bearer {token}"),) if token else None


# ---------------------------------------------------------------- server side


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuse, with UNAUTHENTICATED, every call but health checks that lacks the token."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("TokenInterceptor needs a non-empty token")
        self._expected = f"Bearer {token}".encode()

    def allows(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        """True when `metadata` carries the token (constant-time comparison)."""
        sent: str | bytes = b""
        for key, value in metadata or ():
            if key == METADATA_KEY:
                sent = value
                break
        sent_bytes = sent.encode("utf-8", "replace") if isinstance(sent, str) else sent
        return hmac.compare_digest(sent_bytes, self._expected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        details = handler_call_details
        handler = await continuation(details)
        method: str = details.method  # pyright: ignore[reportAttributeAccessIssue]
        if handler is None or method.startswith(_HEALTH):
            return handler
        if self.allows(details.invocation_metadata):  # pyright: ignore[reportAttributeAccessIssue]
            return handler
        return _denial(handler)


# A client that is still writing when the server answers may see INTERNAL instead of the
# server's status (grpc/grpc#36066), so a refused stream is read to its end (not decoded, at most
# _DRAIN_MESSAGES messages or _DRAIN_S seconds) before the status is sent.
_DRAIN_MESSAGES = 64
_DRAIN_S = 2.0


async def _drain(requests: Any) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_DRAIN_S):
            count = 0
            async for _ in requests:
                count += 1
                if count >= _DRAIN_MESSAGES:
                    break


async def _deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


async def _deny_drained(requests: Any, context: grpc.aio.ServicerContext) -> Any:
    await _drain(requests)
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


async def _deny_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)
    yield  # pragma: no cover - makes this an async generator


async def _deny_stream_drained(requests: Any, context: grpc.aio.ServicerContext) -> Any:
    await _drain(requests)
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)
    yield  # pragma: no cover - makes this an async generator


def _ignore(data: bytes) -> None:
    return None


def _denial(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED without decoding or
    handing on any request."""
    out = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny_stream_drained, _ignore, out)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_deny_drained, _ignore, out)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_deny_stream, _ignore, out)
    return grpc.unary_unary_rpc_method_handler(_deny, _ignore, out)


def server_interceptors(token: str | None) -> list[grpc.aio.ServerInterceptor]:
    """`[TokenInterceptor(token)]`, or nothing when there is no token."""
    return [TokenInterceptor(token)] if token else []


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    """TLS credentials from a PEM certificate chain and private key; OSError when unreadable."""
    with open(key_file, "rb") as key:
        private_key = key.read()
    with open(cert_file, "rb") as cert:
        chain = cert.read()
    return grpc.ssl_server_credentials([(private_key, chain)])


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1); False for any other."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, token: str | None, insecure: bool = False) -> None:
    """Raise InsecureBindError when `host` is reachable from other machines and no token guards
    it, unless `insecure` (the operator's explicit `--insecure`)."""
    if token or insecure or is_loopback(host):
        return
    raise InsecureBindError(
        f"refusing to listen on {host} without a token: pass --token-file PATH "
        "(or --insecure to accept calls from anyone who can reach this port)"
    )


# ---------------------------------------------------------------- client side


class _AddToken:
    """Adds the token to the metadata of a call's details."""

    def __init__(self, token: str) -> None:
        self._entry = (METADATA_KEY, f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._entry)
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
        )


# grpc.aio files a channel's interceptor under the first call shape it implements, so each
# shape needs an object of its own.
class _UnaryUnary(_AddToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self._with_token(client_call_details), request)


class _UnaryStream(_AddToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self._with_token(client_call_details), request)


class _StreamUnary(_AddToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return await continuation(self._with_token(client_call_details), request_iterator)


class _StreamStream(_AddToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return await continuation(self._with_token(client_call_details), request_iterator)


def client_interceptors(token: str | None) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors that send `token` with every call of a channel (none when no token)."""
    if not token:
        return []
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]


def open_channel(
    target: str,
    *,
    token: str | None = None,
    root_certificates: bytes | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to `target` that sends `token` with every call; TLS when
    `root_certificates` (PEM) are given, plaintext otherwise."""
    interceptors = client_interceptors(token) or None
    if root_certificates is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.aio.secure_channel(
            target, creds, options=list(options), interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)

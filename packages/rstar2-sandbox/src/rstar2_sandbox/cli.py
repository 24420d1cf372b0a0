"""The `rstar2-sandbox` command: `serve`, `info` and `bench`.

Contract. `serve` runs the gRPC server until SIGTERM or SIGINT, then shuts down gracefully; it
prints `listening on HOST:PORT` once ready (port 0 picks a free port) and one line per refusal.
With `--http-port Q` it also serves the HTTP APIs (`http_api`) and prints `http listening on
HOST:Q`. The token comes from `--token-file`, else from `RSTAR2_SANDBOX_TOKEN`.
`serve` refuses to start (exit 2, one line) unless every confinement is active;
`--allow-weak-isolation` starts anyway and says so on every Info. `info` prints what a server
reports about itself. `bench` runs the load generator, prints one
table and writes JSON. A user mistake (bad flag value, isolation required but missing, unreadable
file, unreachable server) is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from rstar2_sandbox.config import SandboxConfig, ServerConfig

TOKEN_ENV = "RSTAR2_SANDBOX_TOKEN"


class UsageError(Exception):
    """A mistake the user can fix; printed as one line."""


def _server_config(args: argparse.Namespace) -> ServerConfig:
    token = _serve_token(args.token_file)
    if args.sandbox_config:
        try:
            base = SandboxConfig.model_validate_json(Path(args.sandbox_config).read_text())
        except OSError as exc:
            raise UsageError(f"cannot read --sandbox-config: {exc.strerror}") from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UsageError(f"invalid --sandbox-config {where}: {first['msg']}") from exc
        if args.allow_weak_isolation:
            base = base.model_copy(update={"require_isolation": False})
        return _server(args, token, base)
    sandbox = {
        "workers": args.workers,
        "max_in_flight": args.max_in_flight,
        "max_queue": args.max_queue,
        "default_timeout_s": args.timeout,
        "memory_bytes": args.memory_mb << 20,
        "max_output_bytes": args.max_output_bytes,
        "require_isolation": not args.allow_weak_isolation,
        "session_cpu_s": args.session_cpu_s,
        "seccomp": not args.no_seccomp,
    }
    try:
        return _server(args, token, SandboxConfig(**sandbox))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"invalid setting {where}: {first['msg']}") from exc


def _token(path: str | None) -> str | None:
    from rstar2_proto.auth import TokenFileError, read_token_file

    try:
        return read_token_file(path) if path else None
    except TokenFileError as exc:
        raise UsageError(str(exc)) from None


def _serve_token(path: str | None) -> str | None:
    """`--token-file`, else `RSTAR2_SANDBOX_TOKEN` (for HTTP users; a file keeps it out of
    /proc/<pid>/environ), else none."""
    if path:
        return _token(path)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        return None
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise UsageError(f"{TOKEN_ENV} must be printable ASCII without whitespace")
    return token


def _server(args: argparse.Namespace, token: str | None, sandbox: SandboxConfig) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        token=token,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        insecure=args.insecure,
        http_port=args.http_port,
        http_max_body_bytes=args.http_max_body_bytes,
        sandbox=sandbox,
    )


async def _serve(config: ServerConfig) -> None:
    from rstar2_proto.auth import InsecureBindError
    from rstar2_sandbox.server import SandboxServer

    server = SandboxServer(config)
    try:
        port = await server.start()
    except (RuntimeError, InsecureBindError) as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        raise UsageError(f"cannot start: {exc}") from exc
    active, unavailable = server.sandbox.confinements()
    print(f"listening on {config.host}:{port}", flush=True)
    if config.http_port is not None:
        print(f"http listening on {config.host}:{server.http_port}", flush=True)
    print(f"confinements: {', '.join(active)}", file=sys.stderr, flush=True)
    for name, why in unavailable.items():
        print(f"confinement {name} unavailable: {why}", file=sys.stderr, flush=True)
    if warning := server.sandbox.isolation_warning():
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop()


async def _info(address: str, token: str | None) -> None:
    from rstar2_sandbox.client import SandboxClient

    async with SandboxClient(address, token=token) as client:
        infos = await client.info()
    if not infos:
        raise UsageError(f"no sandbox server answered at {address}")
    print(json.dumps(infos[0].model_dump(), indent=2))


def _bench(args: argparse.Namespace) -> None:
    from rstar2_sandbox.bench import BenchOptions, format_table, run_bench

    options = BenchOptions(
        calls=args.calls,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        mix=args.mix,
        seed=args.seed,
        workers=args.workers,
        address=args.address,
    )
    try:
        report = run_bench(options)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from exc
    print(format_table(report))
    out = Path(args.json or f"bench/results/sandbox_bench_{args.mix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


def _positive_int(text: str) -> int:
    return int(_positive_float(text, int))


def _positive_float(text: str, kind: type = float) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-sandbox", description="Isolated Python execution: server, info, bench."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50051)
    serve.add_argument("--workers", type=_positive_int, default=2)
    serve.add_argument("--max-in-flight", type=_positive_int, default=32)
    serve.add_argument("--max-queue", type=int, default=4096)
    serve.add_argument("--timeout", type=_positive_float, default=5.0, help="default timeout, s")
    serve.add_argument("--memory-mb", type=_positive_int, default=1024)
    serve.add_argument("--max-output-bytes", type=_positive_int, default=16384)
    serve.add_argument(
        "--require-isolation",
        action="store_true",
        help="refuse to start without every confinement (the default; kept for old scripts)",
    )
    serve.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="start even when a confinement is missing (every Info then carries a warning)",
    )
    serve.add_argument(
        "--session-cpu-s", type=_positive_float, default=120.0, help="CPU budget of a session"
    )
    serve.add_argument("--no-seccomp", action="store_true", help="let calls start processes")
    serve.add_argument(
        "--sandbox-config",
        help="JSON file of a whole SandboxConfig (then the limit flags above are ignored)",
    )
    serve.add_argument(
        "--token-file",
        help=f"file (mode 0600) with the run's token; calls must send it (else ${TOKEN_ENV})",
    )
    serve.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host with no token"
    )
    serve.add_argument(
        "--http-port",
        type=int,
        help="also serve SandboxFusion's /run_code and code-judge's /run APIs on this port",
    )
    serve.add_argument(
        "--http-max-body-bytes", type=_positive_int, default=32 << 20, help="413 beyond"
    )
    serve.add_argument("--tls-cert")
    serve.add_argument("--tls-key")
    info = sub.add_parser("info", help="print a server's Info")
    info.add_argument("--address", default="127.0.0.1:50051")
    info.add_argument("--token-file", help="file with the server's token")
    bench = sub.add_parser("bench", help="seeded load generator")
    bench.add_argument("--calls", type=_positive_int, default=1000)
    bench.add_argument("--concurrency", type=_positive_int, default=16)
    bench.add_argument("--timeout", type=_positive_float, default=2.0)
    bench.add_argument("--mix", choices=["standard", "no_loops"], default="standard")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--workers", type=_positive_int, default=2)
    bench.add_argument("--address", help="bench this server instead of starting one")
    bench.add_argument("--json", help="output path (default bench/results/...)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            asyncio.run(_serve(_server_config(args)))
        elif args.command == "info":
            asyncio.run(_info(args.address, _token(args.token_file)))
        else:
            _bench(args)
    except UsageError as exc:
        print(f"rstar2-sandbox: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

"""The `rstar2-rollout` command: `serve` a node's engines as a rollout service, `info` about one.

Contract. `serve` binds its port first (a port in use fails at once), checks the sandbox answers,
builds N engines on the model folder and serves rollout.v1 until SIGTERM or SIGINT, then stops
the server, the scheduler and the engines. The engine is an `EngineConfig` like everywhere else:
`--engine KIND` (vllm: in-process, the CPU build on a CPU-only machine; hf: transformers), the
common flags, and `--engine-option KEY=VALUE` for any other field of that kind; what is not given
is rstar2-rollout's default. Once ready it prints `listening on HOST:PORT` on stdout (port 0 picks a
free port; a parent process reads that line). The agent loop's settings (system prompt, tool
output truncation, tool timeout) are the service's own flags and must match the trainer's recipe;
a request carries sampling, budget, turns and seed. A user mistake (no model folder, a port in
use, a sandbox that does not answer, an engine extra not installed) is one line on stderr and
exit code 2, never a traceback; every bad `--engine-option` or flag value is reported at once,
a line each, in rstar2-config's words (`engine.max_num_seqs: ...`). `--token-file F` (mode 0600) makes every call need the run's
token, which is also sent to the sandbox (or `--sandbox-token-file`); a non-loopback `--host`
without a token is refused unless `--insecure`; `--tls-cert/--tls-key` serve over TLS. Not
covered: several models per service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from rstar2_config import ConfigError, error_lines, mistakes
from rstar2_rollout.config import (
    EngineConfig,
    RequestLimits,
    RolloutConfig,
    SchedulerConfig,
    SchedulingPolicy,
)

POLICIES = [c.model_fields["kind"].default for c in get_args(get_args(SchedulingPolicy)[0])]


class UsageError(Exception):
    """A mistake the user can fix; printed as one line."""


def _engine_configs(args: argparse.Namespace) -> tuple[list[EngineConfig], list[str]]:
    """`--engines` configs of kind `--engine`: engine i seeded `--seed` + i; and a line for each
    mistake in the options (rstar2-config's words: `engine.max_num_seqs: ...`)."""
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UsageError(f"no model at {model}: expected a folder with config.json and weights")
    flags = {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "kv_cache_memory_bytes": args.kv_cache_bytes,
        "max_num_seqs": args.max_num_seqs,
    }
    # unset flags, and --dtype auto, leave the kind's default (hf's is float32)
    given = {key: value for key, value in flags.items() if value not in (None, "auto")}
    options, lines = {}, []
    for text in args.engine_option:
        try:
            key, value = _option(text)
        except UsageError as exc:
            lines.append(str(exc))
            continue
        if key == "model":
            lines.append("--engine-option model: the engines run --model; drop the option")
            continue
        options[key] = value
    try:
        chosen = _Engine.model_validate({"engine": {"kind": args.engine, **options}}).engine
        configs = [
            chosen.fill(model=str(model), seed=args.seed + i, **given) for i in range(args.engines)
        ]
    except ValidationError as exc:
        return [], lines + error_lines(exc, _Engine)
    return configs, lines


class _Engine(BaseModel):
    """The engine flags of `serve` as a config, so that errors name `engine.KEY`."""

    engine: EngineConfig


def _option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--engine-option {text!r} is not KEY=VALUE")
    try:
        return key, json.loads(raw)  # numbers, true/false, null; anything else is a string
    except ValueError:
        return key, raw


class _Settings(BaseModel):
    """The agent loop's, the scheduler's and a request's settings of `serve`, from its flags."""

    rollout: RolloutConfig
    scheduler: SchedulerConfig
    limits: RequestLimits


# The flag each setting comes from, to name it in a mistake's line.
_FLAGS = {
    "rollout.system_prompt": "--system-prompt",
    "rollout.max_tool_response_chars": "--max-tool-response-chars",
    "rollout.tool_timeout_s": "--tool-timeout",
    "rollout.max_context_tokens": "--max-model-len",
    "scheduler.policy.kv_tokens_fallback": "--kv-tokens",
    "limits.max_response_tokens": "--max-response-tokens",
    "limits.max_turns": "--max-turns",
}


def _settings(args: argparse.Namespace) -> tuple[_Settings | None, list[str]]:
    """The settings from the flags; or None and a line for each mistake, naming its flag."""
    policy: dict[str, Any] = {"kind": args.policy}
    if args.policy.startswith("kv_"):
        policy["kv_tokens_fallback"] = args.kv_tokens
    tree = {
        "rollout": {
            "system_prompt": args.system_prompt,
            "max_tool_response_chars": args.max_tool_response_chars,
            "tool_timeout_s": args.tool_timeout,
            "max_context_tokens": args.max_model_len,
        },
        "scheduler": {"policy": policy},
        "limits": {"max_response_tokens": args.max_response_tokens, "max_turns": args.max_turns},
    }
    try:
        return _Settings.model_validate(tree), []
    except ValidationError as exc:
        lines = error_lines(exc, _Settings)
    named = []
    for line in lines:
        key, sep, rest = line.partition(": ")
        named.append(f"{_FLAGS.get(key, key)}{sep}{rest}")
    return None, named


def _token(path: str | None) -> str | None:
    from rstar2_proto.auth import TokenFileError, read_token_file

    try:
        return read_token_file(path) if path else None
    except TokenFileError as exc:
        raise UsageError(str(exc)) from None


async def _open_sandbox(address: str, token: str | None = None) -> Any:
    if address == "local":
        from rstar2_sandbox import LocalSandbox, SandboxConfig

        sandbox = LocalSandbox(SandboxConfig())
        await sandbox.start()
        return sandbox
    from rstar2_sandbox.client import SandboxClient

    client = SandboxClient([address], token=token)
    if not await client.info():
        await client.close()
        raise UsageError(f"no sandbox server answered at {address}: start `rstar2-sandbox serve`")
    return client


def _build_engines(configs: list[EngineConfig]) -> list[Any]:
    from rstar2_rollout.engines import build_engine

    engines = []
    try:
        for i, config in enumerate(configs):
            engines.append(build_engine(config, name=f"{config.kind}-{i}"))
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:
        reason = str(exc).strip().splitlines()
        first = reason[0] if reason else repr(exc)
        raise UsageError(f"cannot build engine {len(engines)}: {first}") from None
    return engines


def _check_port_free(host: str, port: int) -> None:
    if port == 0:
        return
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is already in use; choose another --port (0 picks a"
                    " free one)"
                ) from None


async def _serve(args: argparse.Namespace) -> None:
    from rstar2_proto.auth import InsecureBindError, check_bind
    from rstar2_rollout.scheduler import Scheduler
    from rstar2_rollout.server import bind
    from rstar2_rollout.service import RolloutService, agent_producer
    from rstar2_rollout.weights import WeightSpec

    configs, lines = _engine_configs(args)
    settings, more = _settings(args)
    if settings is None or lines:
        raise mistakes(lines + more, "the command line")
    if args.engine == "vllm" and args.engines > 1 and not _has_accelerator():
        raise UsageError(
            "the CPU build of vLLM runs one engine per process (two crash in one): start one"
            " service per engine with --engines 1; the trainer spreads problems across services"
        )
    rollout, scheduling, limits = settings.rollout, settings.scheduler, settings.limits
    token = _token(args.token_file)
    sandbox_token = _token(args.sandbox_token_file) if args.sandbox_token_file else token
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    for pem in (args.tls_cert, args.tls_key):
        if pem is not None and not os.access(pem, os.R_OK):
            raise UsageError(f"cannot read {pem}: give a readable PEM file")
    try:
        check_bind(args.host, token, args.insecure)
    except InsecureBindError as exc:
        raise UsageError(str(exc)) from None
    _check_port_free(args.host, args.port)
    try:
        server = bind(
            f"{args.host}:{args.port}",
            token=token,
            tls_cert_file=args.tls_cert,
            tls_key_file=args.tls_key,
            insecure=args.insecure,
        )
    except OSError as exc:
        raise UsageError(f"{exc}; choose another --port (0 picks a free one)") from None
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop, 2.0)
        sandbox = await _open_sandbox(args.sandbox, sandbox_token)
        stack.push_async_callback(sandbox.close)
        engines = _build_engines(configs)
        for engine in engines:
            stack.push_async_callback(engine.close)
        blind = any(engine.kv_capacity() is None for engine in engines)
        if blind and args.policy.startswith("kv_") and args.kv_tokens is None:
            # an engine that reports no KV cache (transformers) holds a few full trajectories
            update = {"kv_tokens_fallback": 4 * args.max_model_len}
            scheduling = SchedulerConfig(policy=scheduling.policy.model_copy(update=update))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        produce, prompt_tokens = agent_producer(sandbox, tokenizer, rollout)
        scheduler: Scheduler = Scheduler(engines, scheduling)
        stack.push_async_callback(scheduler.close)
        service = RolloutService(
            scheduler,
            produce,
            prompt_tokens,
            limits,
            engines=engines,
            weights=WeightSpec.from_model_dir(args.model),
            system_prompt_style=rollout.system_prompt,
        )
        await server.start(service)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        names = ", ".join(e.name for e in engines)
        print(f"listening on {args.host}:{server.port}", flush=True)
        print(f"engines: {names}; sandbox: {args.sandbox}", file=sys.stderr, flush=True)
        await stop.wait()


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


async def _info(address: str, token: str | None) -> None:
    from rstar2_rollout.client import RolloutClient, RolloutError

    async with RolloutClient(address, token=token) as client:
        try:
            info = await client.info()
        except RolloutError as exc:
            raise UsageError(f"no rollout service answered at {address}: {exc}") from None
    engines = [
        {
            "name": e.name,
            "healthy": e.healthy,
            "running": e.running,
            "free_kv_tokens": e.capacity.free_tokens if e.capacity else None,
            "total_kv_tokens": e.capacity.total_tokens if e.capacity else None,
            "dead_reason": e.dead_reason,
        }
        for e in info.engines
    ]
    print(
        json.dumps({"version": info.version, "policy": info.policy, "engines": engines}, indent=2)
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


# The kinds of EngineConfig a service can serve: those that take the trainer's weights.
_ENGINE_KINDS = [
    config.model_fields["kind"].default
    for config in get_args(get_args(EngineConfig)[0])
    if config.takes_weight_updates
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-rollout", description="Rollout service: a node's engines behind rollout.v1."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve this node's engines over gRPC")
    serve.add_argument("--model", required=True, help="model folder (config.json, weights)")
    serve.add_argument(
        "--sandbox", required=True, help="HOST:PORT of an rstar2-sandbox server, or 'local'"
    )
    serve.add_argument("--engines", type=_positive_int, default=1, help="engine replicas")
    serve.add_argument(
        "--engine", choices=_ENGINE_KINDS, default="vllm", help="the engine's kind (EngineConfig)"
    )
    serve.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other field of the engine's config, e.g. enforce_eager=false (repeatable)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50061, help="0 picks a free port")
    serve.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="float32",
        help="engine weights; match the trainer's so weight sync is exact",
    )
    serve.add_argument("--kv-cache-bytes", type=_positive_int, help="default: the engine's")
    serve.add_argument(
        "--max-model-len", type=_positive_int, default=8192, help="prompt plus response tokens"
    )
    serve.add_argument("--max-num-seqs", type=_positive_int, help="default: the engine's")
    serve.add_argument("--seed", type=int, default=0, help="engine i is seeded seed + i")
    serve.add_argument(
        "--policy",
        choices=POLICIES,
        default=SchedulerConfig().policy.kind,
        help="scheduling policy (SCHEDULER.md); default: SchedulerConfig's",
    )
    serve.add_argument(
        "--kv-tokens", type=_positive_int, help="KV tokens assumed per engine that reports none"
    )
    serve.add_argument("--system-prompt", choices=["paper", "compact"], default="paper")
    serve.add_argument("--max-tool-response-chars", type=_positive_int)
    serve.add_argument("--tool-timeout", type=float, help="seconds per tool call")
    serve.add_argument("--max-response-tokens", type=_positive_int, default=8192)
    serve.add_argument("--max-turns", type=_positive_int, default=10)
    serve.add_argument(
        "--token-file", help="file (mode 0600) with the run's token; calls must send it"
    )
    serve.add_argument(
        "--sandbox-token-file", help="token file of the sandbox server (default: --token-file)"
    )
    serve.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key): serve over TLS")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host with no token"
    )
    info = sub.add_parser("info", help="print a service's engines and their KV capacity")
    info.add_argument("--address", default="127.0.0.1:50061")
    info.add_argument("--token-file", help="file with the service's token")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    # stdout carries the one `listening on` line; vLLM logs to stdout unless told otherwise
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            asyncio.run(_serve(args))
        else:
            asyncio.run(_info(args.address, _token(args.token_file)))
    except (UsageError, ConfigError) as exc:
        for line in str(exc).splitlines():  # one line per mistake
            print(f"rstar2-rollout: {line}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

"""`rstar2-verify`: grade one answer, score a labelled file, or run the gRPC service.

    rstar2-verify grade RESPONSE GOLD [--kind math|choice] [--json]
    rstar2-verify check FILE.jsonl [--mistakes N] [--fail-under 0.97]
    rstar2-verify serve [--host 127.0.0.1] [--port 0] [--workers N] [--timeout-s 2]
                        [--token-file F] [--tls-cert C --tls-key K] [--insecure]

A user mistake (missing file, malformed line, bad option value, port in use) prints one line to
stderr and exits 2; `check --fail-under` exits 1 when accuracy is lower or any different-number
case was accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from pydantic import ValidationError

from rstar2_verify.config import VerifyConfig

__all__ = ["main"]


class UsageError(Exception):
    """A mistake the user can fix; printed as one line."""


def _config(args: argparse.Namespace) -> VerifyConfig:
    values = {
        "workers": args.workers,
        "timeout_s": args.timeout_s,
        "memory_mb": args.memory_mb,
    }
    try:
        return VerifyConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(
            f"--{'-'.join(map(str, first['loc'])).replace('_', '-')}: {first['msg']}"
        ) from None


def _grade(args: argparse.Namespace) -> int:
    from rstar2_verify.grader import Grader

    if args.kind == "choice":
        from rstar2_verify.choice import grade_choice

        grade = grade_choice(args.response, args.gold)
    else:
        with Grader(_config(args)) as grader:
            grade = grader.grade(args.response, args.gold)
    if args.json:
        print(json.dumps(asdict(grade), ensure_ascii=False))
    else:
        verdict = "correct" if grade.correct else "wrong"
        why = f" reason={grade.reason}" if grade.reason else ""
        print(
            f"{verdict} method={grade.method or '-'} source={grade.source} "
            f"extracted={grade.extracted!r} gold={grade.gold_normalized!r}{why} "
            f"elapsed={grade.elapsed * 1000:.1f}ms"
        )
    return 0


def _check(args: argparse.Namespace) -> int:
    from rstar2_verify.check import CaseError, check, load_cases
    from rstar2_verify.grader import Grader

    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        cases = load_cases(path)
    except (CaseError, UnicodeDecodeError) as exc:
        raise UsageError(str(exc)) from None
    if not cases:
        raise UsageError(f"{path}: no cases")
    with Grader(_config(args)) as grader:
        report = check(cases, grader)
    print(f"{'category':<22}{'cases':>7}{'accuracy':>10}{'false+':>8}{'false-':>8}")
    for name, score in [*report.categories.items(), ("overall", report.overall)]:
        print(
            f"{name:<22}{score.total:>7}{score.accuracy:>10.1%}"
            f"{score.false_positives:>8}{score.false_negatives:>8}"
        )
    print(f"graded {len(cases)} cases in {report.seconds:.2f} s")
    for case, grade in report.mistakes[: args.mistakes]:
        print(
            f"  [{case.category}] expected {case.correct}: response={case.response[:80]!r} "
            f"gold={case.gold[:40]!r} extracted={(grade.extracted or '')[:40]!r} "
            f"method={grade.method or '-'} reason={grade.reason or '-'}"
        )
    if args.fail_under is not None:
        different = report.categories.get("different_number")
        if report.overall.accuracy < args.fail_under or (different and different.false_positives):
            return 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rstar2_proto.auth import InsecureBindError, TokenFileError, read_token_file
    from rstar2_verify.server import VerifyServer

    config = _config(args)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    try:
        token = read_token_file(args.token_file) if args.token_file else None
    except TokenFileError as exc:
        raise UsageError(str(exc)) from None

    async def run() -> None:
        server = VerifyServer(
            config,
            args.host,
            args.port,
            token=token,
            tls_cert_file=args.tls_cert,
            tls_key_file=args.tls_key,
            insecure=args.insecure,
        )
        try:
            await server.start()
        except (RuntimeError, InsecureBindError) as exc:
            raise UsageError(str(exc)) from None
        print(f"rstar2-verify listening on {server.address}", flush=True)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()

    asyncio.run(run())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2-verify", description="Grade maths answers, score a labelled file, or serve."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def pool_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--workers", type=int, help="worker processes (default: one per core)")
        p.add_argument(
            "--timeout-s", type=float, help="wall-clock bound of one grade (default 0.8)"
        )
        p.add_argument("--memory-mb", type=int, help="address-space cap of each worker")

    p = sub.add_parser("grade", help="grade one response against one gold answer")
    p.add_argument("response")
    p.add_argument("gold")
    p.add_argument("--json", action="store_true", help="print the Grade as JSON")
    p.add_argument(
        "--kind",
        choices=("math", "choice"),
        default="math",
        help="math (default), or choice: GOLD is a multiple-choice letter",
    )
    pool_options(p)
    p.set_defaults(run=_grade)

    p = sub.add_parser("check", help="accuracy per category on a labelled JSONL file")
    p.add_argument("file")
    p.add_argument("--mistakes", type=int, default=20, help="how many mistakes to list")
    p.add_argument("--fail-under", type=float, help="exit 1 below this accuracy (0..1)")
    pool_options(p)
    p.set_defaults(run=_check)

    p = sub.add_parser("serve", help="run the gRPC VerifyService")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    p.add_argument("--token-file", help="file (mode 0600) with the run's token; calls must send it")
    p.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key): serve over TLS")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host with no token"
    )
    pool_options(p)
    p.set_defaults(run=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"rstar2-verify: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`rstar2-curriculum verify-labels` once its arguments are parsed: engine, sandbox, check, write.

Imported only when the command runs, so `--help` works without the `label-check` extra. Every
failure a user can cause (the extra or the engine's extra missing, a model folder that does not
load, a sandbox that does not answer, bad settings) leaves as one line via the CLI's handler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from rstar2_curriculum.config import LabelCheckConfig
from rstar2_curriculum.labels import check_labels, require_extra
from rstar2_curriculum.load import LoadResult, write_jsonl


def _engine_config(args: argparse.Namespace) -> Any:
    from rstar2_rollout.config import EngineConfig

    if args.engine_config:
        try:
            raw = json.loads(args.engine_config)
        except json.JSONDecodeError as error:
            raise ValueError(f"--engine-config is not JSON: {error}") from None
    else:
        if not args.model:
            raise ValueError("give --model (a model folder, or the served name for openai)")
        raw = {"kind": args.engine, "model": args.model}
        if args.engine == "openai":
            if not args.base_url:
                raise ValueError("the openai engine needs --base-url")
            raw["base_url"] = args.base_url
        if args.dtype:
            raw["dtype"] = args.dtype
        if args.max_model_len and args.engine == "vllm":
            raw["max_model_len"] = args.max_model_len
    return TypeAdapter(EngineConfig).validate_python(raw)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _build(config: Any) -> Any:
    from rstar2_rollout.engines import build_engine

    try:
        return build_engine(config)
    except ImportError:
        raise
    except Exception as error:  # a model folder that does not load, a bad device, ...
        where = getattr(config, "model", "")
        reason = _first_line(error)
        raise ValueError(f"cannot build the {config.kind} engine on {where}: {reason}") from None


def _tokenizer(args: argparse.Namespace, engine: Any, config: Any) -> Any:
    own = getattr(engine, "tokenizer", None)
    if own is not None:
        return own
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError(
            'the tokenizer needs transformers: pip install "rstar2-rollout[hf]"'
        ) from None
    source = args.tokenizer or getattr(config, "model", None)
    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as error:
        raise ValueError(f"cannot load a tokenizer from {source}: {_first_line(error)}") from None


async def _sandbox(address: str, stack: contextlib.AsyncExitStack) -> Any:
    if address == "local":
        from rstar2_sandbox import LocalSandbox, SandboxConfig

        sandbox = LocalSandbox(SandboxConfig())
        await sandbox.start()
    else:
        from rstar2_sandbox.client import SandboxClient

        sandbox = SandboxClient([address])
        if not await sandbox.info():
            await sandbox.close()
            raise ValueError(f"no sandbox answered at {address}: start `rstar2-sandbox serve`")
    stack.push_async_callback(sandbox.close)
    return sandbox


async def _run(args: argparse.Namespace, loaded: LoadResult, config: LabelCheckConfig) -> Any:
    problems = loaded.problems[: args.limit] if args.limit else loaded.problems
    engine_config = _engine_config(args)
    async with contextlib.AsyncExitStack() as stack:
        sandbox = await _sandbox(args.sandbox, stack) if config.mode == "agent" else None
        engine = _build(engine_config)
        stack.push_async_callback(engine.close)
        tokenizer = _tokenizer(args, engine, engine_config)
        return await check_labels(problems, engine, tokenizer, config, sandbox=sandbox)


def settings(args: argparse.Namespace) -> LabelCheckConfig:
    """The check's settings from the flags (validated before anything is loaded)."""
    return LabelCheckConfig(
        k=args.k,
        m=args.m,
        mode=args.mode,
        temperature=args.temperature,
        top_p=args.top_p,
        max_response_tokens=args.max_response_tokens,
        max_turns=args.max_turns,
        system_prompt=args.system_prompt,
        max_concurrency=args.max_concurrency,
        seed=args.seed,
    )


def run(args: argparse.Namespace, loaded: LoadResult, config: LabelCheckConfig) -> None:
    """Check the labels of `loaded`'s problems; write the kept ones and the report."""
    require_extra()
    kept, report = asyncio.run(_run(args, loaded, config))
    write_jsonl(kept, args.out)
    histogram = ", ".join(f"{a}: {n}" for a, n in report.agree_histogram.items())
    print(f"kept {report.kept} of {report.problems} (>= {config.m} of {config.k} match)")
    print(f"matches -> problems: {histogram}")
    if args.report:
        out = {
            "config": config.model_dump(),
            "load": loaded.report.model_dump(),
            "labels": report.model_dump(mode="json"),
        }
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(out, indent=2))

"""`python -m rstar2_trainer.placement.cluster_check RECIPE [a.b=value ...] [--address auto]`: smoke-test a
Ray cluster before a run.

It places the run's parts exactly as the trainer's cluster mode does (sandbox and verify servers
on every node, engine actors where they fit, the training ranks the recipe's `cluster:` section
asks for), then checks each: every sandbox server's Info and a few tool calls, a grade, one greedy
turn per engine, and one weight sync through the placement's own weight mover, the path training
takes (`mover.sleep()`, then `mover.push(policy.weights())`: colocated hand-over, weight channel or
the driver's tensors), with the policy's own weights, so the engines' greedy turns after it must
equal those before. It prints one line per part with its timings. The recipe's `cluster:` section
is used when it has one; the flags given override its keys. Exit code 0 when every part
answered, 1 when one did not, 2 for a mistake in the arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from rstar2_trainer.config import ConfigError, TrainerConfig, load_config
from rstar2_trainer.placement.cluster import ClusterConfig, ClusterError, open_cluster_parts
from rstar2_trainer.training.policy import open_policy
from rstar2_trainer.training.precision import Precision


async def check(config: TrainerConfig, cluster: ClusterConfig, run_dir: Path) -> bool:
    from rstar2_rollout.engine import SamplingParams
    from rstar2_sandbox import ExecutionRequest, ExecutionStatus

    ok = True
    start = time.perf_counter()
    config = config.model_copy(update={"cluster": cluster})
    async with open_cluster_parts(config, run_dir) as parts:
        print(f"placed in {time.perf_counter() - start:.1f} s")
        assert parts.sandbox is not None  # cluster parts have one
        infos = await parts.sandbox.info()  # type: ignore[attr-defined]  (a SandboxClient)
        for info in infos:
            print(f"sandbox server {info.address}: {info.workers} workers, {info.confinements}")
        t = time.perf_counter()
        runs = [ExecutionRequest(code="print(6 * 7)") for _ in range(4 * len(infos))]
        results = await parts.sandbox.execute_many(runs)
        good = sum(r.status == ExecutionStatus.OK and r.stdout.strip() == "42" for r in results)
        ok &= good == len(results)
        print(f"sandbox: {good}/{len(results)} calls printed 42 in {time.perf_counter() - t:.3f} s")
        t = time.perf_counter()
        grades = await parts.scorer.verifier.grade_many([("<answer>\\boxed{42}</answer>", "42")])
        ok &= grades[0].correct
        print(f"verify: correct={grades[0].correct} in {time.perf_counter() - t:.3f} s")
        prompt = parts.tokenizer("1 + 1 =")["input_ids"]
        greedy = SamplingParams(max_tokens=8, temperature=0.0, logprobs=False)
        before = {}
        for engine in parts.engines:
            t = time.perf_counter()
            out = await engine.generate(prompt, greedy, f"check-{engine.name}")
            cap = engine.kv_capacity()
            ok &= out.finish_reason != "error"
            before[engine.name] = out.token_ids
            print(
                f"engine {engine.name}: {len(out.token_ids)} tokens ({out.finish_reason}) in "
                f"{time.perf_counter() - t:.3f} s; KV {cap.total_tokens if cap else '?'} tokens"
            )
        precision = Precision.from_settings(config.train.device, config.train.dtype)
        pad_id = int(parts.tokenizer.pad_token_id or parts.tokenizer.eos_token_id or 0)
        async with open_policy(
            config, parts.model, parts.model_dir, precision, pad_id=pad_id, group=parts.train_group
        ) as policy:
            mover = parts.mover
            asleep = await mover.sleep()
            pushed = await mover.push(policy.weights())
        print(
            f"weight sync ({type(mover).__name__}): sleep {asleep.total_s:.3f} s, "
            f"{pushed.bytes_moved / 2**20:.1f} MiB in {pushed.buckets} buckets, slowest load "
            f"{pushed.load_s:.3f} s, total {pushed.total_s:.3f} s"
        )
        for engine in parts.engines:
            out = await engine.generate(prompt, greedy, f"check-again-{engine.name}")
            same = out.token_ids == before[engine.name]
            ok &= same
            print(f"engine {engine.name} after the sync: {'same' if same else 'DIFFERENT'} tokens")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rstar2_trainer.placement.cluster_check")
    parser.add_argument("recipe", nargs="?", default="tiny")
    parser.add_argument("overrides", nargs="*", help="a.b=value")
    parser.add_argument("--address", default=None, help="Ray address; unset: a local cluster")
    parser.add_argument("--engines-per-node", type=int, default=None, help="default 1")
    parser.add_argument("--gpus-per-engine", type=int, default=None, help="default 0")
    parser.add_argument("--services-host", default=None, help="bind servers here (127.0.0.1)")
    parser.add_argument("--run-dir", type=Path, default=None, help="where a tiny model is built")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.recipe, args.overrides)
        base = (
            config.cluster.model_dump()
            if config.cluster is not None
            else {
                "engines_per_node": 1,
                "gpus_per_engine": 0,
                "sandbox_workers": getattr(config.tool, "workers", 2),
                "verify_workers": config.verify_service.workers,
            }
        )
        flags = {
            "address": args.address,
            "engines_per_node": args.engines_per_node,
            "gpus_per_engine": args.gpus_per_engine,
            "services_host": args.services_host,
        }
        cluster = ClusterConfig.model_validate(
            {**base, **{k: v for k, v in flags.items() if v is not None}}
        )
    except (ConfigError, ValueError) as exc:
        print(f"cluster_check: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ok = asyncio.run(check(config, cluster, args.run_dir or Path(tmp)))
        except ClusterError as exc:
            print(f"cluster_check: {exc}", file=sys.stderr)
            return 1
    print("cluster check: OK" if ok else "cluster check: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

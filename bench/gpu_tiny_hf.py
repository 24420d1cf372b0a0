"""`rstar2-train tiny` end to end with the transformers engine, vLLM and Ray unimportable.

    python bench/gpu_tiny_hf.py --device cuda --out OUT_DIR    # scripts/gpu_check.sh's `tiny_hf`
    uv run python bench/gpu_tiny_hf.py --device cpu --out /tmp/tiny_hf   # the same run on a CPU

One trainer process (`rstar2_trainer.cli.main`, what `rstar2-train` runs) with the driver
training on `--device` (SFT and the RL updates through `distributed.train_step`, packed rows, bf16
autocast on a GPU) and `engine.kind=hf` generating on the same device; the sandbox and the grader
run in-process (`tool.kind=local`, `verify_service.mode=local`), the sandbox starting with what
confinement the machine offers (`allow_weak_isolation`: this checks training, not the sandbox,
and the code it runs is a tiny model's arithmetic). Short on purpose: 4 SFT steps,
then 2 RL steps of 2 prompts x 8 rollouts at up to 128 tokens, equal-reward groups kept
(`algo.filtering=none`) so each RL step trains even when the untrained model earns nothing. `vllm`
and `ray` are put in `sys.modules` as None first, so the run fails if this path imports either.
Writes OUT_DIR/tiny_hf.json: the exit status, the steps that trained and their time, the
device's peak memory. What it does not cover: vLLM engines, Ray placement, several ranks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

BLOCKED = ("vllm", "ray")


def overrides(device: str, runs_root: Path) -> list[str]:
    dtype = "bfloat16" if device == "cuda" else "float32"
    return [
        "run.name=tiny-hf",
        f"run.runs_root={runs_root}",
        "run.plots=false",
        "run.trackers=[jsonl]",
        f"train.device={device}",
        f"train.dtype={dtype}",
        "engine.kind=hf",
        f"engine.device={device}",
        f"engine.dtype={dtype}",
        "tool.kind=local",
        "tool.allow_weak_isolation=true",  # a bare GPU image may lack namespaces or seccomp
        "verify_service.mode=local",
        "sft.examples=64",
        "sft.epochs=1",
        "sft.batch_size=16",
        "eval.before_sft=false",
        "eval.synthetic=false",
        "algo.filtering=none",
        "curriculum.batch_size=2",
        "curriculum.plan=custom",
        "curriculum.stages=[{name: s1, max_response_tokens: 128, max_turns: 2, steps: 2}]",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", type=Path, required=True, help="folder for the run and tiny_hf.json")
    args = p.parse_args(argv)
    for name in BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]  # `import vllm` now raises
    import torch

    from rstar2_trainer.cli import main as train
    from rstar2_trainer.rundir import read_metrics

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_tiny_hf: --device cuda but no GPU is visible", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rc = train(["tiny", *overrides(args.device, args.out / "runs")])
    seconds = time.perf_counter() - start
    runs = sorted((args.out / "runs").glob("tiny-hf-*"))
    records = read_metrics(runs[-1]) if runs else []
    sft = [r for r in records if r.get("phase") == "sft"]
    rl = [r for r in records if r.get("phase") == "rl"]
    result = {
        "rc": rc,
        "device": args.device,
        "seconds": seconds,
        "run_dir": str(runs[-1]) if runs else None,
        "sft_steps": len(sft),
        "sft_loss": [r.get("loss") for r in sft],
        "rl_steps": len(rl),
        "rl_trained": [r.get("train_tokens", 0) > 0 for r in rl],
        "time_train_s": [r.get("time_train_s") for r in rl],
        "policy_exported": bool(runs) and (runs[-1] / "policy").is_dir(),
        "imported": sorted(n for n in BLOCKED if sys.modules.get(n) is not None),
    }
    if args.device == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["device_name"] = torch.cuda.get_device_name(0)
    (args.out / "tiny_hf.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    ok = rc == 0 and result["sft_steps"] > 0 and all(result["rl_trained"]) and result["rl_steps"]
    return 0 if ok and result["policy_exported"] else 1


if __name__ == "__main__":
    sys.exit(main())

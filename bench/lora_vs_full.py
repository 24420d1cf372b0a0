"""Does RL with LoRA learn as well as full RL? One SFT policy, both arms, several seeds.

    uv run python bench/lora_vs_full.py [RECIPE] [a.b=value ...] [--seeds 0 1 2] [--jobs 2]
        [--rank 8] [--lora-lr 1e-3] [--work runs/lora_vs_full]
        [--json bench/results/lora_vs_full.json]

The protocol of bench/roc_vs_grpo.py, whose helpers it uses: SFT once (`rstar2-train RECIPE`
until checkpoint 0), then per arm and seed the RL stages started from that checkpoint with
`--init-from SFT_RUN:0`, evaluated on the SFT run's held-out problems (as a benchmark file, so
they stay out of the RL data). The arms differ only in what trains:

- `full`: every weight, at the recipe's learning rate;
- `lora`: `model.lora.rank=RANK` (PEFT adapters on every linear layer of the blocks, alpha 32;
  the SFT policy as the frozen base, `RUN_DIR/base`), at `--lora-lr` (LoRA's usual ten times
  the full rate), each push moving the adapter only.

`rl_wall_s` is the wall time of the RL steps: from the evaluation of the starting policy (step
0) to the last RL step's record, the final evaluation not included. Arms of one seed run at once
(`--jobs 2`, one torch thread each), so their seconds compare within a seed.

JSON: `{"arms": {"full": [RUN, ...], "lora": [RUN, ...]}, "summary": {ARM: {"runs",
"final_accuracy_mean", "final_accuracy_interval": [low, high] (95 % t, None below two runs),
"rl_wall_s_mean"}}, "verdict": "..."}`, a RUN is
`{"seed", "final_accuracy", "rl_wall_s", "accuracy_after_sft", "rl_steps", "sync_bytes",
"mismatch_kl_mean"}` (`sync_bytes`: a push's bytes, the last step's). The verdict says whether the
LoRA arm's mean final accuracy lies inside the full arm's 95 % t-interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from roc_vs_grpo import held_out_of_sft, interval, read_metrics, run_logged, sft_policy, trainer


def arms_of(rank: int, lora_lr: float) -> dict[str, list[str]]:
    return {"full": [], "lora": [f"model.lora.rank={rank}", f"optim.lr={lora_lr}"]}


def rl_run(
    recipe: str, overrides: list[str], arm: str, extra: list[str], seed: int, work: Path
) -> int:
    """One arm and seed from the SFT run's checkpoint 0; skipped when finished, resumed when
    started."""
    run_dir = work / f"{arm}-s{seed}"
    if (run_dir / "policy" / "rstar2.json").is_file():
        return 0
    if (run_dir / "config.yaml").is_file():
        cmd = trainer("--resume", str(run_dir))
    else:
        cmd = trainer(
            recipe,
            *overrides,
            f"run.seed={seed}",
            "run.threads=1",
            f"run.name={arm}-s{seed}",
            f"run.output_dir={run_dir}",
            *held_out_of_sft(work),
            *extra,
            "--init-from",
            f"{work / 'sft'}:0",
        )
    return run_logged(cmd, work / f"{arm}-s{seed}.log")


def run_record(seed: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One RUN entry from a finished run's metrics.jsonl records."""
    evals = [r for r in records if r.get("phase") in ("eval", "benchmark")]
    rl = [r for r in records if r.get("phase") == "rl"]
    start = [r for r in evals if r["step"] == 0][-1]  # the policy RL starts from
    kls = [r["mismatch_kl"] for r in rl if r.get("mismatch_kl") is not None]
    return {
        "seed": seed,
        "final_accuracy": evals[-1]["accuracy"],
        "rl_wall_s": rl[-1]["time"] - start["time"],
        "accuracy_after_sft": start["accuracy"],
        "rl_steps": len(rl),
        "sync_bytes": next((r["sync_bytes"] for r in reversed(rl) if "sync_bytes" in r), None),
        "mismatch_kl_mean": sum(kls) / len(kls) if kls else None,
    }


def summary(arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: runs, the mean final accuracy and its 95 % t-interval (None below two runs),
    the mean RL wall time."""
    out: dict[str, Any] = {}
    for arm, runs in arms.items():
        acc = interval([r["final_accuracy"] for r in runs])
        spread = acc is not None and len(runs) >= 2
        out[arm] = {
            "runs": len(runs),
            "final_accuracy_mean": acc[0] if acc else None,
            "final_accuracy_interval": [acc[1], acc[2]] if spread and acc else None,
            "rl_wall_s_mean": sum(r["rl_wall_s"] for r in runs) / len(runs) if runs else None,
        }
    return out


def verdict(arms: dict[str, list[dict[str, Any]]]) -> str:
    full = interval([r["final_accuracy"] for r in arms["full"]])
    lora = interval([r["final_accuracy"] for r in arms["lora"]])
    if full is None or lora is None or min(len(r) for r in arms.values()) < 2:
        return f"inconclusive: too few finished runs ({ {a: len(r) for a, r in arms.items()} })"
    secs = {a: sum(r["rl_wall_s"] for r in runs) / len(runs) for a, runs in arms.items()}
    where = (
        "inside" if full[1] <= lora[0] <= full[2] else ("above" if lora[0] > full[2] else "below")
    )
    return (
        f"final held-out accuracy: lora {lora[0]:.3f} [{lora[1]:.3f}, {lora[2]:.3f}] vs full "
        f"{full[0]:.3f} [{full[1]:.3f}, {full[2]:.3f}]: the LoRA mean is {where} the full 95 % "
        f"interval; RL wall time full/lora {secs['full'] / secs['lora']:.2f}x "
        f"(means over {len(arms['full'])} + {len(arms['lora'])} seeds)"
    )


def print_table(arms: dict[str, list[dict[str, Any]]]) -> None:
    print(f"{'arm':<6}{'seed':>5}{'after SFT':>11}{'final':>8}{'RL s':>8}{'sync bytes':>12}"
          f"{'mismatch KL':>13}")  # fmt: skip
    for arm, runs in arms.items():
        for r in runs:
            kl, sync = r["mismatch_kl_mean"], r["sync_bytes"]
            print(
                f"{arm:<6}{r['seed']:>5}{r['accuracy_after_sft']:>11.3f}{r['final_accuracy']:>8.3f}"
                f"{r['rl_wall_s']:>8.0f}{'-' if sync is None else f'{sync:.3g}':>12}"
                f"{'-' if kl is None else f'{kl:.2e}':>13}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description="LoRA RL vs full RL from one SFT policy")
    parser.add_argument("recipe", nargs="?", default="tiny")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="RL runs at once")
    parser.add_argument("--rank", type=int, default=8, help="the LoRA arm's rank")
    parser.add_argument("--lora-lr", type=float, default=1e-3, help="the LoRA arm's optim.lr")
    parser.add_argument("--work", type=Path, default=Path("runs/lora_vs_full"))
    parser.add_argument("--json", type=Path, default=Path("bench/results/lora_vs_full.json"))
    parser.add_argument(
        "--report-only", action="store_true", help="summarise the finished runs; start none"
    )
    args = parser.parse_args()
    arms_overrides = arms_of(args.rank, args.lora_lr)
    if not args.report_only:
        sft_policy(args.recipe, args.overrides, args.work)  # the SFT run, until checkpoint 0
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [
                pool.submit(rl_run, args.recipe, args.overrides, arm, extra, seed, args.work)
                for seed in args.seeds
                for arm, extra in arms_overrides.items()
            ]
            if any(f.result() for f in futures):
                print("some runs failed; the JSON holds the finished ones", file=sys.stderr)
    arms: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms_overrides}
    for arm in arms_overrides:
        for seed in args.seeds:
            run_dir = args.work / f"{arm}-s{seed}"
            if (run_dir / "policy" / "rstar2.json").is_file():
                arms[arm].append(run_record(seed, read_metrics(run_dir)))
    result = {"arms": arms, "summary": summary(arms), "verdict": verdict(arms)}
    print_table(arms)
    print(result["verdict"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The paper's Figure 4 in miniature: GRPO vs GRPO-RoC from one SFT policy, over several seeds.

    uv run python bench/roc_vs_grpo.py [RECIPE] [a.b=value ...] [--seeds 0 1 2] [--jobs 2]
        [--eval-samples N] [--work runs/roc_vs_grpo] [--json bench/results/roc_vs_grpo.json]

1. SFT once: `rstar2-train RECIPE` (default `tiny-failed-checks`, whose SFT policy fails on a
   share of its tool calls and often still answers correctly) until it writes checkpoint 0, the
   policy right after SFT (then stopped), exported as a policy folder (`--export --step 0`).
   Every arm and seed starts RL from that one policy, so a seed varies RL only (rollout
   sampling, batches, resampling), not SFT.
2. RL, per arm and seed: `rstar2-train RECIPE model={kind: pretrained, path: SFT_POLICY}
   sft.enabled=false run.seed=S` plus the arm's overrides. Both arms sample the same 2G rollouts
   per problem, reject equal-reward groups, keep G per group with the same counts (floor(n_neg/2)
   negatives uniformly, the rest positives) and train with the same loss; they differ only in how
   the positives are chosen (evaluated on the SFT run's held-out problems, `held_out_of_sft`):
   - `grpo`: uniformly (RoC's rule with both penalties off: every weight equal);
   - `grpo_roc`: with probability proportional to 1 / (p_err + p_format + eps) (the paper's RoC).
   `--jobs` runs go at once (each trainer on one torch thread); a finished run (its `policy/`
   folder written) is skipped, an unfinished one resumed, so the command can be re-run.
3. Read every run's metrics.jsonl, print one table, write the JSON (below) and a PNG beside it:
   per RL step the tool-error ratio in positive rollouts, response length and format penalty of
   the step's rollouts; held-out accuracy and tool-error ratio in correct trajectories at every
   evaluation; mean and a 95 % t-interval over seeds per arm.

JSON: exactly `{"arms": {"grpo": [RUN, ...], "grpo_roc": [RUN, ...]}, "verdict": "..."}`, a RUN is
`{"seed", "steps": [{"step", "tool_error_ratio_pos", "accuracy", ...}], "final_accuracy",
"final_tool_error_ratio_pos", "rl_steps": [...]}`. `steps` holds the held-out evaluations (step 0
is right after SFT, then the end of each stage): accuracy and tool-error ratio in correct
trajectories of the same 512 sampled trajectories; `rl_steps` the training rollouts of each RL
step. The verdict compares the arms' 95 % intervals of the final held-out numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ARMS = {
    "grpo": [
        "algo.roc.kind=sampled",
        "algo.roc.tool_error_penalty=false",
        "algo.roc.format_penalty=false",
    ],
    "grpo_roc": [],
}
RL_KEYS = (
    "tool_error_ratio_pos",
    "kept_tool_error_ratio_pos",
    "response_len_mean",
    "format_penalty_pos",
    "positive_penalty_before",
    "positive_penalty_after",
    "reward",
    "tool_calls_mean",
)
# Two-sided 97.5 % quantiles of Student's t by degrees of freedom (1..10); 1.96 beyond 30.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
_T975 |= {9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    """Student's t quantile for a 95 % two-sided interval (the next smaller tabled df)."""
    if df > 30:
        return 1.96
    return _T975[max(k for k in _T975 if k <= df)]


def interval(values: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): a 95 % t-interval of the mean; None without values."""
    if not values:
        return None
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, float("nan"), float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def run_record(seed: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's RUN entry from its metrics.jsonl records."""
    evals = [r for r in records if r.get("phase") in ("eval", "benchmark")]
    steps = [
        {
            "step": r["step"],
            "when": r.get("when"),
            "tool_error_ratio_pos": r.get("tool_error_ratio_pos"),
            "accuracy": r.get("accuracy"),
            "response_length": r.get("response_len_mean"),
            "format_penalty_pos": r.get("format_penalty_pos"),
        }
        for r in evals
    ]
    rl_steps = [
        {"step": r["step"], **{k: r.get(k) for k in RL_KEYS}}
        for r in records
        if r.get("phase") == "rl"
    ]
    last = steps[-1] if steps else {}
    half = len(rl_steps) // 2
    return {
        "seed": seed,
        "steps": steps,
        "final_accuracy": last.get("accuracy"),
        "final_tool_error_ratio_pos": last.get("tool_error_ratio_pos"),
        # The training rollouts: positives offered to the resampler and those kept, over all
        # RL steps, and the offered ones over the second half of training.
        "rl_tool_error_ratio_pos_mean": _mean(s["tool_error_ratio_pos"] for s in rl_steps),
        "rl_kept_tool_error_ratio_pos_mean": _mean(
            s["kept_tool_error_ratio_pos"] for s in rl_steps
        ),
        "rl_tool_error_ratio_pos_late": _mean(s["tool_error_ratio_pos"] for s in rl_steps[half:]),
        "rl_steps": rl_steps,
    }


def _mean(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _fmt(ci: tuple[float, float, float] | None) -> str:
    if ci is None:
        return "n/a"
    mean, low, high = ci
    return f"{mean:.3f}" if math.isnan(low) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def verdict(arms: dict[str, list[dict[str, Any]]]) -> str:
    """One line from the final held-out numbers: RoC's tool-error ratio and accuracy vs GRPO's."""
    cis = {
        key: {
            arm: interval([r[key] for r in runs if r.get(key) is not None])
            for arm, runs in arms.items()
        }
        for key in ("final_tool_error_ratio_pos", "final_accuracy")
    }
    n = {arm: len(runs) for arm, runs in arms.items()}
    err, acc = cis["final_tool_error_ratio_pos"], cis["final_accuracy"]
    if any(ci is None for ci in (*err.values(), *acc.values())) or min(n.values()) < 2:
        return (
            f"inconclusive: too few finished runs ({n}); tool-error ratio in correct "
            f"grpo_roc {_fmt(err['grpo_roc'])} vs grpo {_fmt(err['grpo'])}"
        )
    roc, base = err["grpo_roc"], err["grpo"]
    assert roc is not None and base is not None
    if roc[2] < base[1]:
        err_says = "RoC lower, 95 % intervals disjoint"
    elif roc[1] > base[2]:
        err_says = "RoC higher, 95 % intervals disjoint"
    else:
        err_says = "no difference (95 % intervals overlap)"
    roc_acc, base_acc = acc["grpo_roc"], acc["grpo"]
    assert roc_acc is not None and base_acc is not None
    if roc_acc[2] < base_acc[1]:
        acc_says = "RoC lower, intervals disjoint"
    elif roc_acc[1] > base_acc[2]:
        acc_says = "RoC higher, intervals disjoint"
    else:
        acc_says = "within noise (intervals overlap)"
    target = err_says.startswith("RoC lower") and not acc_says.startswith("RoC lower")
    return (
        f"final held-out tool-error ratio in correct trajectories: grpo_roc {_fmt(roc)} vs "
        f"grpo {_fmt(base)} -> {err_says}; accuracy: grpo_roc {_fmt(roc_acc)} vs grpo "
        f"{_fmt(base_acc)} -> {acc_says}; seeds {n['grpo_roc']}+{n['grpo']}; issue target "
        f"{'met' if target else 'not met'}"
    )


def summary(arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The JSON document: exactly the arms and the verdict (issue 22's contract)."""
    return {"arms": arms, "verdict": verdict(arms)}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "rstar2_trainer.cli", *args]


def run_logged(cmd: list[str], log: Path) -> int:
    """Run `cmd` with its output in `log`; print the command and how it ended."""
    print("running", shlex.join(cmd[2:]), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    print(f"{'done' if code == 0 else f'FAILED ({code}), see {log}'}: {log.parent}", flush=True)
    return code


def sft_policy(recipe: str, overrides: list[str], work: Path) -> Path:
    """The recipe's SFT policy (checkpoint 0) as a policy folder; made once.

    The recipe runs until its checkpoint 0 (the policy after SFT, with its evaluation) is
    written and is then stopped: its RL steps would be one more GRPO-RoC run."""
    run_dir, policy = work / "sft", work / "sft_policy"
    if (policy / "config.json").is_file():
        return policy
    if not (run_dir / "checkpoints" / "latest").is_file():
        if (run_dir / "config.yaml").is_file():
            cmd = trainer("--resume", str(run_dir))
        else:
            cmd = trainer(
                recipe, *overrides, f"run.output_dir={run_dir}", "run.keep_checkpoints=1000"
            )
        print("running", shlex.join(cmd[2:]), "(until checkpoint 0)", flush=True)
        work.mkdir(parents=True, exist_ok=True)
        with (work / "sft.log").open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            while proc.poll() is None and not (run_dir / "checkpoints" / "latest").is_file():
                time.sleep(2)
            proc.terminate()  # the trainer stops its servers on SIGTERM
            proc.wait()
        if not (run_dir / "checkpoints" / "latest").is_file():
            raise SystemExit(f"SFT run failed: {work / 'sft.log'}")
    cmd = trainer("--export", str(run_dir), "--step", "0", "--to", str(policy))
    if run_logged(cmd, work / "export.log") != 0:
        raise SystemExit(f"export failed: {work / 'export.log'}")
    return policy


def held_out_of_sft(work: Path, samples: int | None = None) -> list[str]:
    """Overrides that evaluate on the SFT run's held-out problems, with its protocol (`samples`
    per problem instead of its own when given: more trajectories measure a small tool-error
    ratio more closely).

    A run without SFT holds out only what its own RL data lacks, so its synthetic held-out set
    would share questions with the SFT traces (36 of 128 did); the SFT run's set excludes both.
    As a benchmark file it is also kept out of each run's RL problems."""
    sft = work / "sft"
    e = yaml.safe_load((sft / "config.yaml").read_text())["eval"]
    return [
        "eval.synthetic=false",
        f"eval.sources=[{(sft / 'heldout.jsonl').resolve()}]",
        f"eval.benchmark.samples={samples or e['samples']}",
        f"eval.benchmark.temperature={e['temperature']}",
        f"eval.benchmark.max_turns={e['max_turns']}",
        f"eval.benchmark.max_response_tokens={e['max_response_tokens']}",
    ]


def rl_run(
    recipe: str,
    overrides: list[str],
    policy: Path,
    arm: str,
    seed: int,
    work: Path,
    eval_samples: int | None = None,
    arms: dict[str, list[str]] = ARMS,
) -> int:
    """One arm (its overrides in `arms`) and seed from the SFT policy; skipped when finished,
    resumed when started."""
    run_dir = work / f"{arm}-s{seed}"
    if (run_dir / "policy" / "config.json").is_file():
        return 0
    if (run_dir / "config.yaml").is_file():
        cmd = trainer("--resume", str(run_dir))
    else:
        cmd = trainer(
            recipe,
            *overrides,
            f"model={{kind: pretrained, path: {policy.resolve()}}}",
            "sft.enabled=false",
            f"run.seed={seed}",
            "run.threads=1",
            f"run.name={arm}-s{seed}",
            f"run.output_dir={run_dir}",
            *held_out_of_sft(work, eval_samples),
            *arms[arm],
        )
    return run_logged(cmd, work / f"{arm}-s{seed}.log")


def run_arms(
    recipe: str,
    overrides: list[str],
    arms: dict[str, list[str]],
    seeds: list[int],
    jobs: int,
    work: Path,
    eval_samples: int | None = None,
) -> None:
    """SFT once, then every arm and seed from its policy, `jobs` runs at once (seed by seed, the
    arms of a seed together, so they share the machine's load)."""
    policy = sft_policy(recipe, overrides, work)
    with ThreadPoolExecutor(jobs) as pool:
        futures = [
            pool.submit(rl_run, recipe, overrides, policy, arm, seed, work, eval_samples, arms)
            for seed in seeds
            for arm in arms
        ]
        codes = [f.result() for f in futures]
    if any(codes):
        print("some runs failed; the JSON holds the finished ones", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description="GRPO vs GRPO-RoC from one SFT policy")
    parser.add_argument("recipe", nargs="?", default="tiny-failed-checks")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="RL runs at once")
    parser.add_argument("--work", type=Path, default=Path("runs/roc_vs_grpo"))
    parser.add_argument("--json", type=Path, default=Path("bench/results/roc_vs_grpo.json"))
    parser.add_argument(
        "--eval-samples",
        type=int,
        help="samples per held-out problem in every evaluation of the RL runs (default: the "
        "SFT run's eval.samples)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="summarise the finished runs; start none"
    )
    args = parser.parse_args()
    if not args.report_only:
        run_arms(
            args.recipe, args.overrides, ARMS, args.seeds, args.jobs, args.work, args.eval_samples
        )
    arms: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for arm in ARMS:
        for seed in args.seeds:
            run_dir = args.work / f"{arm}-s{seed}"
            if (run_dir / "policy" / "config.json").is_file():
                arms[arm].append(run_record(seed, read_metrics(run_dir)))
    result = summary(arms)
    print_table(arms)
    print(result["verdict"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    png = args.json.with_suffix(".png")
    plot(arms, png)
    print(f"wrote {args.json} and {png}")
    return 0


def print_table(arms: dict[str, list[dict[str, Any]]]) -> None:
    print(
        f"{'arm':<10}{'seed':>5}  "
        + "  ".join(f"{'step':>4} {'acc':>5} {'err+':>5}" for _ in range(4))
    )
    for arm, runs in arms.items():
        for r in runs:
            cells = []
            for s in r["steps"]:
                err = s["tool_error_ratio_pos"]
                cells.append(
                    f"{s['step']:>4} {s['accuracy']:>5.3f} {'-' if err is None else f'{err:.3f}':>5}"
                )
            print(f"{arm:<10}{r['seed']:>5}  " + "  ".join(cells))
    print("training rollouts, tool-error ratio in positives (mean over RL steps):")
    for arm, runs in arms.items():
        for key in (
            "rl_tool_error_ratio_pos_mean",
            "rl_kept_tool_error_ratio_pos_mean",
            "rl_tool_error_ratio_pos_late",
        ):
            print(
                f"  {arm:<10}{key:<36}{_fmt(interval([r[key] for r in runs if r[key] is not None]))}"
            )


def _band(series: list[list[float | None]]) -> tuple[list[float], list[float], list[float]]:
    """Per position: mean and 95 % t-interval over the runs that have a value there."""
    means, lows, highs = [], [], []
    for column in zip(*series, strict=False):
        ci = interval([v for v in column if v is not None])
        mean, low, high = ci if ci is not None else (math.nan, math.nan, math.nan)
        means.append(mean)
        lows.append(mean if math.isnan(low) else low)
        highs.append(mean if math.isnan(high) else high)
    return means, lows, highs


def plot(arms: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("rl_steps", "tool_error_ratio_pos", "tool-error ratio, positive rollouts"),
        ("steps", "accuracy", "held-out accuracy (128 x 4, T=0.6)"),
        ("steps", "tool_error_ratio_pos", "held-out tool-error ratio, correct"),
        ("rl_steps", "response_len_mean", "response length (tokens)"),
        ("rl_steps", "format_penalty_pos", "format penalty, positive rollouts"),
        ("rl_steps", "kept_tool_error_ratio_pos", "tool-error ratio, kept positives"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (where, key, title) in zip(axes.flat, panels, strict=True):
        for arm, runs in arms.items():
            if not runs:
                continue
            longest = max(runs, key=lambda r: len(r[where]))
            xs = [s["step"] for s in longest[where]]
            series = [[s.get(key) for s in r[where]] for r in runs]
            means, lows, highs = _band(series)
            xs = xs[: len(means)]
            (line,) = ax.plot(xs, means, marker="o", ms=3, label=f"{arm} (n={len(runs)})")
            ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("GRPO vs GRPO-RoC from one SFT policy: mean and 95 % interval over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())

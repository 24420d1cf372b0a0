"""Capacity model of one RL step: where the time goes, and how busy the GPUs and CPUs are.

From per-phase numbers measured on real hardware (engine token throughput, sandbox latency and
throughput, grading throughput, training time per token, weight-sync time) it estimates the step
time of the paper's setting (64 GPUs, 512 prompts x 32 rollouts, 8K/12K/12K-hard stages) and
prints one table, one column per stage, plus JSON.

The rollout phase is simulated, not averaged: every trajectory is drawn (length from a lognormal
truncated at the maximum length whose mean and share at the cap are given; tool calls from a
Poisson), engines admit as many trajectories as their KV cache holds at the maximum length (the
paper's scheduler) and refill a slot the moment a trajectory ends; a trajectory keeps its slot
while it waits for a tool; the decode rate of a sequence falls with the number decoding beside
it (batch-1 speed and full-batch throughput are the two measured points); tool calls queue for a
sandbox whose concurrency is throughput x latency (Little's law); answers queue for grading.
Training, old-logprob recomputation and weight sync follow after the rollout (colocated engines:
every GPU rolls out, then every GPU trains). SCALE.md lists the assumptions and the defaults.

  uv run python bench/capacity.py                      # the defaults: assumed MI300X numbers
  uv run python bench/capacity.py --from measured.json --engine-tokens-per-s 4100
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Stage:
    name: str
    steps: int  # optimizer steps the paper ran in this stage
    max_len: int  # response budget in tokens (generated + tool output)
    mean_response: float  # mean response tokens, after truncation at max_len
    clip_fraction: float  # share of trajectories that hit max_len
    tool_calls: float  # mean tool calls per trajectory (Poisson)
    max_turns: int


PAPER_STAGES = (
    Stage("stage1-8K", 300, 8192, 2500, 0.08, 2.0, 10),
    Stage("stage2-12K", 85, 12288, 5000, 0.10, 2.75, 10),
    Stage("stage3-12K-hard", 125, 12288, 7000, 0.12, 3.0, 15),
)


@dataclass(frozen=True)
class Capacity:
    """Defaults are ASSUMED numbers for Qwen3-14B on MI300X (none measured here; see SCALE.md)."""

    gpus: int = 64
    gpus_per_node: int = 8
    cpu_cores_per_node: int = 192
    tp: int = 1  # GPUs per engine
    prompts: int = 512
    rollouts_per_prompt: int = 32
    kept_per_prompt: int = 16
    group_drop_fraction: float = 0.25  # groups dropped as all-correct / all-wrong
    prompt_tokens: int = 300
    tool_output_tokens: int = 80  # per call, prefilled rather than decoded
    kv_tokens_per_engine: int = 750_000  # vLLM's "KV cache size" line
    max_seqs_per_engine: int = 256
    engine_tokens_per_s: float = 3500.0  # decode throughput with engine_batch sequences
    engine_batch: int = 64  # the number of sequences decoding when that was measured
    single_stream_tokens_per_s: float = 70.0  # decode, one sequence alone
    prefill_tokens_per_s: float = 20_000.0  # per engine, for tool outputs
    tool_latency_s: float = 0.3  # sandbox end-to-end latency of one call, unloaded
    tool_calls_per_s: float = 10_000.0  # sandbox throughput, whole cluster
    grade_per_s: float = 500.0  # verify throughput, whole cluster
    update_gpu_us_per_token: float = 240.0  # forward+backward(+recompute) GPU-microseconds/token
    recompute_old_logprobs: bool = True  # one extra forward (1/4 of an update) before updating
    weight_sync_s: float = 20.0  # push weights to engines, sleep/wake, reset the prefix cache
    # Colocated ranks move their training state (14B: 16 B/param over 64 ranks, 3.7 GB per GPU)
    # to host memory after the push and back before the update: ~7.4 GB a step per GPU. Measured
    # on one H200 (docs/RESULTS.md, "First GPU run"): ~50 GB/s each way once host memory is
    # pinned (0.15 s); 0.75 s keeps a 5x margin for other hosts' links.
    train_state_offload_s: float = 0.75
    other_s: float = 10.0  # data, advantages, RoC, logging, checkpoint share
    dt_s: float = 0.25  # simulation time step
    seed: int = 0
    stages: tuple[Stage, ...] = field(default=PAPER_STAGES)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in ("seed", "stages", "recompute_old_logprobs", "other_s") and value <= 0:
                raise ValueError(f"{f.name} must be positive (got {value})")
        if self.gpus % self.tp or not 0 <= self.group_drop_fraction < 1:
            raise ValueError("gpus must be a multiple of tp, and 0 <= group_drop_fraction < 1")
        if not self.stages:
            raise ValueError("give at least one stage")


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _inv_phi(p: float) -> float:
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _phi(mid) < p else (lo, mid)
    return (lo + hi) / 2


def lognormal_for(mean: float, cap: float, clip: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal L with E[min(L, cap)] = mean and P(L >= cap) = clip."""
    if not 0 < mean < cap or not 0 < clip < 1:
        raise ValueError(f"need 0 < mean < max_len and 0 < clip < 1 (mean={mean}, clip={clip})")
    z = _inv_phi(1 - clip)

    def truncated_mean(s: float) -> float:
        mu = math.log(cap) - s * z
        a = (math.log(cap) - mu) / s
        return math.exp(mu + s * s / 2) * _phi(a - s) + cap * (1 - _phi(a))

    lo, hi = 1e-3, 6.0  # the truncated mean falls as sigma grows
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if truncated_mean(mid) > mean else (lo, mid)
    s = (lo + hi) / 2
    return math.log(cap) - s * z, s


def simulate_rollout(c: Capacity, stage: Stage) -> dict[str, float]:
    rng = np.random.default_rng(c.seed)
    n = c.prompts * c.rollouts_per_prompt
    engines = c.gpus // c.tp
    slots = min(c.max_seqs_per_engine, c.kv_tokens_per_engine // (c.prompt_tokens + stage.max_len))
    if slots < 1:
        raise ValueError("an engine's KV cache cannot hold one trajectory at the maximum length")
    mu, sigma = lognormal_for(stage.mean_response, stage.max_len, stage.clip_fraction)
    length = np.minimum(rng.lognormal(mu, sigma, n), stage.max_len)  # [N]
    calls = np.minimum(rng.poisson(stage.tool_calls, n), stage.max_turns - 1)  # [N]
    generated = np.maximum(length - calls * c.tool_output_tokens, 16.0)  # [N]
    # Split each trajectory's generated tokens over its turns.
    cuts = rng.dirichlet(np.ones(stage.max_turns), n)  # [N, turns]
    turn_mask = np.arange(stage.max_turns)[None, :] <= calls[:, None]
    cuts = cuts * turn_mask
    segments = generated[:, None] * cuts / cuts.sum(1, keepdims=True)  # [N, turns]
    # Decode step time of an engine with k sequences decoding: t0 + k * per_seq.
    t0 = 1.0 / c.single_stream_tokens_per_s
    per_seq = max(0.0, (c.engine_batch / c.engine_tokens_per_s - t0) / max(1, c.engine_batch - 1))
    sandbox_slots = max(1, round(c.tool_calls_per_s * c.tool_latency_s))
    tool_wait = c.tool_latency_s + c.tool_output_tokens / c.prefill_tokens_per_s

    engine = np.full(n, -1)
    turn = np.zeros(n, dtype=np.int64)
    left = segments[:, 0].copy()
    state = np.zeros(n, dtype=np.int8)  # 0 queued, 1 decoding, 2 tool queued, 3 tool, 4 done
    timer = np.zeros(n)
    enqueued = np.zeros(n)
    done_at = np.full(n, np.nan)
    next_up, t, dt = 0, 0.0, c.dt_s
    busy_slot_s = decode_slot_s = tool_slot_s = decoded = 0.0
    peak_tools, tool_queue_s = 0, 0.0
    while next_up < n or (state < 4).any():
        # Admit queued trajectories into free KV slots.
        active = np.bincount(engine[(state > 0) & (state < 4)], minlength=engines)
        for e in np.flatnonzero(active < slots):
            take = min(slots - active[e], n - next_up)
            engine[next_up : next_up + take] = e
            state[next_up : next_up + take] = 1
            next_up += take
        decoding = state == 1
        k = np.bincount(engine[decoding], minlength=engines)  # [E]
        rate = 1.0 / (t0 + k * per_seq)  # tokens/s per sequence, [E]
        step = rate[engine[decoding]] * dt
        decoded += float(np.minimum(step, left[decoding]).sum())
        left[decoding] -= step
        # Tools: finish, then start queued calls up to the sandbox's concurrency.
        timer[state == 3] -= dt
        back = (state == 3) & (timer <= 0)
        turn[back] += 1
        left[back] = segments[back, turn[back]]
        state[back] = 1
        finished = decoding & (left <= 0)
        to_tool = finished & (turn < calls)
        state[to_tool], enqueued[to_tool] = 2, t
        ended = finished & ~to_tool
        state[ended], done_at[ended] = 4, t + dt
        queued = np.flatnonzero(state == 2)
        free = sandbox_slots - int((state == 3).sum())
        if free > 0 and queued.size:
            start = queued[np.argsort(enqueued[queued], kind="stable")[:free]]
            state[start], timer[start] = 3, tool_wait
            tool_queue_s += float((t - enqueued[start]).sum())
        peak_tools = max(peak_tools, int(((state == 2) | (state == 3)).sum()))
        busy = (state > 0) & (state < 4)
        busy_slot_s += float(busy.sum()) * dt
        decode_slot_s += float((state == 1).sum()) * dt
        tool_slot_s += float(((state == 2) | (state == 3)).sum()) * dt
        t += dt
    # Grading: answers queue for the verifier in the order they finish.
    order = np.sort(done_at)
    graded = (
        np.maximum.accumulate(order - np.arange(n) / c.grade_per_s) + np.arange(n) / c.grade_per_s
    )
    graded_end = float(graded[-1] + 1.0 / c.grade_per_s)
    rollout_end = float(order[-1])
    tool_calls = int(calls.sum())
    return {
        "slots_per_engine": slots,
        "rollout_s": rollout_end,
        "rollout_90pct_s": float(order[int(0.9 * n)]),
        "grading_after_rollout_s": graded_end - rollout_end,
        "generated_tokens": decoded,
        "mean_response_tokens": float(length.mean()),
        "tool_calls": tool_calls,
        "peak_concurrent_tool_calls": peak_tools,
        "mean_tool_latency_s": tool_wait + tool_queue_s / max(1, tool_calls),
        "engine_tokens_per_s_full": slots / (t0 + slots * per_seq),
        "decode_utilisation": decoded / (engines * slots / (t0 + slots * per_seq) * rollout_end),
        "slot_occupancy": busy_slot_s / (engines * slots * rollout_end),
        "slot_time_waiting_for_tools": tool_slot_s / max(busy_slot_s, 1e-9),
        "slot_time_decoding": decode_slot_s / max(busy_slot_s, 1e-9),
    }


def estimate(c: Capacity, stage: Stage) -> dict[str, float]:
    """One stage's step: the simulated rollout, then training and sync; times and utilisation."""
    r = simulate_rollout(c, stage)
    kept = c.prompts * (1 - c.group_drop_fraction) * c.kept_per_prompt
    train_tokens = kept * (c.prompt_tokens + r["mean_response_tokens"])
    update_s = train_tokens * c.update_gpu_us_per_token * 1e-6 / c.gpus
    logprob_s = update_s / 4 if c.recompute_old_logprobs else 0.0
    phases = {
        "rollout: first 90% of trajectories": r["rollout_90pct_s"],
        "rollout: last 10% (long tail)": r["rollout_s"] - r["rollout_90pct_s"],
        "grading after the last rollout": r["grading_after_rollout_s"],
        "old logprobs (forward)": logprob_s,
        "update (forward + backward)": update_s,
        "weight sync to engines": c.weight_sync_s,
        "training state offload + onload": c.train_state_offload_s,
        "other (data, RoC, log, ckpt)": c.other_s,
    }
    step_s = sum(phases.values())
    rollout_gpu_s = r["decode_utilisation"] * r["rollout_s"] * c.gpus
    slots_rate = r["engine_tokens_per_s_full"]
    nodes = max(1, c.gpus // c.gpus_per_node)
    sandbox_cpu_s = r["tool_calls"] * c.tool_latency_s  # one core per running call
    n_answers = c.prompts * c.rollouts_per_prompt  # grading: one core-second / grade_per_s each
    return {
        **{f"time/{k}": v for k, v in phases.items()},
        "time/step": step_s,
        "rollout/slots per engine (KV at max length)": r["slots_per_engine"],
        "rollout/generated tokens (M)": r["generated_tokens"] / 1e6,
        "rollout/mean response tokens": r["mean_response_tokens"],
        "rollout/engine tokens/s at full KV": slots_rate,
        "rollout/decode utilisation": r["decode_utilisation"],
        "rollout/KV slot occupancy": r["slot_occupancy"],
        "rollout/slot time waiting for tools": r["slot_time_waiting_for_tools"],
        "tools/calls per step": r["tool_calls"],
        "tools/peak concurrent calls": r["peak_concurrent_tool_calls"],
        "tools/mean latency incl. queue (s)": r["mean_tool_latency_s"],
        "train/tokens per step (M)": train_tokens / 1e6,
        "util/GPU busy over the step": (rollout_gpu_s + (update_s + logprob_s) * c.gpus)
        / (c.gpus * step_s),
        "util/CPU busy over the step": (sandbox_cpu_s + n_answers / c.grade_per_s)
        / (nodes * c.cpu_cores_per_node * step_s),
        "stage/steps": stage.steps,
        "stage/hours": stage.steps * step_s / 3600,
    }


def _fmt(key: str, v: float) -> str:
    if key.startswith(("util/", "rollout/decode", "rollout/KV", "rollout/slot time")):
        return f"{100 * v:.1f}%"
    if key.startswith("time/"):
        return f"{v / 60:.1f} min" if key == "time/step" else f"{v:.0f} s"
    if isinstance(v, int) or float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.2f}"


def print_table(results: dict[str, dict[str, float]]) -> None:
    names = list(results)
    keys = list(results[names[0]])
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{n:>16}" for n in names))
    for k in keys:
        print(f"{k:{width}}  " + "  ".join(f"{_fmt(k, results[n][k]):>16}" for n in names))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--from", dest="source", type=Path, help="JSON file of measured numbers")
    p.add_argument("--out", type=Path, default=Path("bench/results/capacity.json"))
    for f in dataclasses.fields(Capacity):
        if f.name == "stages":
            continue
        kind = {"int": int, "float": float, "bool": lambda s: s.lower() in ("1", "true", "yes")}
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind[str(f.type)], default=None)
    return p


def load_capacity(args: argparse.Namespace) -> Capacity:
    """Defaults, then the JSON file, then flags. Unknown JSON keys are an error."""
    values: dict = {}
    if args.source is not None:
        values = json.loads(args.source.read_text())
        known = {f.name for f in dataclasses.fields(Capacity)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{args.source}: unknown keys {unknown}; known: {sorted(known)}")
        if "stages" in values:
            values["stages"] = tuple(Stage(**s) for s in values["stages"])
    for f in dataclasses.fields(Capacity):
        flag = getattr(args, f.name, None)
        if flag is not None:
            values[f.name] = flag
    return Capacity(**values)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        c = load_capacity(args)
        results = {s.name: estimate(c, s) for s in c.stages}
    except (OSError, ValueError, TypeError) as exc:
        print(f"capacity: {exc}", file=sys.stderr)
        return 2
    print_table(results)
    total_h = sum(r["stage/hours"] for r in results.values())
    steps = sum(s.steps for s in c.stages)
    print(f"\n{steps} steps: {total_h:.0f} h = {total_h / 24:.1f} days "
          f"({60 * total_h / steps:.1f} min per step on average)")  # fmt: skip
    print("paper: 510 steps within one week (<= ~20 min/step), 0.3 s per tool call, "
          "up to 45K tool calls per step")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    inputs = dataclasses.asdict(c)
    args.out.write_text(json.dumps({"inputs": inputs, "stages": results}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

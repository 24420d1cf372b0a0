#!/usr/bin/env bash
# The GPU check: what a machine with one GPU says about rstar2's GPU path, in one JSON summary.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # default OUT_DIR: bench/results/gpu_check
#
# Stages, each under its own timeout and all under GPU_CHECK_BUDGET_S (default 540 s, so one call
# fits a 10-minute slot: a stage gets at most what is left, and once under 30 s are left the rest
# are recorded as skipped), in this order, most wanted first; GPU_CHECK_STAGES (space-separated
# names; env always runs) picks some, e.g. two calls of "order speed block" and "tiny_hf memory
# gpu_step lora". The expected times are one H200's; without vLLM and Ray (a bare image with torch
# and transformers) all of them but lora (not yet run on a GPU) take about 9-10 minutes:
#   env        driver, torch, vLLM, Ray, NCCL/RCCL versions, shared-memory size, Ray's NOSET_*
#              (5 s; limit 60 s)
#   order      bench/gpu_order.py: an NCCL world of one through the trainer's own order (step,
#              offload, DCP save, export, onload), every parameter's device at each point
#              (about 1 min; limit 180 s; skipped where the file is missing)
#   speed      bench/train_speed.py: a Qwen3-4B-shaped RL step (FSDP2 world of one, bf16,
#              checkpointing) on 8 stage-3 rows, packed and padded: tokens/s, MFU (6 x params x
#              tokens / s / the device's dense bf16 peak), peak memory, the attention kernel
#              and first a check of that kernel against per-row fp32 SDPA on the 4B's heads
#              (about 2 min; 300 s)
#   block      bench/memory_fit.py --gpu --only the two block shapes: one Qwen3-14B block and
#              its head at 12K, stage-3 rows packed into one 32,768-token micro-batch, its peak
#              against the memory model; the same rows padded beside it (about 1 min; 180 s)
#   tiny_hf    bench/gpu_tiny_hf.py: `rstar2-train tiny` end to end in one process with
#              engine.kind=hf, the driver training on the GPU (4 SFT steps, 2 RL steps; vLLM and
#              Ray unimportable), exit status, steps trained, peak memory (about 1.5 min; 240 s)
#   memory     bench/memory_fit.py --gpu on three shapes: the memory model against
#              `max_memory_allocated` of real RL steps on packed rows, the backward and the
#              optimizer step apart (the 14B's width at 12K, the gpu-1 recipe's step, Qwen3-0.6B
#              without checkpointing) (about 2.5 min; 240 s)
#   gpu_step   bench/gpu_step.py: the GRPO-RoC step at Qwen's 151,936 vocabulary and 4K-token
#              sequences (peak memory), FSDP2 under torchrun, and the sync check (one RL step,
#              push to a vLLM engine, greedy output changes and equals transformers' bf16)
#              (about 45 s without vLLM; 180 s)
#   lora       bench/lora_step.py: a Qwen3-shaped LoRA step (the 8B's width at 8K tokens, 4 of
#              its blocks, the frozen bf16 base, rank-32 adapters) through the trainer's own
#              `lora.apply_lora` and `train_step`: step seconds, peak allocated memory against the
#              memory model, adapter bytes, the base unchanged (needs PEFT; limit 300 s)
#   colocated  `rstar2-train tiny` on the GPU with one FSDP2 rank and its engine colocated, for
#              two RL steps (sleep, offload, sync, wake timings from the run's metrics; no OOM)
#              (needs vLLM and Ray; 240 s)
# Writes OUT_DIR/summary.json (every stage's status, seconds and numbers) and each stage's log.
# On a machine without a GPU it prints one line and exits 2.
#
# Without a synced workspace (.venv; a bare GPU image with torch and transformers) it runs the
# workspace from source (PYTHONPATH) under `python3`; a stage whose needs are missing there (vLLM
# for gpu_step's engine phase, Ray and vLLM for colocated, the trainer's own imports for tiny_hf)
# is recorded as skipped (rc 3) with the reason. Every stage's Python runs on a CPU at toy size
# too (tests/test_gpu_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/gpu_check}"
py=(uv run --locked python)
if [[ ! -x .venv/bin/python ]] || ! command -v uv >/dev/null 2>&1; then
    py=(python3)
    src=$(printf '%s:' "$PWD"/packages/*/src "$PWD"/apps/*/src "$PWD"/proto)
    export PYTHONPATH="${src}${PYTHONPATH:-}"
fi
has() { "${py[@]}" -c "import $1" >/dev/null 2>&1; }

if ! "${py[@]}" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA or ROCm GPU is visible here; run it on a GPU machine" >&2
    exit 2
fi
mkdir -p "$out"

skip_stage() {  # name reason
    wanted "$1" || return 0
    printf '{"stage": "%s", "rc": 3, "seconds": 0.0, "skipped": "%s"}\n' "$1" "$2" >>"$out/stages.jsonl"
    echo "gpu_check: $1 skipped ($2)"
}
budget=${GPU_CHECK_BUDGET_S:-540}  # the whole check's seconds: a lent GPU's time is counted
deadline=$((SECONDS + budget))
stages=" env ${GPU_CHECK_STAGES:-order speed block tiny_hf memory gpu_step lora colocated} "
wanted() { [[ $stages == *" $1 "* ]]; }
run_stage() {  # name timeout_s command...
    local name=$1 limit=$2
    shift 2
    wanted "$name" || return 0
    local start end rc left=$((deadline - SECONDS))
    if ((left < 30)); then
        skip_stage "$name" "skipped: the check's ${budget} s budget is spent"
        return
    fi
    ((limit > left)) && limit=$left
    start=$(date +%s.%N)
    timeout --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    printf '{"stage": "%s", "rc": %d, "seconds": %s}\n' "$name" "$rc" \
        "$(awk "BEGIN {printf \"%.1f\", $end - $start}")" >>"$out/stages.jsonl"
    echo "gpu_check: $name rc=$rc ($(tail -n 1 "$out/$name.log" | cut -c1-120))"
}
: >"$out/stages.jsonl"

run_stage env 60 "${py[@]}" - <<'EOF'
import json, os, shutil, subprocess
import torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
        "device": torch.cuda.get_device_name(0), "devices": torch.cuda.device_count(),
        "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
try:
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as exc:  # RCCL builds report through the same call; some do not
    info["nccl"] = f"unknown ({type(exc).__name__})"
for name in ("vllm", "ray", "transformers"):
    try:
        info[name] = __import__(name).__version__
    except Exception as exc:
        info[name] = f"missing ({type(exc).__name__})"
for tool in ("nvidia-smi", "rocm-smi"):
    if shutil.which(tool):
        q = ["--query-gpu=driver_version", "--format=csv,noheader"] if tool == "nvidia-smi" else ["--showdriverversion"]
        info["driver"] = subprocess.run([tool, *q], capture_output=True, text=True).stdout.strip()
shm = os.statvfs("/dev/shm")
info["shm_gib"] = round(shm.f_frsize * shm.f_blocks / 2**30, 1)
info["noset"] = {k: v for k, v in os.environ.items() if k.startswith("RAY_EXPERIMENTAL_NOSET")}
info["visible"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}
print(json.dumps(info))
EOF

missing() {  # module: nothing when it imports, else the last line of its error
    local err
    err=$("${py[@]}" -c "import $1" 2>&1 >/dev/null) && return 0
    printf '%s\n' "$err" | tail -n 1 | tr -d '"\\' | cut -c1-160
}

if [[ -f bench/gpu_order.py ]]; then
    run_stage order 180 "${py[@]}" bench/gpu_order.py --json "$out/gpu_order.json"
else
    skip_stage order "skipped: bench/gpu_order.py missing"
fi

run_stage speed 300 "${py[@]}" bench/train_speed.py --json "$out/train_speed.json"

run_stage block 180 "${py[@]}" bench/memory_fit.py --gpu --skip-setups \
    --only qwen3-14b-block-12k-packed qwen3-14b-block-12k-padded --json "$out/block.json"

if wanted tiny_hf; then
    why=$(missing "rstar2_trainer.cli, rstar2_verify, rstar2_sandbox, sympy")
    if [[ -n $why ]]; then
        skip_stage tiny_hf "the trainer does not import here: $why"
    else
        run_stage tiny_hf 240 "${py[@]}" bench/gpu_tiny_hf.py --device cuda --out "$out/tiny_hf"
    fi
fi

run_stage memory 240 "${py[@]}" bench/memory_fit.py --gpu --skip-setups --only \
    qwen3-14b-l8-12k-expandable qwen3-1.7b-gpu1-6k qwen3-0.6b-4k-no-ckpt \
    --json "$out/memory_fit.json"

skip=()
has vllm || skip=(--skip vllm)
run_stage gpu_step 180 "${py[@]}" bench/gpu_step.py "${skip[@]}" --out "$out/gpu_step.json"

if wanted lora; then
    why=$(missing "peft, rstar2_trainer.training.lora")
    if [[ -n $why ]]; then
        skip_stage lora "the trainer's LoRA does not import here: $why"
    else
        run_stage lora 300 "${py[@]}" bench/lora_step.py --device cuda --hidden 4096 \
            --intermediate 12288 --layers 4 --heads 32 --kv-heads 8 --tokens 8192 --rank 32 \
            --out "$out/lora_step.json"
    fi
fi

if [[ ${py[0]} == python3 ]] || ! has vllm || ! has ray; then
    skip_stage colocated "needs the synced workspace (.venv), Ray and vLLM; this machine lacks one"
else
    run_stage colocated 240 uv run --locked rstar2-train tiny \
    run.name=gpu-check run.runs_root="$out/runs" run.plots=false \
    sft.enabled=false eval.before_sft=false eval.synthetic=false \
    curriculum.plan=custom 'curriculum.stages=[{name: s1, max_response_tokens: 256, max_turns: 2, steps: 2}]' \
    train.device=cuda train.dtype=bfloat16 engine.dtype=bfloat16 \
    cluster.kind=ray cluster.colocate=true cluster.train_workers=1 \
    cluster.gpus_per_train_worker=1 cluster.gpus_per_engine=1 \
    cluster.sandbox_workers=2 cluster.verify_workers=1
fi

"${py[@]}" - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
summary = {"stages": [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]}
env_log = (out / "env.log").read_text().strip().splitlines()
try:
    summary["env"] = json.loads(env_log[-1])
except (IndexError, json.JSONDecodeError):
    summary["env"] = None
def read(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None

fit = read("memory_fit.json")
summary["memory"] = fit["validation"] if fit else None
summary["order"] = read("gpu_order.json")
summary["tiny_hf"] = read("tiny_hf/tiny_hf.json")
block = read("block.json")
summary["block"] = block["validation"] if block else None
summary["speed"] = read("train_speed.json")
summary["lora"] = read("lora_step.json")
step = out / "gpu_step.json"
summary["gpu_step"] = json.loads(step.read_text())["results"] if step.exists() else None
metrics = sorted((out / "runs").glob("*/metrics.jsonl"))
keys = ("time_sleep_s", "time_onload_s", "time_train_s", "time_sync_s", "time_wake_s",
        "time_offload_s", "sync_bytes", "engines_dropped", "reward")
if metrics:
    rows = [json.loads(line) for line in metrics[-1].read_text().splitlines()]
    summary["colocated"] = [{k: r.get(k) for k in ("step", *keys) if k in r or k == "step"}
                            for r in rows if r.get("kind", r.get("phase")) in ("rl", None)]
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(f"gpu_check: wrote {out / 'summary.json'}")
EOF


"""`scripts/gpu_check.sh` on a machine without a GPU: one line that says so, exit status 2; and
each GPU stage's Python run here on the CPU at toy size."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_says_one_line_and_exits_2_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the check would run for real")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 2
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == ["gpu_check: no CUDA or ROCm GPU is visible here; run it on a GPU machine"]
    assert not (tmp_path / "out").exists()  # nothing half-written


# The GPU stages' Python on this CPU at toy size, so a lent GPU is never the first place it runs.


def _bench(name: str):
    """A bench/ module by file name (bench/ on sys.path while it loads: they import siblings)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done


def test_speed_stage_runs_on_cpu_at_toy_size(tmp_path):
    out = tmp_path / "speed.json"
    _run(["bench/train_speed.py", "--device", "cpu", "--tiny", "--rows", "3", "--steps", "1",
          "--json", str(out)])  # fmt: skip
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and r["attention_kernel"] == "rows" and r["peak_flops"] is None
    assert r["kernel_check"]["ok"] and r["kernel_check"]["kernel"] == "rows"
    assert r["rows"] == 3 and r["tokens"] > r["longest_row"] > 0
    for layout in ("packed", "padded"):
        assert r[layout]["step_s"] > 0 and r[layout]["tokens_per_s"] > 0
        assert r[layout]["mfu"] is None  # no peak for a CPU
        assert r[layout]["loss"] == pytest.approx(r["packed"]["loss"], abs=1e-3)


def test_mfu_of_the_h200_probe_steps_is_about_14_percent():
    """The H200 probe (bench/results/gpu_check_h200): the 1.7B's and 4B's steps at 8K."""
    speed = _bench("train_speed")
    runs = json.loads((ROOT / "bench/results/gpu_check_h200/memory_fit_all.json").read_text())
    peak = next(v for k, v in speed.PEAK_FLOPS.items() if k in "NVIDIA H200")
    assert peak == 989e12
    for row in runs["validation"]:
        if row["shape"] not in ("qwen3-1.7b-8k", "qwen3-4b-8k-offload"):
            continue
        m = row["measured"]  # tokens: the step's loss tokens, as the probe reports them
        share = speed.mfu(m["params"], m["tokens"], m["step_s"], peak)
        assert 0.13 < share < 0.145, row["shape"]
    assert speed.mfu(10, 10, 1.0, None) is None


def test_block_stage_shape_runs_on_cpu_at_toy_size():
    """The `block` stage's packed shape (one 14B block at 12K), shrunk: the probe measures it
    and the model predicts no mask for the pack (its padded twin runs the probe's padded path,
    which bench/memory_fit.py's CPU shapes check)."""
    fit = _bench("memory_fit")
    from rstar2_trainer.training.memory import peak_bytes
    from rstar2_trainer.training.memory_probe import measure, probe_setup

    shapes = {s.name: s for s in fit.GPU_SHAPES}
    assert set(fit.BLOCK_SHAPES) <= set(shapes)
    for name in fit.BLOCK_SHAPES[:1]:
        big = shapes[name]
        toy = big.model_copy(update={
            "vocab": 512, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2,
            "head_dim": 16, "prompt_tokens": 8,
            "response_lengths": [n // 128 for n in big.response_lengths],
            "micro_batch_tokens": big.micro_batch_tokens // 128, "device": "cpu",
            "param_dtype": "float32", "expandable_segments": False,
        })  # fmt: skip
        measured = measure(toy, timeout_s=240)
        assert measured["measured_bytes"] > 0 and measured["tokens"] == sum(toy.response_lengths)
        assert toy.packed
        setup = probe_setup(toy)
        assert setup.tokens == toy.micro_batch_tokens  # the rows fill one pack exactly
        assert peak_bytes(setup).training_terms["attention_mask"] == 0


def test_padding_bench_writes_its_contract(tmp_path):
    out = tmp_path / "padding.json"
    _run(["bench/padding.py", "--rows", "64", "--ranks", "4", "--json", str(out)])
    r = json.loads(out.read_text())
    assert set(r) == {"pad_share_padded", "pad_share_packed", "tokens"}
    assert r["pad_share_packed"] == 0.0 < r["pad_share_padded"] < 1 and r["tokens"] > 64 * 300


@pytest.mark.slow
def test_tiny_hf_stage_runs_on_cpu_without_vllm_or_ray(tmp_path):
    done = _run(["bench/gpu_tiny_hf.py", "--device", "cpu", "--out", str(tmp_path)], 1200)
    r = json.loads((tmp_path / "tiny_hf.json").read_text())
    assert r["rc"] == 0 and r["imported"] == [] and r["policy_exported"], done.stdout[-2000:]
    assert r["sft_steps"] > 0 and r["rl_steps"] == 2 and all(r["rl_trained"])


def test_lora_stage_runs_on_cpu_at_toy_size(tmp_path):
    """The `lora` stage's script through the trainer's own LoRA and (packed) `train_step`."""
    pytest.importorskip("peft")
    out = tmp_path / "lora_step.json"
    _run(["bench/lora_step.py", "--vocab", "4096", "--tokens", "256", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and r["loss_went_down"] and r["base_unchanged"]
    assert r["adapter_bytes_bf16"] > 0 and r["predicted_training_gib"] > 0


def test_every_stage_is_a_default_and_can_be_picked_alone():
    """Each stage the script runs or skips is in GPU_CHECK_STAGES' default list (so naming it
    alone runs it) and in the header's list of stages."""
    import re

    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    stages = set(re.findall(r"\b(?:run_stage|skip_stage) ([a-z_]+) ", script))
    default = re.search(r"\$\{GPU_CHECK_STAGES:-([a-z_ ]+)\}", script)
    assert default is not None
    assert stages - {"env"} == set(default.group(1).split())
    assert {"order", "speed", "block", "tiny_hf", "memory", "gpu_step", "lora"} <= stages
    header = set(re.findall(r"^#   ([a-z_]+)  +", script, flags=re.M))  # "name   what it does"
    assert stages == header

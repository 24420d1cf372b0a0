"""`rstar2-rollout serve` as a subprocess on port 0: a tiny model on vLLM (the CPU build here), a
real `rstar2-sandbox serve`, a client that generates, pushes changed weights and sees the effect,
bad weight payloads refused with nothing changed, one-line errors, and SIGTERM. Also the
safetensors header checks of `weights.py`."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rstar2_rollout import RolloutClient, RolloutError, RolloutSampling, RolloutTask
from rstar2_rollout.weights import InvalidWeights, WeightSpec, read_header, to_safetensors

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

BIN = Path(sys.executable).parent


def _start(argv: list[str], timeout_s: float = 240.0) -> tuple[subprocess.Popen[str], str]:
    """Start a `serve` command and return it with the address from its `listening on` line."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    proc.kill()
    raise AssertionError(f"{argv[0]} did not print its address (exit {proc.wait()})")


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "rstar2-rollout"), "serve", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sandbox_address() -> Iterator[str]:
    proc, address = _start([str(BIN / "rstar2-sandbox"), "serve", "--port", "0"])
    yield address
    proc.terminate()
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


# ---------------------------------------------------------------- one-line user mistakes


def test_a_missing_model_folder_is_one_line(tmp_path: Path) -> None:
    out = _serve("--model", str(tmp_path / "nope"), "--sandbox", "local", "--port", "0")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"rstar2-rollout: no model at {tmp_path / 'nope'}: expected a folder with config.json"
        " and weights"
    ]


def test_a_port_in_use_is_one_line(tiny_model: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = _serve("--model", str(tiny_model), "--sandbox", "local", "--port", str(port))
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert f"port {port} on 127.0.0.1 is already in use" in line and "--port" in line


def test_an_unreachable_sandbox_is_one_line(tiny_model: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    out = _serve("--model", str(tiny_model), "--sandbox", dead, "--port", "0", "--engine", "hf")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"rstar2-rollout: no sandbox server answered at {dead}: start `rstar2-sandbox serve`"
    ]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--engine-option", "max_num_seqs=0"],
            "engine.max_num_seqs: Input should be greater than 0 for engine.kind vllm (got 0)",
        ),
        (
            ["--engine", "hf", "--engine-option", "enforce_eager=false"],
            "engine.enforce_eager: unknown key for engine.kind hf (enforce_eager is a key of "
            "engine.kind vllm)",
        ),
    ],
)
def test_engine_settings_are_the_engine_config_and_mistakes_are_one_line(
    tiny_model: Path, args: list[str], line: str
) -> None:
    out = _serve("--model", str(tiny_model), "--sandbox", "local", "--port", "0", *args)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"rstar2-rollout: {line}"]


def test_every_mistake_in_the_settings_is_a_line(tiny_model: Path) -> None:
    # rstar2-config's words, as rstar2-train and rstar2-eval say them
    options = ["max_num_seqs=0", "enforce_eager=maybe", "model=/m"]
    args = [a for option in options for a in ("--engine-option", option)]
    out = _serve("--model", str(tiny_model), "--sandbox", "local", "--port", "0", *args,
                 "--tool-timeout", "-1")  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines[0] == "rstar2-rollout: 4 mistakes in the command line:"
    assert sorted(lines[1:]) == [
        "rstar2-rollout: --engine-option model: the engines run --model; drop the option",
        "rstar2-rollout: --tool-timeout: Input should be greater than 0 (got -1.0)",
        "rstar2-rollout: engine.enforce_eager: Input should be a valid boolean, unable to "
        "interpret input for engine.kind vllm (got 'maybe')",
        "rstar2-rollout: engine.max_num_seqs: Input should be greater than 0 for engine.kind "
        "vllm (got 0)",
    ]


# ---------------------------------------------------------------- weights on the wire


def test_payload_headers_and_the_model_spec(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    state = model.state_dict()
    data = to_safetensors(state.items())
    header = read_header(data)
    spec = WeightSpec.from_model_dir(tiny_model)
    assert spec is not None
    assert {n: i.shape for n, i in header.items()} == {n: tuple(t.shape) for n, t in state.items()}
    assert {n: i.shape for n, i in spec.tensors.items()} == {n: i.shape for n, i in header.items()}
    spec.check(header)
    with pytest.raises(InvalidWeights, match=r"cut off|do not hold"):
        read_header(data[: len(data) // 2])
    with pytest.raises(InvalidWeights, match="no header"):
        read_header(b"\x01")
    bad = read_header(to_safetensors([("lm_head.weight", torch.zeros(7, 3))]))
    with pytest.raises(InvalidWeights, match=r"'lm_head.weight' has shape \[7, 3\]; the model's"):
        spec.check(bad)


# ---------------------------------------------------------------- a real service


@pytest.mark.slow  # vLLM start-up and a sandbox server: ~40 s on a shared 2-core machine
def test_serve_generates_takes_new_weights_and_refuses_bad_ones(
    tiny_model: Path, sandbox_address: str
) -> None:
    from transformers import AutoModelForCausalLM

    argv = [
        str(BIN / "rstar2-rollout"), "serve", "--model", str(tiny_model), "--sandbox",
        sandbox_address, "--port", "0", "--engine", "vllm", "--max-model-len", "1024",
        "--kv-cache-bytes", str(32 << 20), "--system-prompt", "compact",
    ]  # fmt: skip
    proc, address = _start(argv)
    original = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    generator = torch.Generator().manual_seed(0)
    changed = {n: t + 0.05 * torch.randn(t.shape, generator=generator) for n, t in original.items()}
    problem = [RolloutTask("p", "What is 17 + 25?")]
    greedy = RolloutSampling(n=1, temperature=0.0, max_response_tokens=24, max_turns=1)

    async def main():
        async with RolloutClient(address) as client:

            async def say() -> tuple[list[int], list[float]]:
                (r,) = [r async for r in client.generate(problem, greedy)]
                return r.trajectory.response_ids, r.trajectory.logprobs

            before = await say()
            update = await client.update_weights(changed.items(), chunk_bytes=256 << 10)
            after = await say()
            errors = []
            for bad in (
                [("model.layers.0.mlp.gate_proj.weight", torch.zeros(2, 2))],
                [("model.layers.9.self_attn.q_proj.weight", torch.zeros(4, 4))],
            ):
                with pytest.raises(RolloutError) as info:
                    await client.update_weights(bad)
                errors.append(info.value)
            untouched = await say()
            await client.update_weights(original.items())
            restored = await say()
            return before, update, after, errors, untouched, restored

    try:
        before, update, after, errors, untouched, restored = asyncio.run(main())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0  # a clean shutdown on SIGTERM
    assert update.tensors == len(original) and update.engines == ["vllm-0"]
    assert update.bytes > 3 * sum(t.numel() for t in original.values())  # float32 went over
    assert update.load_s > 0 and update.total_s >= update.load_s
    assert before[0] and after[0] != before[0] and after[1] != before[1]
    assert [e.code for e in errors] == ["INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert "'model.layers.0.mlp.gate_proj.weight' has shape [2, 2]; the model's is [" in str(
        errors[0]
    )
    assert "unknown weight 'model.layers.9.self_attn.q_proj.weight'" in str(errors[1])
    assert untouched == after  # a refused payload changed nothing
    assert restored[0] == before[0]  # the original weights give the original greedy answer


@pytest.mark.slow  # imports torch in the child: ~10 s on a shared machine
def test_several_cpu_vllm_engines_in_one_service_are_refused(tiny_model: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    out = _serve("--model", str(tiny_model), "--sandbox", "local", "--port", "0", "--engines", "2")
    assert out.returncode == 2 and "one service per engine" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1

"""FSDP2 training on CPU (gloo): the sharded step equals the plain single-process step.

The multi-process tests launch `_fsdp_worker.py` with torchrun on 127.0.0.1 and compare its
losses and full weights with `reference_step`, which takes the token mean over the whole batch in
one forward pass. The rows are split unevenly over the ranks (different token counts, different
numbers of micro-batches), so a per-rank or per-micro-batch mean would fail these comparisons.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rstar2_trainer.rundir.sharded_checkpoint import load_sharded, save_sharded
from rstar2_trainer.training.batching import token_budget_chunks
from rstar2_trainer.training.distributed import (
    DistributedConfig,
    Row,
    close_distributed,
    init_distributed,
    partition_rows,
    shard_model,
    train_step,
)

WORKER = Path(__file__).resolve().parent / "_fsdp_worker.py"
_spec = importlib.util.spec_from_file_location("_fsdp_worker", WORKER)
assert _spec is not None and _spec.loader is not None
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

ATOL = 1e-6  # fp32; observed differences are ~1e-7


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=ATOL, rtol=1e-5, msg=name)


def _reference(steps: int) -> list[tuple[float, float, dict[str, torch.Tensor]]]:
    model = worker.build_model()
    optimizer = worker.build_optimizer(model)
    out = []
    for step in range(1, steps + 1):
        loss, norm = worker.reference_step(model, optimizer, worker.rows_for_step(step))
        out.append((loss, norm, {k: v.clone() for k, v in model.state_dict().items()}))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], *, nproc: int | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc is None:  # a plain process: a world of one, no launcher
        cmd = [sys.executable, str(WORKER), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(WORKER), *args]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_the_split_is_uneven() -> None:
    """Guards the multi-process tests: ranks differ in loss tokens and in micro-batch counts."""
    rows = worker.rows_for_step(2)
    parts = [worker.rank_rows(rows, r, 2) for r in range(2)]
    tokens = [sum(sum(r.loss_mask) for r in p) for p in parts]
    chunks = [
        len(list(token_budget_chunks([len(r.prompt_ids) + len(r.response_ids) for r in p], 48)))
        for p in parts
    ]
    assert tokens[0] != tokens[1] and chunks[0] != chunks[1]


def test_micro_batched_step_equals_whole_batch_step() -> None:
    """No process group: gradient accumulation over micro-batches is the whole-batch token mean."""
    reference = _reference(2)
    model = worker.build_model()
    optimizer = worker.build_optimizer(model)
    for step in (1, 2):
        result = train_step(
            model,
            optimizer,
            worker.rows_for_step(step),
            worker.policy_loss,
            pad_id=worker.PAD,
            micro_batch_tokens=worker.MICRO_BATCH_TOKENS,
            max_grad_norm=worker.MAX_GRAD_NORM,
        )
        loss, norm, weights = reference[step - 1]
        assert result.micro_batches > 1
        assert result.loss == pytest.approx(loss, abs=1e-6)
        assert result.grad_norm == pytest.approx(norm, rel=1e-5)
        assert result.grad_norm > worker.MAX_GRAD_NORM  # clipping was exercised
        _assert_same_weights(model.state_dict(), weights)


def test_world_of_one_without_torchrun(tmp_path: Path) -> None:
    """init_distributed with no launcher, FSDP2 with activation checkpointing, DCP round trip."""
    config = DistributedConfig(device="cpu", activation_checkpointing=True)
    world = init_distributed(config)
    try:
        assert (world.rank, world.world_size, world.device.type) == (0, 1, "cpu")
        model = shard_model(worker.build_model(), config, world)
        optimizer = worker.build_optimizer(model)
        rows = worker.rows_for_step(1)
        result = train_step(model, optimizer, rows, worker.policy_loss, pad_id=worker.PAD,
                            micro_batch_tokens=worker.MICRO_BATCH_TOKENS,
                            max_grad_norm=worker.MAX_GRAD_NORM)  # fmt: skip
        (loss, _, weights), _ = _reference(2)
        assert result.loss == pytest.approx(loss, abs=1e-6)
        saved = save_sharded(tmp_path, 1, model=model, optimizer=optimizer, state={"seen": 8})
        assert tmp_path / (tmp_path / "latest").read_text().strip() == saved
    finally:
        close_distributed()
    plain = worker.build_model()
    assert load_sharded(saved, model=plain, optimizer=None) == {"step": 1, "seen": 8}
    _assert_same_weights(plain.state_dict(), weights)


def test_bf16_compute_keeps_fp32_master_weights_and_gradients() -> None:
    """The GPU policy (bf16 compute, fp32 reduce) run on CPU: close to fp32, masters stay fp32."""
    config = DistributedConfig(device="cpu", param_dtype="bfloat16", reduce_dtype="float32")
    world = init_distributed(config)
    try:
        model = shard_model(worker.build_model(), config, world)
        optimizer = worker.build_optimizer(model)
        grads: set[torch.dtype] = set()  # the step frees them after use: seen as they land
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: grads.add(p.grad.dtype))  # pyright: ignore[reportOptionalMemberAccess]
        result = train_step(model, optimizer, worker.rows_for_step(1), worker.policy_loss,
                            pad_id=worker.PAD, micro_batch_tokens=worker.MICRO_BATCH_TOKENS,
                            max_grad_norm=worker.MAX_GRAD_NORM)  # fmt: skip
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert grads == {torch.float32}
    finally:
        close_distributed()
    (loss, norm, _), _ = _reference(2)
    assert result.loss == pytest.approx(loss, rel=1e-2)
    assert result.grad_norm == pytest.approx(norm, rel=1e-2)
    assert result.loss != loss  # the forward really ran in bf16


def test_partition_rows_balances_tokens() -> None:
    rows = [Row([1] * n, [2] * n, [1] * n) for n in (9, 1, 5, 5, 4, 2)]
    parts = partition_rows(rows, 2)
    loads = [sum(2 * len(r.prompt_ids) for r in p) for p in parts]
    assert sorted(loads) == [26, 26]
    with pytest.raises(ValueError, match="cannot give each"):
        partition_rows(rows[:1], 2)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="one entry per response token"):
        Row([1], [2, 3], [1])
    with pytest.raises(ValidationError):
        DistributedConfig(micro_batch_tokens=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no GPU is visible"):
            init_distributed(DistributedConfig(device="cuda"))
    model = worker.build_model()
    optimizer = worker.build_optimizer(model)
    with pytest.raises(ValueError, match="at least one row"):
        train_step(model, optimizer, [], worker.policy_loss, pad_id=0, micro_batch_tokens=8)
    with pytest.raises(ValueError, match="no loss tokens"):
        train_step(model, optimizer, [Row([1], [2], [0])], worker.policy_loss, pad_id=0,
                   micro_batch_tokens=8)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint"):
        load_sharded(Path("/nonexistent"), model=model, optimizer=None)


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_two_ranks_load_the_folder_shard_by_shard_as_from_pretrained_does(
    tmp_path: Path, tied: bool
) -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(7)
    config = Qwen3Config(
        vocab_size=95,  # odd: the two ranks' row shards differ in length (48 and 47)
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    model_dir = tmp_path / "model"
    Qwen3ForCausalLM(config).save_pretrained(model_dir, max_shard_size="20KB")
    assert len(list(model_dir.glob("*.safetensors"))) > 1  # several files, read tensor by tensor
    torch.manual_seed(8)
    other = Qwen3ForCausalLM(config).state_dict()  # a driver's model.pt of other weights
    torch.save(other, model_dir / "model.pt")
    out = tmp_path / "out"
    out.mkdir()
    _launch(["load", "--model-dir", str(model_dir), "--out", str(out)], nproc=2)
    want = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    got = torch.load(out / "loaded.pt")
    assert set(got) == set(want.state_dict())
    for name, tensor in want.state_dict().items():
        assert torch.equal(got[name], tensor), name
    with torch.no_grad():  # the rotary inv_freq was recomputed, not left uninitialised
        logits = want(worker.probe_ids()).logits
    torch.testing.assert_close(torch.load(out / "logits.pt"), logits, atol=1e-6, rtol=1e-5)
    # Written back by rank 0 in 4 KB buckets: several files that transformers loads as they were.
    export = out / "export"
    assert len(list(export.glob("model-*-of-*.safetensors"))) > 1
    (export / "config.json").write_text((model_dir / "config.json").read_text())
    again = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).state_dict()
    for name, tensor in want.state_dict().items():
        assert torch.equal(again[name], tensor), name
    # A driver's model.pt, read by rank 0 and broadcast into the shards.
    from_pt = torch.load(out / "from_pt.pt")
    for name, tensor in other.items():
        assert torch.equal(from_pt[name], tensor), name


@pytest.mark.slow
@pytest.mark.parametrize("activation_checkpointing", [False, True])
def test_two_ranks_match_one_process_and_resume_on_one(
    tmp_path: Path, activation_checkpointing: bool
) -> None:
    out = tmp_path / "ws2"
    out.mkdir()
    flags = ["--activation-checkpointing"] if activation_checkpointing else []
    _launch(["train", "--out", str(out), *flags], nproc=2)
    record = json.loads((out / "record.json").read_text())
    assert record["world_size"] == 2
    reference = _reference(2)
    for step in (1, 2):
        loss, norm, weights = reference[step - 1]
        got = record["steps"][f"step{step}"]
        assert got["loss"] == pytest.approx(loss, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(norm, rel=1e-5)
        _assert_same_weights(torch.load(out / f"step{step}.pt"), weights)
    # Resumed from the step-1 checkpoint at world size 2 (inside the same launch).
    loss2, _, weights2 = reference[1]
    assert record["steps"]["resumed_step2"]["loss"] == pytest.approx(loss2, abs=1e-6)
    _assert_same_weights(torch.load(out / "resumed_step2.pt"), weights2)
    if activation_checkpointing:
        return
    checkpoint = out / "ckpt" / "step_000001"
    # Resumed at world size 1: a plain python process, FSDP2 over a world of one.
    one = tmp_path / "ws1"
    one.mkdir()
    _launch(["resume", "--checkpoint", str(checkpoint), "--out", str(one)], nproc=None)
    record1 = json.loads((one / "record.json").read_text())
    assert record1["world_size"] == 1 and record1["state"] == {"step": 1, "seen": 8}
    assert record1["steps"]["resumed_step2"]["loss"] == pytest.approx(loss2, abs=1e-6)
    _assert_same_weights(torch.load(one / "resumed_step2.pt"), weights2)
    # Resumed into a plain unsharded model and optimizer, no process group at all.
    model = worker.build_model()
    optimizer = worker.build_optimizer(model)
    load_sharded(checkpoint, model=model, optimizer=optimizer)
    _assert_same_weights(model.state_dict(), reference[0][2])
    loss, _ = worker.reference_step(model, optimizer, worker.rows_for_step(2))
    assert loss == pytest.approx(loss2, abs=1e-6)
    _assert_same_weights(model.state_dict(), weights2)

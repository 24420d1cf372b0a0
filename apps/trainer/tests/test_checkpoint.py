import json
import random

import numpy as np
import pytest
import torch

from rstar2_trainer.rundir import read_metrics, truncate_metrics
from rstar2_trainer.rundir.checkpoint import (
    check_checkpoint,
    load_latest,
    newest_good,
    save_checkpoint,
)
from rstar2_trainer.rundir.manifest import CheckpointError, check_manifest
from rstar2_trainer.rundir.sharded_checkpoint import save_sharded
from rstar2_trainer.rundir.tracking import JsonlTracker


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def test_roundtrip_restores_weights_optimizer_and_rng(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    save_checkpoint(tmp_path, 3, model=model, optimizer=opt, state={"data": {"pos": 7}})
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99)
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 3 and ckpt.state["data"] == {"pos": 7}
    assert ckpt.model is not None
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(ckpt.model)
    assert torch.equal(fresh.weight, model.weight)
    assert ckpt.optimizer is not None and ckpt.optimizer["state"]


def test_latest_points_at_the_newest_and_old_ones_are_pruned(tmp_path):
    model = _model()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, optimizer=None, state={}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000003"]
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 3


def test_a_torn_temporary_checkpoint_is_ignored(tmp_path):
    model = _model()
    save_checkpoint(tmp_path, 1, model=model, optimizer=None, state={})
    torn = tmp_path / ".tmp_step_000002"
    torn.mkdir()
    (torn / "model.pt").write_bytes(b"half")
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1


def test_no_checkpoint_is_none(tmp_path):
    assert load_latest(tmp_path) is None


def test_metrics_truncate_to_a_step_drops_later_and_torn_lines(tmp_path):
    log = JsonlTracker(tmp_path, resume=None)
    log.log("sft", 1, {"loss": 2.0})
    for step in (1, 2, 3):
        log.log("rl", step, {"reward": step / 10, "nan": float("nan")})
    log.log("benchmark", 3, {"benchmark": "aime", "accuracy": 0.5})
    log.close(ok=False)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"phase": "rl", "step": 4, "rew')  # a line torn by SIGKILL
    truncate_metrics(tmp_path, rl_step=2)
    records = read_metrics(tmp_path)
    assert [(r["phase"], r["step"]) for r in records] == [("sft", 1), ("rl", 1), ("rl", 2)]
    assert records[1]["nan"] is None


def _three(tmp_path, keep=3):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, optimizer=opt, state={"s": step}, keep=keep)
    return model


def test_a_checkpoint_lists_its_files_with_sizes_and_checksums(tmp_path):
    _three(tmp_path)
    manifest = json.loads((tmp_path / "step_000003" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "rng.pt", "state.json"}
    for name, entry in manifest["files"].items():
        assert entry["size"] == (tmp_path / "step_000003" / name).stat().st_size
        assert isinstance(entry["crc32"], int)
    assert check_checkpoint(tmp_path / "step_000003") is None


def test_a_corrupt_latest_is_skipped_with_one_line_and_the_previous_one_used(tmp_path):
    _three(tmp_path)
    model_pt = tmp_path / "step_000003" / "model.pt"
    data = bytearray(model_pt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    model_pt.write_bytes(bytes(data))
    good = newest_good(tmp_path)
    assert good.step == 2
    assert good.skipped == [
        "checkpoint step_000003 is incomplete or corrupt (model.pt does not match its "
        "checksum); skipped"
    ]
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 2 and ckpt.state["s"] == 2


def test_a_truncated_or_missing_file_is_skipped_back_to_a_good_one(tmp_path):
    _three(tmp_path)
    optimizer_pt = tmp_path / "step_000003" / "optimizer.pt"
    size = optimizer_pt.stat().st_size
    with optimizer_pt.open("r+b") as f:
        f.truncate(10)
    (tmp_path / "step_000002" / "rng.pt").unlink()
    good = newest_good(tmp_path)
    assert good.step == 1
    assert [line.split(" (", 1)[1] for line in good.skipped] == [
        f"optimizer.pt is 10 bytes, the manifest says {size}); skipped",
        "rng.pt is missing); skipped",
    ]


def test_a_folder_newer_than_latest_is_not_taken(tmp_path):
    """A save cut after the rename and before the pointer moved: `latest` still decides."""
    _three(tmp_path)
    (tmp_path / "latest").write_text("step_000002")
    assert newest_good(tmp_path).step == 2


def test_a_checkpoint_from_before_manifests_is_still_read(tmp_path):
    _three(tmp_path)
    path = tmp_path / "step_000003"
    (path / "manifest.json").unlink()
    state = json.loads((path / "state.json").read_text())
    del state["format"]
    (path / "state.json").write_text(json.dumps(state))
    assert newest_good(tmp_path).step == 3
    state["format"] = 2  # the same folder claiming a manifest it lacks is incomplete
    (path / "state.json").write_text(json.dumps(state))
    assert newest_good(tmp_path).step == 2


def test_a_workers_checkpoint_needs_its_shards(tmp_path):
    """A driver checkpoint without model.pt is good only with the ranks' shards of its step."""
    save_checkpoint(tmp_path, 1, model=None, optimizer=None, state={})
    assert "training workers' shards" in (check_checkpoint(tmp_path / "step_000001") or "")
    save_sharded(tmp_path / "workers", 1, model=_model(), optimizer=None)
    assert check_checkpoint(tmp_path / "step_000001") is None
    (tmp_path / "workers" / "step_000001" / "manifest.json").unlink()
    assert "workers/step_000001: no manifest.json" in (
        check_checkpoint(tmp_path / "step_000001") or ""
    )


def test_a_full_disk_leaves_the_previous_checkpoint_and_latest_intact(tmp_path, small_disk):
    root = small_disk(96)  # room for one small checkpoint, not for a large one
    small = torch.nn.Linear(8, 8)
    save_checkpoint(root, 1, model=small, optimizer=None, state={}, keep=1)
    big = torch.nn.Linear(256, 256)  # 257 KiB of weights
    with pytest.raises(CheckpointError) as caught:
        save_checkpoint(root, 2, model=big, optimizer=None, state={}, keep=1)
    message = str(caught.value)
    assert message.startswith("could not write checkpoint step 2: No space left on device")
    assert message.endswith("checkpoint step 1 is intact") and "\n" not in message
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    assert (root / "latest").read_text() == "step_000001"
    ckpt = load_latest(root)
    assert ckpt is not None and ckpt.step == 1 and ckpt.model is not None
    assert torch.equal(ckpt.model["weight"], small.weight)


def test_the_workers_shards_on_a_full_disk_raise_one_line_and_keep_the_last(tmp_path, small_disk):
    root = small_disk(96)
    save_sharded(root, 1, model=torch.nn.Linear(8, 8), optimizer=None, keep=1)
    with pytest.raises(CheckpointError, match="No space left on device; the earlier ones"):
        save_sharded(root, 2, model=torch.nn.Linear(256, 256), optimizer=None, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    assert check_manifest(root / "step_000001", checksums=False) is None


def test_keep_prunes_only_after_a_complete_save_and_never_the_newest(tmp_path):
    _three(tmp_path, keep=1)
    assert [p.name for p in tmp_path.glob("step_*")] == ["step_000003"]
    # a step redone after a resume from an older checkpoint replaces its folder whole
    save_checkpoint(tmp_path, 3, model=_model(), optimizer=None, state={"s": 33}, keep=1)
    assert json.loads((tmp_path / "step_000003" / "state.json").read_text())["s"] == 33
    assert not list(tmp_path.glob(".*step_*"))

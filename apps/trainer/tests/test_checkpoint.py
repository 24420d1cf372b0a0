import random

import numpy as np
import torch

from rstar2_trainer.rundir import read_metrics, truncate_metrics
from rstar2_trainer.rundir.checkpoint import load_latest, save_checkpoint
from rstar2_trainer.tracking import JsonlTracker


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

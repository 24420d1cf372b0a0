"""The training-state offload and the CUDA allocator default, on what a CPU can check.

The GPU path (bytes moved, seconds, an exact round trip, memory freed) is measured by
scripts/gpu_check.sh (bench/results/gpu_check_h200/)."""

import torch

from rstar2_trainer.training.distributed import EXPANDABLE_SEGMENTS, allocator_settings
from rstar2_trainer.training.offload import move_train_state


def test_expandable_segments_unless_the_user_chose_settings():
    assert allocator_settings({}) == EXPANDABLE_SEGMENTS == "expandable_segments:True"
    assert allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) is None
    assert allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": ""}) is None  # set, even if empty


def test_moving_state_already_in_place_moves_nothing_and_changes_nothing():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    before = [t.clone() for t in model.parameters()]
    moments = [v.clone() for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    report = move_train_state(model, optimizer, "cpu")
    assert report["bytes"] == 0.0 and report["seconds"] >= 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    after = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    assert len(after) == 4 and all(torch.equal(a, b) for a, b in zip(moments, after, strict=True))

"""Off-policy correction in the trainer: the sampler's logprobs reach the loss and its metrics.

- `policy_rows` carries each kept trajectory's behaviour logprobs (NaN on a row without);
- `RLTokenLoss` with `tis` / `mis` gives the loss, gradient and mismatch sums of a hand
  computation; with `none` the loss and the step are bit-identical to rows without logprobs;
- slow: `distributed.train_step` reports the mismatch as global token means and its largest
  ratio as the max over micro-batches, `merge_steps` the means over the measured tokens, and
  `none` changes no number of the step;
- `algo.off_policy.kind` is accepted as an override of every recipe by `rstar2-train --dry-run`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rstar2_algos import GrpoRocConfig, MisConfig, TisConfig
from rstar2_rollout.tiny import build_tiny_model
from rstar2_rollout.trajectory import Trajectory
from rstar2_trainer.cli import main
from rstar2_trainer.config import load_config, recipes
from rstar2_trainer.training.distributed import Row, make_micro_batch, train_step
from rstar2_trainer.training.update import (
    RLTokenLoss,
    make_optimizer,
    merge_steps,
    policy_rows,
)

CPU = torch.device("cpu")

# Three kept trajectories. Token ratios pi_trainer / pi_behaviour on the loss tokens:
#   t0 (A = +1):   1.5, 0.4, 3.0
#   t1 (A = -0.5): 1.2, (tool output), 0.9, 1.1
#   t2 (A = +2):   no behaviour logprobs (the engine returned none): weight 1, not measured
BEHAVIOUR = [[-1.0, -2.0, -0.5], [-0.3, 0.0, -1.2, -0.7], []]
MASKS = [[1, 1, 1], [1, 0, 1, 1], [1, 1]]
RATIOS = [[1.5, 0.4, 3.0], [1.2, 1.0, 0.9, 1.1], [1.0, 1.0]]
ADVANTAGES = torch.tensor([1.0, -0.5, 2.0])  # [K]
LIVE = [1.5, 0.4, 3.0, 1.2, 0.9, 1.1]
K3 = sum(r - 1 - math.log(r) for r in LIVE)


def _kept() -> list[Trajectory]:
    return [
        Trajectory(
            group_id="p0",
            sample_index=i,
            prompt_ids=[5, 6],
            response_ids=[10 + j for j in range(len(mask))],
            loss_mask=mask,
            logprobs=b,
            reward=float(i % 2),
        )
        for i, (b, mask) in enumerate(zip(BEHAVIOUR, MASKS, strict=True))
    ]


def _trainer_logp() -> torch.Tensor:
    """The trainer's logprobs [3, 4]: behaviour + log ratio (t2: -1), padding junk."""
    rows = []
    for b, r in zip(BEHAVIOUR, RATIOS, strict=True):
        base = b or [-1.0] * len(r)
        rows.append([x + math.log(y) for x, y in zip(base, r, strict=True)])
    return torch.tensor([row + [9.0] * (4 - len(row)) for row in rows], requires_grad=True)


def _call(algo, rows: list[Row]) -> tuple[torch.Tensor, dict, torch.Tensor]:
    logp = _trainer_logp()
    loss, sums = RLTokenLoss(algo)(logp, make_micro_batch(rows, 0, CPU))
    loss.backward()
    assert logp.grad is not None
    return loss.detach(), sums, logp.grad


def test_policy_rows_carry_the_behaviour_logprobs():
    rows = policy_rows(_kept(), ADVANTAGES)
    assert [list(r.values["behaviour_logp"]) for r in rows[:2]] == BEHAVIOUR[:2]
    assert all(math.isnan(x) for x in rows[2].values["behaviour_logp"])
    # No kept trajectory has any (SFT traces, engines without logprobs): no key at all.
    bare = [Trajectory("p", 0, [1], [2, 3], [1, 1], [0.0, 0.0])]
    assert set(policy_rows(bare, torch.tensor([1.0]))[0].values) == {"advantage"}


def test_tis_weighs_each_token_loss_by_hand():
    loss, sums, grad = _call(
        GrpoRocConfig(off_policy=TisConfig(cap=2.0)), policy_rows(_kept(), ADVANTAGES)
    )
    # old = the detached current logprob: PPO ratio 1, token loss -A * w, gradient -A * w
    w = [[1.5, 0.4, 2.0], [1.2, 0.9, 1.1], [1.0, 1.0]]
    assert loss.item() == pytest.approx(-3.9 + 0.5 * 3.2 - 2.0 * 2, rel=1e-6)
    want = [[-1.5, -0.4, -2.0, 0], [0.6, 0, 0.45, 0.55], [-2, -2, 0, 0]]
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, atol=1e-7)
    assert sums["mismatch_token_share"] == 6  # t0's 3 + t1's 3; t2 unmeasured
    assert sums["mismatch_kl"] == pytest.approx(K3, rel=1e-5)
    assert sums["mismatch_ratio_max"] == pytest.approx(3.0, rel=1e-6)  # a max, not a sum
    assert sums["mismatch_weight_mean"] == pytest.approx(sum(w[0]) + sum(w[1]), rel=1e-6)
    assert sums["mismatch_masked_frac"] == 0


def test_mis_masks_tokens_out_of_the_loss_by_hand():
    loss, sums, grad = _call(
        GrpoRocConfig(off_policy=MisConfig()), policy_rows(_kept(), ADVANTAGES)
    )
    # 0.4 and 3.0 leave [0.5, 2]: t0 keeps one token, t1 all three, t2 both
    assert loss.item() == pytest.approx(-1.0 + 0.5 * 3 - 2.0 * 2, rel=1e-6)
    np.testing.assert_allclose(grad.numpy()[0], [-1, 0, 0, 0], atol=1e-7)
    assert sums["mismatch_masked_frac"] == pytest.approx(2, rel=1e-6)
    assert sums["mismatch_weight_mean"] == pytest.approx(4, rel=1e-6)


def test_kind_none_is_bit_identical_to_rows_without_logprobs():
    with_behaviour = policy_rows(_kept(), ADVANTAGES)
    without = [
        Row(r.prompt_ids, r.response_ids, r.loss_mask, {"advantage": r.values["advantage"]})
        for r in with_behaviour
    ]
    loss_a, sums_a, grad_a = _call(GrpoRocConfig(), with_behaviour)
    loss_b, sums_b, grad_b = _call(GrpoRocConfig(), without)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    assert {k: v for k, v in sums_a.items() if not k.startswith("mismatch_")} == sums_b
    assert sums_a["mismatch_kl"] == pytest.approx(K3, rel=1e-5)  # measured all the same


def _model_rows(model, kept: list[Trajectory], ratio: float) -> list[Trajectory]:
    """The kept trajectories with behaviour logprobs = the model's own minus log(ratio)."""
    from rstar2_trainer.training.batching import make_batch, response_logprobs

    batch = make_batch(
        [t.prompt_ids for t in kept], [t.response_ids for t in kept], [t.loss_mask for t in kept], 0
    )
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
    out = []
    for i, t in enumerate(kept):
        lp = [
            (x - math.log(ratio)) if m else 0.0
            for x, m in zip(logp[i, : len(t.loss_mask)].tolist(), t.loss_mask, strict=True)
        ]
        out.append(
            Trajectory(t.group_id, t.sample_index, t.prompt_ids, t.response_ids, t.loss_mask, lp)
        )
    return out


@pytest.mark.slow  # about 30 s on the shared 2-core machine: a model and four steps
def test_train_step_reports_the_mismatch_and_none_changes_no_number(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", seed=0, vocab_size=256, layers=1)
    gen = torch.Generator().manual_seed(0)
    kept = []
    for i, n in enumerate((5, 13, 8, 21)):
        ids = torch.randint(3, 256, (n + 3,), generator=gen).tolist()
        mask = [0 if j == 2 else 1 for j in range(n)]
        kept.append(Trajectory(f"p{i // 2}", i % 2, ids[:3], ids[3:], mask, [0.0] * n))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def step(algo, trajectories):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        loss = RLTokenLoss(algo)
        return train_step(
            model,
            make_optimizer(model, 1e-3, (0.9, 0.999), 0.0),
            policy_rows(trajectories, advantages),
            loss,
            pad_id=0,
            micro_batch_tokens=30,  # several micro-batches
            normalize_by=loss.normalize_by,
        )

    plain = step(GrpoRocConfig(), kept)  # no behaviour logprobs: the step as it was
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    sampled = _model_rows(reference, kept, ratio=1.25)  # trainer / behaviour = 1.25 everywhere
    none = step(GrpoRocConfig(), sampled)
    assert none.micro_batches > 1
    assert (none.loss, none.grad_norm) == (plain.loss, plain.grad_norm)
    assert none.metrics["mismatch_token_share"] == pytest.approx(1.0)
    assert none.metrics["mismatch_ratio_max"] == pytest.approx(1.25, rel=1e-4)
    assert none.metrics["mismatch_kl"] == pytest.approx(0.25 - math.log(1.25), rel=1e-3)
    tis = step(GrpoRocConfig(off_policy=TisConfig(cap=1.1)), sampled)
    assert tis.metrics["mismatch_weight_mean"] == pytest.approx(1.1, rel=1e-6)
    assert tis.loss == pytest.approx(1.1 * plain.loss, rel=1e-5)
    mis = step(GrpoRocConfig(off_policy=MisConfig(upper=1.2)), sampled)
    assert mis.metrics["mismatch_masked_frac"] == pytest.approx(1.0)
    assert mis.loss == 0 and mis.grad_norm == 0
    # the largest ratio of the step, though one micro-batch (p3's row alone) tops out at 1.25
    mixed = _model_rows(reference, kept[:2], ratio=2.0) + _model_rows(reference, kept[2:], 1.25)
    assert step(GrpoRocConfig(), mixed).metrics["mismatch_ratio_max"] == pytest.approx(2.0)
    # half the rows measured: the means are over the measured tokens, not diluted by the rest
    half = merge_steps([step(GrpoRocConfig(), _model_rows(reference, kept[:2], 1.25) + kept[2:])])
    assert 0.2 < half["mismatch_token_share"] < 0.5
    assert half["mismatch_kl"] == pytest.approx(0.25 - math.log(1.25), rel=1e-3)
    assert half["mismatch_weight_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["none", "tis", "mis"])
def test_every_recipe_accepts_the_off_policy_kind(kind):
    for name in recipes():
        assert load_config(name).algo.off_policy.kind == "none"  # the default everywhere
        assert load_config(name, [f"algo.off_policy.kind={kind}"]).algo.off_policy.kind == kind


def test_dry_run_takes_the_override(capsys):
    assert main(["--dry-run", "algo.off_policy.kind=tis"]) == 0
    assert (
        "  off_policy:\n    kind: tis\n    level: token\n    cap: 2.0\n" in capsys.readouterr().out
    )
    argv = [
        "--dry-run",
        "qwen3-14b-mi300x",
        "algo.off_policy.kind=mis",
        "algo.off_policy.level=sequence",
    ]
    assert main(argv) == 0
    assert "    kind: mis\n    level: sequence\n" in capsys.readouterr().out
    assert main(["--dry-run", "algo.off_policy.kind=icepop"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'none', 'tis', 'mis'" in err[0]

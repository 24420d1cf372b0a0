"""Off-policy correction: hand-computed weights and mismatch metrics for none / tis / mis."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from rstar2_algos import (
    GrpoRocConfig,
    MisConfig,
    NoOffPolicyConfig,
    OffPolicyConfig,
    TisConfig,
    build_algorithm,
    correct_off_policy,
    policy_loss,
)

# Two rows; token ratios pi_old / pi_behaviour under the mask (row 1's third token is tool
# output, row 0's fourth is padding: both mask 0, their values junk that must not be read):
#   row 0: 1.5, 0.4, 3.0, (pad)       sequence ratio 1.5 * 0.4 * 3.0 = 1.8
#   row 1: 1.2, 0.9, (tool), 1.1      sequence ratio 1.2 * 0.9 * 1.1 = 1.188
RATIOS = [[1.5, 0.4, 3.0, 7.0], [1.2, 0.9, 9.0, 1.1]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]]).bool()
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -3.0, float("nan")], [-0.5, -1.5, 0.0, -2.5]])
OLD = BEHAVIOUR.nan_to_num(0.0) + torch.tensor(RATIOS).log()
LIVE = [1.5, 0.4, 3.0, 1.2, 0.9, 1.1]  # the six loss tokens' ratios
K3 = sum(r - 1 - math.log(r) for r in LIVE) / 6


def _weights(config) -> np.ndarray:
    return correct_off_policy(OLD, BEHAVIOUR, MASK, config).weights.numpy()


def test_none_weighs_nothing_and_still_measures_the_mismatch():
    fix = correct_off_policy(OLD, BEHAVIOUR, MASK, NoOffPolicyConfig())
    assert (fix.weights == 1).all()
    m = {k: v.item() for k, v in fix.metrics.items()}
    assert m["mismatch_kl"] == pytest.approx(K3, rel=1e-5)
    assert m["mismatch_ratio_max"] == pytest.approx(3.0, rel=1e-6)  # padding's 7.0 unread
    assert m["mismatch_masked_frac"] == 0
    assert m["mismatch_weight_mean"] == 1


def test_tis_token_truncates_each_ratio_at_the_cap():
    want = [[1.5, 0.4, 2.0, 1.0], [1.2, 0.9, 1.0, 1.1]]  # 3.0 -> 2; off the mask: 1
    np.testing.assert_allclose(_weights(TisConfig(cap=2.0)), want, rtol=1e-6)
    m = correct_off_policy(OLD, BEHAVIOUR, MASK, TisConfig(cap=2.0)).metrics
    assert m["mismatch_weight_mean"].item() == pytest.approx(7.1 / 6, rel=1e-6)
    assert m["mismatch_masked_frac"].item() == 0
    assert m["mismatch_ratio_max"].item() == pytest.approx(3.0, rel=1e-6)  # before truncation


def test_tis_sequence_truncates_the_product_of_the_row():
    want = [[1.5, 1.5, 1.5, 1.0], [1.188, 1.188, 1.0, 1.188]]  # 1.8 -> 1.5; 1.188 kept
    np.testing.assert_allclose(_weights(TisConfig(level="sequence", cap=1.5)), want, rtol=1e-5)
    m = correct_off_policy(OLD, BEHAVIOUR, MASK, TisConfig(level="sequence", cap=1.5)).metrics
    assert m["mismatch_weight_mean"].item() == pytest.approx((4.5 + 3 * 1.188) / 6, rel=1e-5)


def test_mis_token_masks_ratios_outside_the_band():
    want = [[1, 0, 0, 1], [1, 1, 1, 1]]  # 0.4 < 0.5 and 3.0 > 2 are masked out
    np.testing.assert_array_equal(_weights(MisConfig()), want)
    m = correct_off_policy(OLD, BEHAVIOUR, MASK, MisConfig()).metrics
    assert m["mismatch_masked_frac"].item() == pytest.approx(2 / 6)
    assert m["mismatch_weight_mean"].item() == pytest.approx(4 / 6)
    assert m["mismatch_kl"].item() == pytest.approx(K3, rel=1e-5)  # the same for every kind


def test_mis_sequence_masks_whole_rows():
    config = MisConfig(level="sequence", lower=0.8, upper=1.5)
    # row 0's product 1.8 is out (its geometric mean, 1.22, would be in); row 1's 1.188 is in
    want = [[0, 0, 0, 1], [1, 1, 1, 1]]
    np.testing.assert_array_equal(_weights(config), want)
    m = correct_off_policy(OLD, BEHAVIOUR, MASK, config).metrics
    assert m["mismatch_masked_frac"].item() == pytest.approx(3 / 6)


def test_weights_multiply_the_clipped_token_loss():
    # r = 1.5, A = +1 -> clipped -1.28, weight 2   -> -2.56 (no gradient)
    # r = 0.5, A = -1 -> clipped  0.8,  weight 0   ->  0
    # r = 1.1, A = -1 -> inside   1.1,  weight 0.5 ->  0.55 (gradient 0.5 * 1.1 / 3)
    logprobs = torch.tensor([[math.log(r) for r in (1.5, 0.5, 1.1)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    weights = torch.tensor([[2.0, 0.0, 0.5]])
    loss, _ = policy_loss(logprobs, torch.zeros(1, 3), adv, torch.ones(1, 3), token_weights=weights)
    assert loss.item() == pytest.approx((-2.56 + 0.55) / 3, rel=1e-6)
    loss.backward()
    assert logprobs.grad is not None
    np.testing.assert_allclose(logprobs.grad.numpy(), [[0, 0, 0.55 / 3]], rtol=1e-6)


def test_kind_none_leaves_the_loss_and_gradient_bit_identical():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4, 9, generator=gen) - 2
    old = base + 0.1 * torch.randn(4, 9, generator=gen)
    behaviour = old + 0.05 * torch.randn(4, 9, generator=gen)
    adv = torch.randn(4, generator=gen)
    mask = torch.rand(4, 9, generator=gen) > 0.2
    algo = build_algorithm(GrpoRocConfig())
    a = base.clone().requires_grad_(True)
    plain, plain_metrics = algo.policy_loss(a, old, adv, mask)
    plain.backward()
    b = base.clone().requires_grad_(True)
    fix = algo.off_policy(old, behaviour, mask)
    weighted, weighted_metrics = algo.policy_loss(b, old, adv, mask, token_weights=fix.weights)
    weighted.backward()
    assert torch.equal(plain, weighted)
    assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)
    assert all(torch.equal(plain_metrics[k], weighted_metrics[k]) for k in plain_metrics)
    assert fix.metrics["mismatch_kl"] > 0


def test_the_algorithm_binds_its_configured_correction():
    algo = build_algorithm({"name": "grpo_roc", "off_policy": {"kind": "tis", "cap": 2.0}})
    np.testing.assert_allclose(algo.off_policy(OLD, BEHAVIOUR, MASK).weights.numpy()[0, 2], 2.0)
    assert build_algorithm().config.off_policy == NoOffPolicyConfig()


def test_config_union_and_bounds():
    adapter = TypeAdapter(OffPolicyConfig)
    assert adapter.validate_python({"kind": "mis", "level": "sequence"}) == MisConfig(
        level="sequence"
    )
    with pytest.raises(ValidationError, match="lower <= 1 <= upper"):
        MisConfig(lower=1.2, upper=2.0)
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "icepop"})
    with pytest.raises(ValidationError):
        TisConfig(cap=0)
    with pytest.raises(ValidationError):
        NoOffPolicyConfig.model_validate({"kind": "none", "cap": 2})


def test_mismatched_shapes_are_one_clear_error():
    with pytest.raises(ValueError, match="must have one shape"):
        correct_off_policy(OLD, BEHAVIOUR[:, :3], MASK)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-8, 0), min_size=1, max_size=12),
    st.sampled_from([NoOffPolicyConfig(), TisConfig(), MisConfig(level="sequence")]),
)
def test_on_policy_samples_weigh_one_and_show_no_mismatch(logprobs, config):
    lp = torch.tensor([logprobs])
    fix = correct_off_policy(lp, lp.clone(), torch.ones_like(lp).bool(), config)
    assert (fix.weights == 1).all()
    assert fix.metrics["mismatch_kl"].item() == 0
    assert fix.metrics["mismatch_ratio_max"].item() == 1

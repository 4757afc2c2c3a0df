"""The clipped off-policy loss and the diagnostics, as pure functions of tensors."""

import numpy as np
import pytest
import torch

import grpo_theory as gt
from llm.diagnostics import group_bound_estimates, tv_rows
from llm.loss import clip_flags_torch, clip_objective_torch, clip_window_torch, grpo_loss, k3_kl

torch.manual_seed(0)
B, T = 8, 5


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp_alpha = -torch.rand(B, T, generator=g) * 3
    logp_k = logp_alpha + 0.3 * torch.randn(B, T, generator=g)
    logp = (logp_k + 0.2 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[0, 3:] = 0
    mask[5, 1:] = 0
    return logp, logp_k, logp_alpha, adv, mask


def test_clip_functions_match_grpo_theory():
    """The torch twins of clip_window, clip_flags and clip_objective equal grpo_theory's (one formula)."""
    rng = np.random.default_rng(0)
    r, rk, a = rng.uniform(0, 3, 500), rng.uniform(0, 3, 500), rng.normal(size=500)
    r[:50] = rk[:50] + 0.2  # exactly on the upper edge
    rk[50:100] = 0.1        # lower edge clamped at 0
    t = [torch.tensor(x) for x in (r, rk, a)]
    got = clip_objective_torch(*t, 0.2).numpy()
    assert np.allclose(got, gt.clip_objective(r, rk, a, 0.2), atol=1e-12)
    for mine, theirs in zip(clip_window_torch(t[1], 0.2), gt.clip_window(rk, 0.2)):
        assert np.allclose(mine.numpy(), theirs, atol=1e-15)
    for mine, theirs in zip(clip_flags_torch(*t, 0.2), gt.clip_flags(r, rk, a, 0.2)):
        assert np.array_equal(mine.numpy(), theirs)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_on_policy_gradient_is_grpo_gradient(loss_type):
    """v = 1, i = 1: alpha = pi_k = pi_theta at the step start, so the gradient is the policy-gradient
    estimate -A grad log pi, normalised as the loss type says."""
    logp, _, _, adv, mask = _inputs()
    start = logp.detach().clone()
    loss, stats = grpo_loss(logp, start, start, adv, mask, clip=0.2, loss_type=loss_type, max_completion_length=T)
    (g,) = torch.autograd.grad(loss, logp)
    ref_logp = logp.detach().clone().requires_grad_(True)
    per_token = -adv[:, None] * ref_logp
    if loss_type == "grpo":
        ref = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    elif loss_type == "dapo":
        ref = (per_token * mask).sum() / mask.sum()
    else:
        ref = (per_token * mask).sum() / (B * T)
    (g_ref,) = torch.autograd.grad(ref, ref_logp)
    assert torch.allclose(g, g_ref, atol=1e-7)
    assert stats["is_weight/mean"] == pytest.approx(1.0) and stats["clip_ratio/region_mean"] == 0.0


def test_importance_weight_is_computed_not_assumed():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    _, stats = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2)
    expected = torch.exp(logp_k - logp_alpha)[mask > 0]
    assert stats["is_weight/mean"] == pytest.approx(float(expected.mean()), rel=1e-6)
    assert stats["is_weight/max"] > 1.05 and stats["is_weight/min"] < 0.95
    # Setting the weight to 1 (alpha treated as pi_k) changes the objective: the two are not the same method.
    wrong, _ = grpo_loss(logp, logp_alpha, logp_alpha, adv, mask, clip=0.2)
    right, _ = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2)
    assert not torch.isclose(wrong, right)


def test_clip_window_is_centred_on_pi_k_over_alpha():
    """With A > 0 the gradient vanishes once pi/alpha exceeds pi_k/alpha + clip, not 1 + clip."""
    logp_alpha = torch.zeros(1, 1)
    logp_k = torch.full((1, 1), np.log(2.0))
    inside = torch.full((1, 1), np.log(2.1), requires_grad=True)   # ratio 2.1 < 2.2
    outside = torch.full((1, 1), np.log(2.3), requires_grad=True)  # ratio 2.3 > 2.2
    adv, mask = torch.ones(1), torch.ones(1, 1)
    for logp, moves in ((inside, True), (outside, False)):
        loss, _ = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2)
        (g,) = torch.autograd.grad(loss, logp)
        assert (g.abs().item() > 0) == moves


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_zero_variance_mask_removes_groups_from_numerator_and_normaliser(loss_type):
    logp, logp_k, logp_alpha, adv, mask = _inputs(1)
    keep = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.float32)
    masked, _ = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2, loss_type=loss_type,
                          max_completion_length=T, sequence_mask=keep)
    idx = keep.bool()
    subset, _ = grpo_loss(logp[idx], logp_k[idx], logp_alpha[idx], adv[idx], mask[idx], clip=0.2,
                          loss_type=loss_type, max_completion_length=T)
    assert torch.isclose(masked, subset, atol=1e-7)


def test_all_groups_masked_gives_zero_loss_and_no_tokens():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    loss, stats = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2, sequence_mask=torch.zeros(B))
    assert loss.item() == 0.0 and stats["num_loss_tokens"] == 0


def test_kl_term():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    assert torch.all(k3_kl(logp.detach(), logp_k) >= 0)
    assert torch.all(k3_kl(logp_k, logp_k) == 0)
    base, _ = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2)
    with_kl, stats = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2, beta=0.5, logp_ref=logp_k)
    assert stats["kl"] > 0 and with_kl.item() == pytest.approx(base.item() + 0.5 * stats["kl"], rel=1e-5)
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2, beta=0.1)


def test_sequence_level_ratio_is_product_of_token_ratios():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    _, stats = grpo_loss(logp, logp_k, logp_alpha, adv, mask, clip=0.2, ratio_level="sequence")
    seq_w = torch.exp(((logp_k - logp_alpha) * mask).sum(1))
    assert stats["is_weight/max"] == pytest.approx(float(seq_w.max()), rel=1e-5)


def test_tv_rows_is_grpo_theory_tv():
    g = torch.Generator().manual_seed(3)
    a = torch.log_softmax(torch.randn(4, 7, 11, generator=g, dtype=torch.float64), -1)
    b = torch.log_softmax(torch.randn(4, 7, 11, generator=g, dtype=torch.float64), -1)
    assert np.allclose(tv_rows(a, b).numpy(), gt.tv_distance(a.exp().numpy(), b.exp().numpy()), atol=1e-6)


class TestBoundEstimates:
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])

    def test_same_policy_everything_zero(self):
        z = np.zeros((2, 4))
        est = group_bound_estimates(self.rewards, z, z, 1e-4)
        for key in ("tv/pi_k_alpha", "tv/pi_new_alpha", "improvement", "bound/surrogate", "bound/lower"):
            assert est[key] == 0.0

    def test_matches_exact_bound_on_the_empirical_distribution(self):
        """The estimates are grpo_theory's exact terms for the group's empirical alpha, with the IS TVs."""
        rng = np.random.default_rng(0)
        lk, ln = 0.3 * rng.normal(size=(2, 4)), 0.3 * rng.normal(size=(2, 4))
        est = group_bound_estimates(self.rewards, lk, ln, 0.01)
        alpha = np.full(4, 0.25)
        r = self.rewards[0]
        w_new, w_k = np.exp(ln[0]), np.exp(lk[0])
        tv_new, tv_k = 0.5 * np.mean(np.abs(w_new - 1)), 0.5 * np.mean(np.abs(w_k - 1))
        s = np.sqrt(0.25 + 0.01)
        sur = np.mean((w_new - 1) * (r - 0.5) / s)
        lower0 = sur - 2 * (1 - s) / s * tv_new - 2 * tv_k
        s1 = np.sqrt(0.01)
        lower1 = 0.0 - 2 * (1 - s1) / s1 * 0.5 * np.mean(np.abs(np.exp(ln[1]) - 1)) - 2 * 0.5 * np.mean(np.abs(np.exp(lk[1]) - 1))
        assert est["bound/lower"] == pytest.approx((lower0 + lower1) / 2, rel=1e-12)
        assert est["bound/lower_nonzero_std"] == pytest.approx(lower0, rel=1e-12)
        assert est["sigma/mean"] == pytest.approx(0.25)  # (0.5 + 0) / 2
        assert gt.reward_std(alpha, r) == 0.5

"""VCPO's off-policy optimal baseline (``grpo_theory.vcpo``, ``llm.optim.baseline``, ``--grad-baselining``) against the paper's formula
and a transcription of the authors' code (mit-han-lab/vcpo: ``compute_opob_baseline`` in
recipe/fully_async_policy/staleness_utils.py, and the actor's ``_update_grad_buffers``, which accumulates
sum_i R_i g_i / sigma and sum_i g_i / sigma per group and subtracts b* times the second)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from grpo_theory.vcpo import Baselining, baseline_log_weights, shift_advantages
from tests.helpers import same_gradient


def authors_baseline(rewards, grad_norms, seq_ratios, lengths, use_is_weights=True, normalize_by_length=False,
                     eps=1e-8):
    """A transcription of the authors' ``compute_opob_baseline`` with agg_mode mean over one scope's records:
    W = ||g||^2 (x ratio^2) (/ L^2), b = sum W R / (sum W + eps)."""
    numer = denom = 0.0
    for r, g, w, n in zip(rewards, grad_norms, seq_ratios, lengths):
        weight = g ** 2
        if use_is_weights:
            weight *= w ** 2
        if normalize_by_length:
            weight = weight / n ** 2
        numer += float(r) * weight
        denom += weight
    return numer / (denom + eps)


def test_the_shift_is_the_authors_baseline_in_both_scopes():
    """Group scope with the authors' norm_by_std: (R - b*) / sigma per group equals A - (W-weighted mean of A) with
    A = (R - mean) / sigma; minibatch scope: A - b*(A) over every completion (the authors take the advantage there)."""
    g = np.random.default_rng(0)
    P, G = 3, 4
    rewards = g.integers(0, 2, size=(P, G)).astype(float)
    rewards[1] = [0.0, 1.0, 0.5, 0.25]
    norms = g.uniform(0.1, 3.0, size=(P, G))
    log_w = g.normal(0.0, 0.8, size=(P, G))
    lengths = g.integers(1, 9, size=(P, G)).astype(float)
    mean, std = rewards.mean(1, keepdims=True), rewards.std(1, keepdims=True)
    adv = np.where(std > 0, (rewards - mean) / np.where(std > 0, std, 1.0), 0.0)
    live = np.ones((P, G), bool)
    for use_is, by_len in ((True, False), (False, False), (True, True)):
        s = Baselining("group", use_is, by_len)
        lw = baseline_log_weights(norms, log_w, lengths, s)
        ours, _ = shift_advantages(adv, lw, live, "group")
        for p in range(P):
            if std[p, 0] == 0:
                assert np.all(ours[p] == 0)
                continue
            b = authors_baseline(rewards[p], norms[p], np.exp(log_w[p]), lengths[p], use_is, by_len)
            np.testing.assert_allclose(ours[p], (rewards[p] - b) / std[p, 0], rtol=1e-6)  # their eps 1e-8
        mini, _ = shift_advantages(adv, lw, live, "minibatch")
        b = authors_baseline(adv.reshape(-1), norms.reshape(-1), np.exp(log_w).reshape(-1), lengths.reshape(-1),
                             use_is, by_len)
        np.testing.assert_allclose(mini, adv - b, rtol=1e-6, atol=1e-7)


def test_huge_weights_and_zero_gradients_leave_finite_advantages():
    """A sequence weight e^400 (its square overflows a float) dominates its group's baseline instead of turning it
    into nan; a group whose completions have no gradient keeps its advantages (the authors': b = 0 / eps, whose
    coefficients then multiply zero gradients); rows outside the loss keep theirs and count in no baseline."""
    adv = np.array([[1.0, -1.0, 0.5], [0.7, -0.7, 0.0]])
    log_w = np.array([[400.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    norms = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    lw = baseline_log_weights(norms, log_w, np.ones((2, 3)), Baselining())
    live = np.array([[True, True, True], [True, True, False]])
    out, shift = shift_advantages(adv, lw, live, "group")
    np.testing.assert_allclose(out[0], adv[0] - 1.0)  # b = the huge-weight completion's advantage
    np.testing.assert_array_equal(out[1], adv[1])
    assert math.isfinite(shift) and shift == pytest.approx(1.0 * 3 / 5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(0.05, 5), st.floats(-2, 2)), min_size=2, max_size=12))
def test_b_star_minimises_the_second_moment_of_the_gradient_estimate(rows):
    """The paper's claim behind b*: over b, sum_i ||w_i (R_i - b) g_i||^2 = sum_i W_i (R_i - b)^2 is least at
    b* = sum W R / sum W (checked against a numerical minimiser)."""
    r = np.array([x[0] for x in rows])
    norms = np.array([x[1] for x in rows])
    log_w = np.array([x[2] for x in rows])
    lw = baseline_log_weights(norms, log_w, np.ones_like(r), Baselining())
    out, _ = shift_advantages(r[None, :], lw[None, :], np.ones((1, len(r)), bool), "group")
    b_star = float(r[0] - out[0, 0])
    second_moment = lambda b: float(np.sum(norms ** 2 * np.exp(2 * log_w) * (r - b) ** 2))  # noqa: E731
    found = minimize_scalar(second_moment, bracket=(-3, 3), tol=1e-12).x
    assert second_moment(b_star) <= second_moment(found) * (1 + 1e-9) + 1e-12
    assert second_moment(b_star) < second_moment(float(np.mean(r))) + 1e-9  # never worse than the plain mean


def _stale_step(seed=0):
    from tests.llm.test_update import _tiny_step

    policy, batch, adv = _tiny_step(seed)
    from llm.tensors.logprobs import completion_logprobs

    with torch.no_grad():
        logp_k = completion_logprobs(policy, batch, 1.0).logp
    g = torch.Generator().manual_seed(seed + 1)
    logp_alpha = (logp_k + 0.5 * torch.randn(logp_k.shape, generator=g, dtype=logp_k.dtype)) * batch.completion_mask
    return policy, batch, adv, logp_alpha


@pytest.mark.parametrize("importance_sampling_mode, loss_type", [("paper", "dapo"), ("token_truncate", "grpo"),
                                                                  ("none", "dr_grpo")])
@pytest.mark.parametrize("scope", ["group", "minibatch"])
def test_a_baselined_step_is_the_authors_accumulated_gradient(importance_sampling_mode, loss_type, scope):
    """On the tiny model (float64) with a stale alpha: the step's gradient with the baseline equals the authors'
    accumulation sum_i (A_i - b) grad loss_i(A = 1), b from each completion's token-summed gradient norm at unit
    advantage and its sequence weight pi_k/alpha; and it differs from the plain step's."""
    from llm.tensors.loss import Clip, grpo_loss, loss_weights
    from llm.tensors.passes import Passes
    from llm.models.model import Precision
    from llm.optim import Objective, optimise

    policy, batch, adv, logp_alpha = _stale_step()
    params = list(policy.parameters())
    clip = Clip(importance_sampling_mode=importance_sampling_mode)
    passes = Passes(1.0, Precision(), micro_batch=2, group_size=3, share_prompts=False)

    def step_gradient(baselining):
        opt = torch.optim.SGD(params, lr=0.0)
        out = optimise(passes, Objective(max_grad_norm=0.0, max_completion_length=6, clip=clip, loss_type=loss_type,
                                         baselining=baselining), policy, opt, batch, adv, np.ones(2, bool),
                       logp_alpha, None)
        return torch.cat([p.grad.flatten() for p in params]), out

    ours, out = step_gradient(Baselining(scope))
    plain, _ = step_gradient(None)
    # the authors' way, by hand: each completion's gradient at unit advantage, under the step's loss weights and
    # summed over its tokens (for the norm)
    from llm.tensors.logprobs import completion_logprobs

    mask = batch.policy_mask.double()
    weights = loss_weights(mask, loss_type, 6, torch.ones(6, dtype=torch.float64))
    with torch.no_grad():
        logp_k = completion_logprobs(policy, batch, 1.0).logp
    step_grads, norms = [], []
    for i in range(6):
        for w, out_list in ((weights, step_grads), (mask, norms)):
            logp = passes.forward(policy, batch.take(torch.tensor([i])), entropy=False).logp
            t = logp.shape[1]
            loss, _ = grpo_loss(logp, logp_k[i:i + 1, :t], logp_alpha[i:i + 1, :t],
                                torch.ones(1, dtype=torch.float64), w[i:i + 1, :t], clip=clip)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            flat = torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, grads)])
            out_list.append(flat if w is weights else float(flat.norm()))
    seq_ratio = torch.exp(((logp_k - logp_alpha) * mask).sum(1)).tolist()
    a = adv.reshape(-1)  # eps 0: their 1e-8 guard in the denominator moves b by ~1e-8 relative
    if scope == "group":
        b = [authors_baseline(a[3 * p:3 * p + 3], norms[3 * p:3 * p + 3], seq_ratio[3 * p:3 * p + 3], [1] * 3,
                              eps=0.0) for p in range(2) for _ in range(3)]
    else:
        b = [authors_baseline(a, norms, seq_ratio, [1] * 6, eps=0.0)] * 6
    # the trainer holds advantages in float32, as for any step
    theirs = sum(float(np.float32(a[i] - b[i])) * step_grads[i] for i in range(6))
    # the optimiser's step is linear in the advantages only up to float32 rounding (the trainer's advantages and loss
    # weights are float32): 4e-8 relative between optimise(A) and sum_i A_i optimise(e_i) on this batch, 5e-7 here
    assert same_gradient(ours, theirs, 2e-6)
    assert not same_gradient(ours, plain, 1e-3)
    assert out.baseline_shift == pytest.approx(float(np.mean(np.abs(np.array(b)))), rel=1e-9)


def test_the_option_is_vcpos_names_and_refuses_torchrun_in_one_line():
    from llm.config import GRPOConfig
    from llm.run.specs import objective

    c = GRPOConfig(grad_baselining=True, grad_baselining_scope="minibatch", grad_baselining_use_is_weights=False)
    assert objective(c).baselining == Baselining("minibatch", False, False)
    assert objective(GRPOConfig()).baselining is None
    with pytest.raises(Exception) as info:
        GRPOConfig(grad_baselining_scope="prompt")
    assert "grad_baselining_scope" in str(info.value) and "\n" not in str(info.value).strip()

"""llm.tensors.loss: the clipped off-policy loss, its importance weight, normalisers, the masked groups and the KL term."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import grpo_theory as gt
from grpo_theory.corrections import (MODES, REGISTRY, corrected_surrogate, second_moment_keep,
                                     trust_region_second_moment_keep)
from llm import GRPOConfig
from llm.tensors.loss import (
    Clip,
    LossStats,
    clip_flags_torch,
    clip_objective_torch,
    clip_window_torch,
    grpo_loss,
    k3_kl,
    loss_weights,
    step_mask_torch,
)
from grpo_theory.corrections import REGISTRY as CORRECTIONS


def second_moment_keep_torch(log_w, weight, threshold):
    """AReaL's M2PO mask over a (B, T) step, through the loss's one entry (``step_mask_torch``)."""
    return step_mask_torch(CORRECTIONS["m2po_areal"], log_w, torch.zeros_like(log_w), weight, threshold)


def trust_region_second_moment_keep_torch(log_w, adv, weight, threshold):
    """The paper's M2PO mask over a (B, T) step, through ``step_mask_torch``."""
    return step_mask_torch(CORRECTIONS["m2po"], log_w, adv, weight, threshold)


def max_k2_keep_torch(log_w, weight, threshold):
    """Trust Region Masking's sequence gate over a (B, T) step, through ``step_mask_torch``."""
    return step_mask_torch(CORRECTIONS["seq_max_k2"], log_w, torch.zeros_like(log_w), weight, threshold)

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


def _loss(logp, logp_k, logp_alpha, adv, mask, *, loss_type="dapo", sequence_mask=None, **kw):
    w = loss_weights(mask, loss_type, mask.shape[1], sequence_mask)
    loss, stats = grpo_loss(logp, logp_k, logp_alpha, adv, w, clip=0.2, **kw)
    return loss, stats.metrics()


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
    loss, stats = _loss(logp, start, start, adv, mask, loss_type=loss_type)
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
    assert stats["clip_ratio/region_mean"] == 0.0


def test_importance_weight_is_computed_not_assumed():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    # Setting the weight to 1 (alpha treated as pi_k) changes the objective: the two are not the same method.
    wrong, _ = _loss(logp, logp_alpha, logp_alpha, adv, mask)
    right, _ = _loss(logp, logp_k, logp_alpha, adv, mask)
    assert not torch.isclose(wrong, right)


def test_clip_window_is_centred_on_pi_k_over_alpha():
    """With A > 0 the gradient vanishes once pi/alpha exceeds pi_k/alpha + clip, not 1 + clip."""
    logp_alpha = torch.zeros(1, 1)
    logp_k = torch.full((1, 1), np.log(2.0))
    inside = torch.full((1, 1), np.log(2.1), requires_grad=True)   # ratio 2.1 < 2.2
    outside = torch.full((1, 1), np.log(2.3), requires_grad=True)  # ratio 2.3 > 2.2
    adv, mask = torch.ones(1), torch.ones(1, 1)
    for logp, moves in ((inside, True), (outside, False)):
        loss, _ = _loss(logp, logp_k, logp_alpha, adv, mask)
        (g,) = torch.autograd.grad(loss, logp)
        assert (g.abs().item() > 0) == moves


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_zero_variance_mask_removes_groups_from_numerator_and_normaliser(loss_type):
    logp, logp_k, logp_alpha, adv, mask = _inputs(1)
    keep = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.float32)
    masked, _ = _loss(logp, logp_k, logp_alpha, adv, mask, loss_type=loss_type, sequence_mask=keep)
    idx = keep.bool()
    subset, _ = _loss(logp[idx], logp_k[idx], logp_alpha[idx], adv[idx], mask[idx], loss_type=loss_type)
    assert torch.isclose(masked, subset, atol=1e-7)


def test_all_groups_masked_gives_zero_loss_and_no_tokens():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    w = loss_weights(mask, "dapo", T, torch.zeros(B))
    loss, stats = grpo_loss(logp, logp_k, logp_alpha, adv, w, clip=0.2, beta=0.1, logp_ref=logp_k)
    assert loss.item() == 0.0 and stats.tokens == 0


def test_a_step_without_loss_tokens_logs_nan_shares_not_zero():
    """Nothing to average: the clip shares, the share above the cap and the KL read nan, not 0 (which would say
    nothing was clipped or truncated on exactly the steps that were dropped)."""
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    w = loss_weights(mask, "dapo", T, torch.zeros(B))
    _, stats = grpo_loss(logp, logp_k, logp_alpha, adv, w, clip=0.2, beta=0.1, logp_ref=logp_k)
    metrics = stats.metrics()
    assert metrics["loss"] == 0.0
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
                "is_correction/frac_above_cap", "kl", "kl/k3", "kl/k3_is"):
        assert np.isnan(metrics[key]), key
    assert np.isnan(LossStats().merge(LossStats()).metrics()["clip_ratio/region_mean"])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_micro_batches_sum_to_the_step(loss_type, beta):
    """Weights computed once from the whole step: the loss, gradient and statistics of two micro-batches
    add up to those of the unsplit step."""
    logp, logp_k, logp_alpha, adv, mask = _inputs(2)
    ref = logp_k + 0.1
    keep = torch.tensor([1, 0, 1, 1, 1, 1, 0, 1], dtype=torch.float32)
    w = loss_weights(mask, loss_type, T, keep)
    whole, s_whole = grpo_loss(logp, logp_k, logp_alpha, adv, w, clip=0.2, beta=beta, logp_ref=ref)
    (g_whole,) = torch.autograd.grad(whole, logp)
    parts, stats = 0.0, LossStats()
    for sl in (slice(0, 3), slice(3, B)):
        part, s = grpo_loss(logp[sl], logp_k[sl], logp_alpha[sl], adv[sl], w[sl], clip=0.2, beta=beta,
                            logp_ref=ref[sl])
        parts, stats = parts + part, stats.merge(s)
    (g_parts,) = torch.autograd.grad(parts, logp)
    assert torch.isclose(whole, parts, atol=1e-7) and torch.allclose(g_whole, g_parts, atol=1e-7)
    for key, value in s_whole.metrics().items():
        assert stats.metrics()[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


# ---- sequence-level ratios --------------------------------------------------------------------


def test_sequence_level_loss_is_the_mean_of_per_sequence_objectives():
    """ratio_level='sequence' (with loss_type grpo) gives -E_alpha f over sequences, each sequence counted
    once whatever its length: f = f_eps(prod pi/alpha, prod pi_k/alpha, A)."""
    logp, logp_k, logp_alpha, adv, mask = _inputs(3)
    loss, stats = _loss(logp, logp_k, logp_alpha, adv, mask, loss_type="grpo", ratio_level="sequence")
    d = lambda a, b: ((a - b) * mask).sum(1).detach().double().numpy()  # noqa: E731
    r, rk = np.exp(d(logp, logp_alpha)), np.exp(d(logp_k, logp_alpha))
    expected = -np.mean(gt.clip_objective(r, rk, adv.double().numpy(), 0.2))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
def test_sequence_level_ratios_refuse_token_normalisers(loss_type):
    with pytest.raises(ValueError, match="^ratio_level: .*loss_type grpo"):
        GRPOConfig(ratio_level="sequence", loss_type=loss_type)


# ---- KL ---------------------------------------------------------------------------------------


def test_kl_is_omitted_without_a_reference_and_added_with_one():
    logp, logp_k, logp_alpha, adv, mask = _inputs()
    base, stats = _loss(logp, logp_k, logp_alpha, adv, mask)
    assert not any(k.startswith("kl") for k in stats)  # never a fake 0
    assert torch.all(k3_kl(logp.detach(), logp_k) >= 0) and torch.all(k3_kl(logp_k, logp_k) == 0)
    for correct in (True, False):
        with_kl, stats = _loss(logp, logp_k, logp_alpha, adv, mask, beta=0.5, logp_ref=logp_k,
                               use_bias_correction_kl=correct)
        assert stats["kl"] == stats["kl/k3_is" if correct else "kl/k3"] > 0
        assert with_kl.item() == pytest.approx(base.item() + 0.5 * stats["kl"], rel=1e-5)
    with pytest.raises(ValueError, match="logp_ref"):
        _loss(logp, logp_k, logp_alpha, adv, mask, beta=0.1)


def _tabular(seed=0, V=6):
    g = torch.Generator().manual_seed(seed)
    return [torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64) * s, -1) for s in (1.0, 1.0, 2.0)]


def test_importance_corrected_kl_is_exact_kl_of_a_tabular_case():
    """One token per row, each of the V tokens once, weighted by alpha's probability: the loss with A = 0
    is beta E_alpha[term]. With the correction E_alpha[(pi/alpha) k3] = KL(pi || pi_ref) exactly; without it
    E_alpha[k3] differs from KL once alpha != pi."""
    lp, lref, la = _tabular()
    V = lp.shape[0]
    kl = float((lp.exp() * (lp - lref)).sum())
    adv, col = torch.zeros(V, dtype=torch.float64), lambda x: x[:, None]  # noqa: E731
    weights = col(la.exp())
    for correct, expect_exact in ((True, True), (False, False)):
        loss, _ = grpo_loss(col(lp), col(lp), col(la), adv, weights, clip=0.2, beta=1.0, logp_ref=col(lref),
                            use_bias_correction_kl=correct)
        assert (abs(loss.item() - kl) < 1e-12) == expect_exact, (correct, loss.item(), kl)
    plain = float((la.exp() * k3_kl(lp, lref)).sum())
    assert abs(plain - kl) > 0.05  # the uncorrected estimator's bias is large here, not rounding


def test_kl_metric_estimates_kl_from_samples_of_alpha():
    """``kl`` from tokens sampled from alpha: its mean is KL(pi || pi_ref) within 4 standard errors."""
    lp, lref, la = _tabular(1)
    kl = float((lp.exp() * (lp - lref)).sum())
    g = torch.Generator().manual_seed(0)
    tok = torch.multinomial(la.exp(), 40_000, replacement=True, generator=g)
    col = lambda x: x[tok][:, None].float()  # noqa: E731
    n = len(tok)
    w = loss_weights(torch.ones(n, 1), "dapo", 1)
    _, stats = grpo_loss(col(lp), col(lp), col(la), torch.zeros(n), w, clip=0.2, beta=1.0, logp_ref=col(lref))
    per = (torch.exp(col(lp) - col(la)) * k3_kl(col(lp), col(lref))).double()
    se = float(per.std()) / np.sqrt(n)
    assert abs(stats.metrics()["kl"] - kl) < 4 * se, (stats.metrics()["kl"], kl, se)


def _two_token_model(seed):
    """A tabular language model of 2-token completions over 3 symbols: log p(y1) (3,) and log p(y2 | y1) (3, 3)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.log_softmax(torch.randn(3, generator=g, dtype=torch.float64) * 1.5, -1)
    second = torch.log_softmax(torch.randn(3, 3, generator=g, dtype=torch.float64) * 1.5, -1)
    return first, second


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_corrected_kl_of_multi_token_completions_is_the_per_token_kl_along_alphas_prefixes(seed):
    """Every 2-token completion as a row, weighted by alpha's probability of it: the loss with A = 0 and beta = 1 is
    the exact expectation over completions from alpha of the summed per-token terms. With the correction it equals
    E_alpha[KL(pi(y1) || ref(y1)) + KL(pi(.|y1) || ref(.|y1))], the per-token KL along alpha's prefixes (to 1e-12),
    which is not the sequence-level KL(pi || ref) = E_pi[...] (prefixes from pi) once alpha != pi."""
    (p1, p2), (r1, r2), (a1, a2) = (_two_token_model(seed + k) for k in (0, 10, 20))
    seqs = [(i, j) for i in range(3) for j in range(3)]
    rows = lambda first, second: torch.stack([torch.stack([first[i], second[i, j]]) for i, j in seqs])  # noqa: E731
    lp, lref, la = rows(p1, p2), rows(r1, r2), rows(a1, a2)
    alpha_seq = la.sum(1).exp()
    kl = lambda p, q: float((p.exp() * (p - q)).sum(-1).sum()) if p.dim() == 1 else (p.exp() * (p - q)).sum(-1)  # noqa
    per_token = float((a1.exp() * (kl(p1, r1) + kl(p2, r2))).sum())  # E_{y1~alpha}[KL_1 + KL_2(y1)]
    sequence = float((p1.exp() * (kl(p1, r1) + kl(p2, r2))).sum())  # E_{y1~pi}[...]: KL(pi || ref) of sequences
    loss, _ = grpo_loss(lp, lp, la, torch.zeros(9, dtype=torch.float64), alpha_seq[:, None].expand(9, 2).clone(),
                        clip=0.2, beta=1.0, logp_ref=lref)
    assert loss.item() == pytest.approx(per_token, abs=1e-12)
    assert abs(per_token - sequence) > 0.01, (per_token, sequence)


# ---- the other frameworks' corrections (grpo_theory.corrections) ------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", [dict(), dict(epsilon_high=0.28), dict(delta=1.5), dict(cap_min=0.7)])
@pytest.mark.parametrize("seed", range(4))
def test_every_mode_on_one_token_rows_weighted_by_alpha_is_the_exact_tabular_objective(mode, extra, seed):
    """Rows = the table's responses, loss weights = alpha(y): minus the loss is E_alpha of the mode's objective,
    ``grpo_theory.corrected_surrogate``, for every mode, upper width, two-sided clip and lower cap (IcePop's band)."""
    rng = np.random.default_rng(seed)
    n = 7
    alpha, pi_k = gt.softmax(rng.normal(size=n)), gt.softmax(rng.normal(size=n))
    pi = gt.softmax(np.log(pi_k) + 0.4 * rng.normal(size=n))
    r = (rng.random(n) < 0.5).astype(float)
    r[:2] = 0.0, 1.0
    adv = gt.whitened_advantage(alpha, r, 1e-4)
    col = lambda x: torch.tensor(np.log(x))[:, None]  # noqa: E731
    spec = Clip(0.2, extra.get("epsilon_high"), extra.get("delta", 0.0), "token", mode, 1.5, extra.get("cap_min", 0.0),
                m2_threshold=0.04)
    weights = torch.tensor(alpha)[:, None]
    keep = step_mask_torch(REGISTRY[mode], col(pi_k) - col(alpha), torch.tensor(adv)[:, None], weights,
                           spec.step_threshold)
    loss, stats = grpo_loss(col(pi), col(pi_k), col(alpha), torch.tensor(adv), weights, clip=spec, token_keep=keep)
    want = corrected_surrogate(pi, pi_k, alpha, r, 1e-4, 0.2, mode, 1.5, extra.get("epsilon_high"),
                               extra.get("delta", 0.0), extra.get("cap_min", 0.0), m2_threshold=0.04)
    assert -float(loss) == pytest.approx(want, abs=1e-12)
    w = pi_k / alpha
    outside = np.mean((w > 1.5) | (w < extra.get("cap_min", 0.0)))
    if REGISTRY[mode].step_mask:  # the dropped tokens (AReaL's mask drops some on every table here)
        outside = float(np.mean(~keep.numpy()))
        assert outside > 0 or mode in ("m2po", "seq_max_k2")
    assert stats.metrics()["is_correction/frac_above_cap"] == pytest.approx(0.0 if mode in ("paper", "none") else outside)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_normalised"])
def test_multi_token_modes_follow_their_definitions(mode, level):
    """B completions of T tokens: the loss equals the definition written out in numpy (rho = pi/pi_k at the ratio
    level, PPO clip, times w = pi_k/alpha per token or exp of the completion's summed log-weights, capped)."""
    logp, logp_k, logp_alpha, adv, mask = _inputs(3)
    w_tok = loss_weights(mask, "grpo", T)
    cap = 1.3
    loss, _ = grpo_loss(logp, logp_k, logp_alpha, adv, w_tok, clip=Clip(0.2, 0.3, 0.0, level, mode, cap))
    lp, lk, la, m = (x.detach().double().numpy() for x in (logp, logp_k, logp_alpha, mask))
    d = (lp - lk) * m
    log_rho = {"token": lp - lk, "sequence": np.repeat(d.sum(1, keepdims=True), T, 1),
               "sequence_normalised": np.repeat(d.sum(1, keepdims=True) / m.sum(1, keepdims=True), T, 1)}[level]
    log_w = lk - la if mode.startswith("token") else np.repeat(((lk - la) * m).sum(1, keepdims=True), T, 1)
    w = np.exp(log_w)
    w = np.minimum(w, cap) if mode.endswith("truncate") else np.where(w <= cap, w, 0.0)
    a = np.repeat(adv.double().numpy()[:, None], T, 1)
    g = gt.clip_objective(np.exp(log_rho), np.ones_like(a), a, 0.2, clip_high=0.3)
    assert float(loss.detach()) == pytest.approx(-np.sum(w * g * w_tok.double().numpy()), rel=1e-5, abs=1e-6)


def test_the_config_refuses_bad_corrections():
    for kw, field in [(dict(delta=1.1), "delta"), (dict(epsilon_high=-0.5), "epsilon_high"),
                      (dict(importance_sampling_cap=0.0), "importance_sampling_cap"),
                      (dict(sync_policy="divergence"), "sync_policy"),
                      (dict(sync_policy="divergence", heldout_prompts=4, async_generation=True, max_lag=0), "max_lag"),
                      (dict(max_staleness=-2), "max_staleness"), (dict(ratio_level="sequence_normalised"), "ratio_level")]:
        with pytest.raises(ValueError, match=field):
            GRPOConfig(**kw)
    assert GRPOConfig(delta=1.3, epsilon_high=0.28).clip_high == 0.28
    assert GRPOConfig().clip_high == 0.2


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.01, 0.04, 0.3]), st.booleans())
def test_the_m2po_mask_in_torch_is_grpo_theorys(seed, threshold, weighted):
    """AReaL's mask over a (B, T) step (padding of weight 0, ties among equal weights), computed by the loss's
    ``step_mask_torch`` from its one definition, equals ``grpo_theory.second_moment_keep`` on its tokens, token for
    token."""
    g = np.random.default_rng(seed)
    log_w = np.round(g.normal(scale=0.4, size=(6, 5)), 1)  # rounded: ties in (log w)^2
    weight = g.random((6, 5)) if weighted else np.ones((6, 5))
    weight[g.random((6, 5)) < 0.2] = 0.0
    got = second_moment_keep_torch(torch.tensor(log_w), torch.tensor(weight), threshold).numpy()
    on = weight > 0
    want = np.zeros_like(on)
    want[on] = second_moment_keep(log_w[on], weight[on], threshold)
    assert (got == want).all()


def m2po_by_algorithm_1(log_w, adv, weight, threshold):
    """M2PO's mask transcribed from its paper's Algorithm 1, one sample at a time: the trust-region samples are the
    candidates; while the weighted mean of (log w)^2 over the candidates left exceeds the threshold, remove the
    candidate with the largest (log w)^2 (the first of equals). Everything else stays."""
    keep = [w > 0 for w in weight]
    left = [i for i in range(len(log_w)) if weight[i] > 0 and ((adv[i] > 0 and log_w[i] > 0)
                                                               or (adv[i] < 0 and log_w[i] < 0))]
    while left:
        mean = sum(weight[i] * log_w[i] ** 2 for i in left) / sum(weight[i] for i in left)
        if not mean > threshold:
            break
        worst = max(left, key=lambda i: (log_w[i] ** 2, -i))
        left.remove(worst)
        keep[worst] = False
    return np.array(keep)


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.011, 0.041, 0.29, 10.0]), st.booleans())
def test_the_paper_m2po_mask_is_algorithm_1_in_numpy_and_in_torch(seed, threshold, weighted):
    """``trust_region_second_moment_keep`` (numpy) and its torch twin equal a direct transcription of the paper's
    Algorithm 1 on random steps with their edges: ties in (log w)^2, zero advantages, tokens of weight 0, an empty
    trust region (all advantages 0), every candidate above the threshold (threshold 0: the whole region dropped) and
    none (threshold 10: nothing dropped); non-candidates are never dropped. The thresholds are off the squares of
    the rounded log-weights (0.01, 0.04, ...), where the two ways of summing a mean may round to either side."""
    g = np.random.default_rng(seed)
    log_w = np.round(g.normal(scale=0.4, size=(6, 5)), 1)  # rounded: ties in (log w)^2
    adv = np.repeat(g.choice([-1.0, 0.0, 0.5], size=(6, 1)), 5, axis=1)
    if seed % 5 == 0:
        adv[:] = 0.0  # an empty trust region
    weight = g.random((6, 5)) if weighted else np.ones((6, 5))
    weight[g.random((6, 5)) < 0.2] = 0.0
    want = m2po_by_algorithm_1(log_w.ravel(), adv.ravel(), weight.ravel(), threshold).reshape(6, 5)
    assert (trust_region_second_moment_keep(log_w.ravel(), adv.ravel(), weight.ravel(), threshold).reshape(6, 5)
            == want).all()
    got = trust_region_second_moment_keep_torch(torch.tensor(log_w), torch.tensor(adv), torch.tensor(weight),
                                                threshold).numpy()
    assert (got == want).all()
    outside = (weight > 0) & ~(((adv > 0) & (log_w > 0)) | ((adv < 0) & (log_w < 0)))
    assert want[outside].all()
    if threshold == 0.0:
        assert not want[(weight > 0) & ~outside & (log_w != 0)].any()


def test_the_paper_m2po_drops_fewer_tokens_than_areals_on_synthetic_steps():
    """On synthetic steps (log w ~ N(0, 0.3^2) per token, advantages of both signs and zero groups) AReaL's every-
    token mask drops more tokens than the paper's, most of its extra drops outside the trust region (issue's figure:
    2-4x)."""
    g = np.random.default_rng(0)
    ratios = []
    for _ in range(20):
        log_w = g.normal(scale=0.3, size=(16, 20))
        adv = np.repeat(g.choice([-1.0, 0.0, 1.0], size=(16, 1)), 20, axis=1)
        paper = trust_region_second_moment_keep(log_w.ravel(), adv.ravel(), None, 0.04)
        areal = second_moment_keep(log_w.ravel(), None, 0.04)
        ratios.append((~areal).sum() / max((~paper).sum(), 1))
    assert np.median(ratios) > 1.5, ratios


def test_m2po_leaves_the_dropped_tokens_out_and_does_not_clip():
    """mode m2po: minus the loss is sum over kept tokens of weight x (pi/alpha) A (no clip: a ratio far outside any
    window counts in full), the dropped tokens count in is_correction/frac_above_cap, and no token is flagged clipped.
    The mask is the plain token mean's over the step's completion tokens."""
    logp, logp_k, logp_alpha, adv, mask = _inputs(4)
    w_tok = loss_weights(mask, "dapo", T)
    keep = second_moment_keep_torch(logp_k - logp_alpha, mask, 0.04)
    on = w_tok > 0
    assert 0 < keep[on].float().mean() < 1
    loss, stats = grpo_loss(logp, logp_k, logp_alpha, adv, w_tok, clip=Clip(0.2, importance_sampling_mode="m2po"),
                            token_keep=keep)
    r = torch.exp(logp - logp_alpha).detach().double()
    want = -(keep.double() * r * adv.double()[:, None] * w_tok.double()).sum()
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-6)
    m = stats.metrics()
    assert m["is_correction/frac_above_cap"] == pytest.approx(1 - float(keep[on].float().mean()))
    assert m["clip_ratio/region_mean"] == 0.0


@pytest.mark.parametrize("threshold", [0.04, 1e9])
@pytest.mark.parametrize("seed", range(3))
def test_m2po_gradient_is_the_published_objectives(threshold, seed):
    """On a table (one-token rows weighted by alpha) at pi = pi_k, with the mask on (tau = 0.04 drops responses) and off:
    the loss's gradient in the logits is the gradient of M2PO's published objective sum_y keep(y) pi(y) A(y)
    (arXiv 2510.01161: the mask times pi/alpha under alpha), pi (keep A - sum_y keep pi A); the importance weight
    pi_k/alpha is in it, so it is pi_k's policy gradient over the kept responses, not alpha's."""
    rng = np.random.default_rng(seed)
    n = 7
    alpha = gt.softmax(rng.normal(size=n))
    theta = torch.tensor(np.log(alpha) + 0.6 * rng.normal(size=n), requires_grad=True)
    pi_k = torch.softmax(theta, 0).detach().numpy()
    r = (rng.random(n) < 0.5).astype(float)
    r[:2] = 0.0, 1.0
    adv = gt.whitened_advantage(alpha, r, 1e-4)
    col = lambda x: torch.as_tensor(x)[:, None]  # noqa: E731
    logp = torch.log_softmax(theta, 0)[:, None]
    weights = col(alpha)
    keep = second_moment_keep_torch(col(np.log(pi_k / alpha)), weights, threshold)
    assert (0 < keep.sum() < n) if threshold < 1 else bool(keep.all())
    loss, _ = grpo_loss(logp, col(np.log(pi_k)), col(np.log(alpha)), torch.tensor(adv), weights,
                        clip=Clip(0.2, importance_sampling_mode="m2po"), token_keep=keep)
    (-loss).backward()
    k = keep.numpy()[:, 0].astype(float)
    published = pi_k * (k * adv - np.sum(k * pi_k * adv))
    assert np.allclose(theta.grad.numpy(), published, atol=1e-12)
    variant = alpha * k * adv - pi_k * np.sum(alpha * k * adv)  # keep (pi/pi_k) A, the weight dropped: alpha's
    assert not np.allclose(published, variant, atol=1e-3)


def test_loss_types_and_advantage_scales_are_registries_declared_once():
    """One object per loss type (``grpo_theory.loss_types.LOSS_TYPES``) and one function per advantage scale
    (``grpo_theory.core.ADVANTAGE_SCALES``), their names the config's Literal types themselves; every loss type's
    weights follow its normaliser, and bnpo alone is normalised per pass."""
    import typing

    from grpo_theory.core import ADVANTAGE_SCALES, ScaleRewards
    from llm.config import ObjectiveConfig
    from grpo_theory.loss_types import LOSS_TYPES, LossTypeName

    hints = typing.get_type_hints(ObjectiveConfig)
    assert hints["loss_type"] is LossTypeName and hints["scale_rewards"] is ScaleRewards
    assert set(ObjectiveConfig.model_fields) >= {"loss_type", "scale_rewards"}
    assert tuple(LOSS_TYPES) == typing.get_args(LossTypeName)
    assert tuple(ADVANTAGE_SCALES) == typing.get_args(ScaleRewards)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    want = {"tokens": mask / 3, "sequence": torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]), "budget": mask / 6,
            "sequence_sum": mask / 2}
    for name, lt in LOSS_TYPES.items():
        assert torch.allclose(loss_weights(mask, name, 3), want[lt.normaliser]), name
    assert [n for n, lt in LOSS_TYPES.items() if lt.per_pass] == ["bnpo"]
    assert {n: lt.objective for n, lt in LOSS_TYPES.items() if lt.objective != "clip"} == {
        "cispo": "cispo", "sapo": "sapo", "vespo": "vespo", "dppo_tv": "dppo_tv", "dppo_kl": "dppo_kl"}
    with pytest.raises(ValueError, match="loss_type: expected one of grpo, dapo, dr_grpo, bnpo"):
        loss_weights(mask, "mean", 3)


def test_trust_region_masking_drops_whole_completions_by_their_largest_k2():
    """mode seq_max_k2: a completion with one token's (log pi_k/alpha)^2 / 2 above the threshold leaves the loss whole;
    the others count every token with the unclipped pi/alpha; padding never decides; on one-token rows the torch mask is
    ``grpo_theory.corrections.max_k2_keep``."""
    from grpo_theory.corrections import ROLLOUT_RS_THRESHOLD, max_k2_keep

    log_w = torch.tensor([[0.1, -0.2, 0.0], [0.1, 0.8, 0.0], [0.1, 0.0, 5.0], [-0.69, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    keep = max_k2_keep_torch(log_w, mask, ROLLOUT_RS_THRESHOLD)
    assert keep.tolist() == [[True] * 3, [False] * 3, [True, True, False], [True, False, False]]
    col = log_w[:, :1]
    one_token = max_k2_keep_torch(col, torch.ones_like(col), 0.1)[:, 0]
    assert one_token.tolist() == max_k2_keep(col[:, 0].numpy(), 0.1).tolist()
    logp, logp_k, logp_alpha, adv, m = _inputs(5)
    w_tok = loss_weights(m, "dapo", T)
    keep = max_k2_keep_torch(logp_k - logp_alpha, m, 0.05)
    loss, _ = grpo_loss(logp, logp_k, logp_alpha, adv, w_tok, clip=Clip(0.2, importance_sampling_mode="seq_max_k2"),
                        token_keep=keep)
    want = -(keep.double() * torch.exp(logp - logp_alpha).detach().double() * adv.double()[:, None] * w_tok.double())
    assert float(loss.detach()) == pytest.approx(float(want.sum()), rel=1e-6)
    rows = keep.any(dim=1)
    assert 0 < float(rows.float().mean()) < 1
    assert bool(((keep == rows[:, None]) | (m == 0)).all())  # all of a completion's tokens, or none

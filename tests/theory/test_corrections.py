"""grpo_theory.corrections: the TRL importance-sampling modes, exact on a table, against the formulas the docs claim."""

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from grpo_theory import clip_objective, clipped_surrogate, softmax, whitened_advantage
from grpo_theory.corrections import (
    MODES,
    TRL_MODES,
    corrected_objective,
    corrected_slope,
    corrected_surrogate,
    corrected_weight,
    second_moment_keep,
    trust_region_second_moment_keep,
)

EPS = 1e-4
#: A clip width so wide that no ratio of these tables reaches its window: isolates the weight's effect.
NO_CLIP = 1e9
TOL = 1e-12

tables = st.integers(0, 10_000).map(lambda seed: np.random.default_rng(seed))


def table(rng, n=6, spread=1.0):
    alpha, pi_k = softmax(rng.normal(size=n)), softmax(rng.normal(size=n))
    pi = softmax(np.log(pi_k) + spread * 0.3 * rng.normal(size=n))
    r = (rng.random(n) < 0.5).astype(float)
    r[0], r[1] = 0.0, 1.0  # rewards vary: sigma > 0
    return pi, pi_k, alpha, r


@given(tables, st.sampled_from(TRL_MODES))
def test_an_infinite_cap_is_the_paper_objective_with_a_window_proportional_to_r_prime(rng, mode):
    pi, pi_k, alpha, r = table(rng)
    a = whitened_advantage(alpha, r, EPS)
    got = corrected_surrogate(pi, pi_k, alpha, r, EPS, 0.2, mode, cap=np.inf)
    rk = pi_k / alpha
    ratio = pi / alpha
    f = np.minimum(ratio * a, np.clip(ratio, rk * 0.8, rk * 1.2) * a)
    assert got == pytest.approx(np.sum(alpha * f), abs=TOL)


@given(tables, st.sampled_from(("paper", *TRL_MODES)))
def test_every_mode_without_a_binding_cap_agrees_with_the_paper_at_pi_equal_pi_k(rng, mode):
    """Value and gradient (in pi's logits) at pi = pi_k: E_{pi_k} A and the on-policy gradient, for the TRL modes when
    the cap exceeds every pi_k/alpha (not M2PO, whose gradient there is alpha's: its own test below)."""
    _, pi_k, alpha, r = table(rng)
    cap = float(np.max(pi_k / alpha)) * 2
    theta = np.log(pi_k)
    fn = lambda th: corrected_surrogate(softmax(th), pi_k, alpha, r, EPS, 0.2, mode, cap)  # noqa: E731
    paper = lambda th: clipped_surrogate(softmax(th), pi_k, alpha, r, EPS, 0.2)  # noqa: E731
    assert fn(theta) == pytest.approx(paper(theta), abs=TOL)
    h = 1e-6
    for j in range(len(theta)):
        e = np.zeros_like(theta)
        e[j] = h
        assert (fn(theta + e) - fn(theta - e)) / (2 * h) == pytest.approx((paper(theta + e) - paper(theta - e)) / (2 * h),
                                                                          abs=1e-6)


@given(tables, st.floats(0.3, 3.0), st.sampled_from(["token_truncate", "sequence_truncate"]))
def test_truncation_weighs_each_response_by_min_pi_k_and_c_alpha(rng, cap, mode):
    """No clip binding: sum_y min(pi_k, C alpha) (pi/pi_k) A."""
    pi, pi_k, alpha, r = table(rng)
    a = whitened_advantage(alpha, r, EPS)
    want = np.sum(np.minimum(pi_k, cap * alpha) * pi / pi_k * a)
    assert corrected_surrogate(pi, pi_k, alpha, r, EPS, NO_CLIP, mode, cap) == pytest.approx(want, abs=TOL)


@given(tables, st.floats(0.3, 3.0), st.sampled_from(["token_mask", "sequence_mask"]))
def test_masking_keeps_the_responses_with_pi_k_at_most_c_alpha(rng, cap, mode):
    """No clip binding: sum over {y: pi_k(y) <= C alpha(y)} of pi(y) A(y)."""
    pi, pi_k, alpha, r = table(rng)
    a = whitened_advantage(alpha, r, EPS)
    kept = pi_k <= cap * alpha
    want = np.sum(np.where(kept, pi * a, 0.0))
    assert corrected_surrogate(pi, pi_k, alpha, r, EPS, NO_CLIP, mode, cap) == pytest.approx(want, abs=TOL)


def test_truncation_biases_the_value_at_pi_k_when_the_cap_binds():
    """pi_k puts 0.9 on a response alpha gives 0.1 (w = 9): a cap of 3 counts it at 0.3, not 0.9."""
    alpha, pi_k = np.array([0.1, 0.9]), np.array([0.9, 0.1])
    r = np.array([1.0, 0.0])
    a = whitened_advantage(alpha, r, EPS)
    exact = clipped_surrogate(pi_k, pi_k, alpha, r, EPS, 0.2)
    assert exact == pytest.approx(np.sum(pi_k * a))
    truncated = corrected_surrogate(pi_k, pi_k, alpha, r, EPS, 0.2, "token_truncate", 3.0)
    assert truncated == pytest.approx(0.3 * a[0] + 0.1 * a[1])
    assert corrected_surrogate(pi_k, pi_k, alpha, r, EPS, 0.2, "token_mask", 3.0) == pytest.approx(0.1 * a[1])


def test_weights_and_the_two_sided_clip_on_hand_cases():
    assert np.array_equal(corrected_weight([0.5, 2.0, 4.0], "token_truncate", 3.0), [0.5, 2.0, 3.0])
    assert np.array_equal(corrected_weight([0.5, 2.0, 4.0], "sequence_mask", 3.0), [0.5, 2.0, 0.0])
    assert np.array_equal(corrected_weight([0.5, 4.0], "paper", 3.0), [1.0, 1.0])
    with pytest.raises(ValueError, match="importance_sampling_mode"):
        corrected_weight([1.0], "token_clip", 3.0)
    # delta caps the unclipped ratio of a negative advantage: r = 10 counts as r' + delta - 1 = 3
    assert clip_objective(10.0, 1.0, -1.0, 0.2, delta=3.0) == pytest.approx(-3.0)
    assert clip_objective(10.0, 1.0, -1.0, 0.2) == pytest.approx(-10.0)
    # epsilon_high widens only the top of the window
    assert clip_objective(2.0, 1.0, 1.0, 0.2, clip_high=0.28) == pytest.approx(1.28)
    assert clip_objective(0.1, 1.0, -1.0, 0.2, clip_high=0.28) == pytest.approx(-0.8)
    # TRL mode: rho = r/r' = 2 clipped at 1 + 0.28, times w = min(r', C) = 2
    assert corrected_objective(4.0, 2.0, 1.0, 0.2, "token_truncate", 3.0, clip_high=0.28) == pytest.approx(2 * 1.28)


@given(st.lists(st.floats(-3, 3), min_size=1, max_size=30), st.sampled_from([0.0, 0.01, 0.04, 0.5]))
@example([0.5, 0.5], 0.25)  # a mean exactly at tau (0.25, exact in binary): not below it, so drop (AReaL's test)
@example([0.3, 0.4, 0.5], 0.01)  # every sample above tau: the smallest alone is kept (AReaL's rule)
def test_the_m2po_mask_keeps_the_smallest_weights_below_the_threshold_with_fewest_drops(log_w, threshold):
    """``second_moment_keep``: the kept mean of (log w)^2 is strictly below tau, or one sample is kept (the smallest
    (log w)^2) when no set is; every dropped sample's (log w)^2 is at least every kept one's; and keeping also the
    smallest dropped one would not be below tau (the fewest drops). Never empty."""
    x = np.array(log_w)
    m = x**2
    keep = second_moment_keep(x, threshold=threshold)
    assert keep.sum() >= 1
    if m[keep].mean() >= threshold:
        assert keep.sum() == 1 and m[keep][0] == m.min()
    if (~keep).any():
        assert m[~keep].min() >= m[keep].max()
        dropped = np.flatnonzero(~keep)
        back = dropped[np.argmin(m[dropped])]
        more = keep.copy()
        more[back] = True
        assert m[more].mean() >= threshold


def test_the_m2po_mask_follows_areals_edges():
    """The reference's edges (areal/trainer/ppo/actor.py, ``_get_m2po_loss_mask``), by hand: the mean must be strictly
    below tau; a set at exactly tau drops one more; all above keeps the smallest; a sample of weight 0 is never kept."""
    assert second_moment_keep([0.1, 0.1, 0.1], threshold=0.02).all()  # mean 0.01 < 0.02
    assert second_moment_keep([0.5, 0.5], threshold=0.25).tolist() == [False, True]  # exactly at tau: drop one
    assert second_moment_keep([0.5, 0.3, 0.4], threshold=0.01).tolist() == [False, True, False]
    assert second_moment_keep([0.0, 1.0], [0.0, 1.0], threshold=0.04).tolist() == [False, True]


@pytest.mark.parametrize("mode", ["m2po", "m2po_areal"])
@given(rng=tables)
def test_m2po_on_a_table_is_the_published_objective(rng, mode):
    """corrected_surrogate(m2po) = sum_y alpha keep (pi/alpha) A_alpha = sum_y keep pi A_alpha (arXiv 2510.01161: the
    mask times the unclipped ratio against the behaviour policy), keep the alpha-weighted mask of the table's
    log pi_k/alpha: the paper's trust-region mask (m2po) or AReaL's every-sample mask (m2po_areal); at pi = pi_k it
    is sum_y keep pi_k A: pi_k's expectation over the kept responses. With nothing dropped (a threshold above every
    M_2) it is the importance-sampled surrogate sum_y pi A, exact."""
    pi, pi_k, alpha, r = table(rng)
    a = whitened_advantage(alpha, r, EPS)
    log_w = np.log(pi_k / alpha)
    keep = (trust_region_second_moment_keep(log_w, a, alpha, 0.04) if mode == "m2po"
            else second_moment_keep(log_w, alpha, 0.04))
    want = np.sum(alpha * keep * (pi / alpha) * a)
    assert corrected_surrogate(pi, pi_k, alpha, r, EPS, 0.2, mode) == pytest.approx(want, abs=TOL)
    at_k = corrected_surrogate(pi_k, pi_k, alpha, r, EPS, 0.2, mode)
    assert at_k == pytest.approx(np.sum(keep * pi_k * a), abs=TOL)
    unmasked = corrected_surrogate(pi, pi_k, alpha, r, EPS, 0.2, mode, m2_threshold=1e9)
    assert unmasked == pytest.approx(np.sum(pi * a), abs=TOL)


@given(st.floats(0.05, 5.0), st.floats(0.05, 5.0), st.floats(-2.0, 2.0), st.sampled_from(MODES),
       st.booleans())
def test_the_slope_is_the_derivative_of_the_objective_in_r(ratio, ratio_k, adv, mode, kept):
    """``corrected_slope`` against central differences of ``corrected_objective`` in r = pi/alpha, away from the
    kinks (the edges of the paper's window r' +- eps, and of PPO's r/r' in 1 +- eps), for every mode; M2PO with the
    sample kept and dropped; where a clip flag is set the slope is 0."""
    clip, cap, cap_min, h = 0.2, 1.5, 0.6, 1e-6
    edges = [ratio_k - clip, ratio_k + clip] if mode == "paper" else [ratio_k * (1 - clip), ratio_k * (1 + clip)]
    assume(all(abs(ratio - e) > 1e-4 for e in edges))
    keep = np.array(kept)
    f = lambda r: float(corrected_objective(r, ratio_k, adv, clip, mode, cap, cap_min=cap_min, keep=keep))  # noqa
    slope, low, high = corrected_slope(ratio, ratio_k, adv, clip, mode, cap, cap_min, keep)
    assert float(slope) == pytest.approx((f(ratio + h) - f(ratio - h)) / (2 * h), rel=1e-5, abs=1e-7)
    assert not (low | high) or float(slope) == 0.0


@given(tables)
def test_no_correction_ascends_alphas_policy_gradient_not_pi_ks(rng):
    """Mode none (TRL's vllm_importance_sampling_correction=False): at pi = pi_k the gradient in the logits of its
    surrogate is E_alpha[A grad log pi] = sum_y alpha(y) A(y) (e_y - pi_k), alpha's policy gradient, where the paper's
    weighted objective ascends pi_k's, sum_y alpha(y) (pi_k(y)/alpha(y)) A(y) (e_y - pi_k) (central differences)."""
    _, pi_k, alpha, r = table(rng)
    theta = np.log(pi_k)
    a = whitened_advantage(alpha, r, EPS)
    eye = np.eye(len(pi_k))

    def grad(mode):
        h = 1e-6
        f = lambda t: float(corrected_surrogate(softmax(t), pi_k, alpha, r, EPS, NO_CLIP, mode))  # noqa: E731
        return np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in eye])

    alphas = (alpha * a) @ (eye - pi_k)
    np.testing.assert_allclose(grad("none"), alphas, atol=1e-7)
    np.testing.assert_allclose(grad("paper"), (pi_k * a) @ (eye - pi_k), atol=1e-7)
    assert "none" in MODES and "none" not in TRL_MODES

"""What each per-prompt estimate of ``grpo_theory.estimators`` estimates, to 1e-10, by exact expectation: every G-tuple
of responses of a small bandit is enumerated with its probability under alpha (docs/theory.md, §8)."""

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import grpo_theory as gt
import grpo_theory.estimators as ge

#: Exact expectations are sums of at most 4^4 terms: they agree with the closed forms to float64 rounding.
EXACT = 1e-10


def expectation(estimator, pi, pi_k, alpha, r, G):
    """E over G responses drawn from alpha of ``estimator(rewards, w_new, w_k)``, by enumeration: every one of the
    K^G outcomes with alpha-probability > 0 is a row (a group) of one call, weighted by its probability."""
    ys = np.array(list(itertools.product(range(len(alpha)), repeat=G)))
    prob = np.prod(alpha[ys], axis=1)
    ys, prob = ys[prob > 0], prob[prob > 0]
    return float(prob @ np.asarray(estimator(r[ys], pi[ys] / alpha[ys], pi_k[ys] / alpha[ys]), dtype=np.float64))


def policies_and_rewards(seed, K=4, binary=True, gap=False):
    g = np.random.default_rng(seed)
    pi, pi_k, alpha = (g.dirichlet(np.ones(K)) for _ in range(3))
    if gap:  # alpha never samples action 0, which pi and pi_k still take
        alpha[0] = 0.0
        alpha /= alpha.sum()
    r = (g.random(K) < 0.5).astype(float) if binary else g.random(K)
    if binary and np.ptp(r) == 0:
        r[0] = 1.0 - r[0]
    return pi, pi_k, alpha, r


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 4]), st.booleans())
@example(seed=0, G=4, gap=True)
def test_tv_estimate_is_unbiased_and_never_above_one(seed, G, gap):
    """E mean_g (1 - w_g)^+ = TV(pi, alpha), also where pi puts mass alpha never samples (there the half-L1 form
    1/2 mean |w - 1| is biased low); and the estimate lies in [0, 1] for any weights."""
    pi, pi_k, alpha, r = policies_and_rewards(seed, gap=gap)
    est = expectation(lambda r_, w, wk: ge.tv_estimate(w), pi, pi_k, alpha, r, G)
    assert est == pytest.approx(float(gt.tv_distance(pi, alpha)), abs=EXACT)
    half_l1 = expectation(lambda r_, w, wk: 0.5 * np.mean(np.abs(w - 1), axis=-1), pi, pi_k, alpha, r, G)
    assert half_l1 == pytest.approx(est - (pi[0] / 2 if gap else 0.0), abs=EXACT)  # misses half of pi's mass there
    assert 0 <= float(ge.tv_estimate(np.array([[1e300, 0.0, 2.0, np.inf]]))[0]) <= 1


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 4]), st.booleans())
@example(seed=0, G=3, gap=True)
def test_tv_between_estimate_is_unbiased_where_alpha_covers_both(seed, G, gap):
    """E mean_g |w_g - w_k,g| / 2 = TV(pi, pi_k) (the drift the asynchronous divergence policy projects with); where
    alpha never samples action 0 it is low by exactly |pi(0) - pi_k(0)| / 2."""
    pi, pi_k, alpha, r = policies_and_rewards(seed, gap=gap)
    est = expectation(lambda r_, w, wk: ge.tv_between_estimate(w, wk), pi, pi_k, alpha, r, G)
    missed = abs(pi[0] - pi_k[0]) / 2 if gap else 0.0
    assert est == pytest.approx(float(gt.tv_distance(pi, pi_k)) - missed, abs=EXACT)
    if gap:
        assert est < float(gt.tv_distance(pi, pi_k)) or missed == 0


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 4]), st.booleans())
def test_tv_anchored_estimate_is_unbiased_where_alpha_covers_the_reference_and_bounded_by_its_weight(seed, G, gap):
    """E mean_g (w_k,g - w_g)^+ = TV(pi, pi_k); where alpha never samples action 0 it is low by exactly
    (pi_k(0) - pi(0))^+; each value is at most the reference's weight, 0 when both weights agree, and with the
    reference's weights 1 it is tv_estimate."""
    pi, pi_k, alpha, r = policies_and_rewards(seed, gap=gap)
    est = expectation(lambda r_, w, wk: ge.tv_anchored_estimate(w, wk), pi, pi_k, alpha, r, G)
    missed = max(pi_k[0] - pi[0], 0.0) if gap else 0.0
    assert est == pytest.approx(float(gt.tv_distance(pi, pi_k)) - missed, abs=EXACT)
    g = np.random.default_rng(seed)
    w, w_ref = g.lognormal(0, 3, size=(5, G)), g.lognormal(0, 0.1, size=(5, G))
    assert (ge.tv_anchored_estimate(w, w_ref) <= w_ref.max(axis=-1)).all()
    assert (ge.tv_anchored_estimate(w_ref, w_ref) == 0).all()
    assert np.array_equal(ge.tv_anchored_estimate(w, np.ones_like(w)), ge.tv_estimate(w))


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 4]), st.booleans())
def test_improvement_estimate_is_unbiased_and_zero_on_equal_rewards(seed, G, binary):
    pi, pi_k, alpha, r = policies_and_rewards(seed, binary=binary)
    est = expectation(lambda r_, w, wk: ge.improvement_estimate(r_, w, wk), pi, pi_k, alpha, r, G)
    assert est == pytest.approx(float(gt.expected_reward(pi, r) - gt.expected_reward(pi_k, r)), abs=EXACT)
    assert ge.improvement_estimate(np.ones((1, G)), np.full((1, G), 7.0), np.ones((1, G)))[0] == 0.0


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 4]), st.sampled_from([0.0, 1e-4, 0.1]))
@example(seed=1, G=4, eps=1e-4)
def test_bound_terms_have_exactly_the_stated_bias(seed, G, eps):
    """Bernoulli rewards: E[surrogate] = (J(pi) - J(alpha)) E[1/s~], E[penalty_tv] = c TV(pi, alpha) (E[1/s~] - 1),
    E[penalty_lag] = c TV(pi_k, alpha), so E[lower] - lower = (J(pi) - J(alpha) - c TV(pi, alpha)) (E[1/s~] - 1/s),
    with E[1/s~] the binomial expectation of ``inverse_sigma_expectation`` and s = sigma_{alpha,eps}."""
    pi, pi_k, alpha, r = policies_and_rewards(seed)
    p = float(alpha @ r)
    h = float(ge.inverse_sigma_expectation(p, G, eps))
    for c in (1.0, 2.0):
        terms = [expectation(lambda r_, w, wk, i=i: ge.bound_estimates(r_, w, wk, eps, c)[i], pi, pi_k, alpha, r, G)
                 for i in range(4)]
        gain, tv, tv_k = (float(x) for x in (gt.expected_reward(pi, r) - gt.expected_reward(alpha, r),
                                             gt.tv_distance(pi, alpha), gt.tv_distance(pi_k, alpha)))
        assert terms[0] == pytest.approx(gain * h, abs=EXACT)
        assert terms[1] == pytest.approx(c * tv * (h - 1), abs=EXACT)
        assert terms[2] == pytest.approx(c * tv_k, abs=EXACT)
        exact = gt.bound_terms(pi, pi_k, alpha, r, eps) if c == 2.0 else gt.bound_terms(pi, pi_k, alpha, r, eps,
                                                                                           tight=True)
        s = np.sqrt(p * (1 - p) + eps)
        assert terms[3] == pytest.approx(float(exact.lower) + (gain - c * tv) * (h - 1 / s), abs=EXACT)


def test_the_surrogate_vanishes_on_equal_rewards_and_the_plug_in_weight_did_not():
    """A group of 8 equal rewards with weights 1.02 (log 0.02): the surrogate and improvement estimates are exactly
    0 (the plug-in gave a surrogate of 2.02 and a tight bound of +1.02 here, with s = sqrt(eps) = 0.01)."""
    r, w = np.ones((1, 8)), np.full((1, 8), np.exp(0.02))
    terms = ge.bound_estimates(r, w, np.ones((1, 8)), 1e-4, 1.0)
    assert terms.surrogate[0] == 0.0 and ge.improvement_estimate(r, w, np.ones((1, 8)))[0] == 0.0
    assert terms.lower[0] == -terms.penalty_tv[0] <= 0


@pytest.mark.parametrize("G", [4, 8, 16])
def test_inverse_sigma_is_the_enumerated_expectation_and_far_closer_than_the_plug_in(G):
    """``inverse_sigma_expectation`` is the expectation of ``inverse_sigma`` over the other G - 1 Bernoulli rewards
    (enumerated); within a factor 0.75-1.25 of 1/s for p in [0.05, 0.5] at G >= 8, where the plug-in's
    1/sqrt(sigma_plugin^2 + eps) is off by up to a factor 15."""
    from scipy.stats import binom

    eps = 1e-4
    for p in (0.01, 0.05, 0.2, 0.5):
        enumerated = 0.0
        for k in range(G):  # the other G - 1 rewards: k ones; response 0 is the one left out
            others = np.array([1.0] * k + [0.0] * (G - 1 - k))
            group = np.concatenate([[0.0], others])[None]
            enumerated += binom.pmf(k, G - 1, p) * float(ge.inverse_sigma(group, eps)[0, 0])
        assert enumerated == pytest.approx(float(ge.inverse_sigma_expectation(p, G, eps)), rel=1e-12)
    truth = lambda p: 1 / np.sqrt(p * (1 - p) + eps)  # noqa: E731
    k = np.arange(G)
    plug = lambda p: float(np.sum(binom.pmf(k, G - 1, p) / np.sqrt((k / (G - 1)) * (1 - k / (G - 1)) + eps)))  # noqa
    if G >= 8:
        for p in (0.05, 0.1, 0.2, 0.3, 0.5):
            assert 0.75 <= float(ge.inverse_sigma_expectation(p, G, eps)) / truth(p) <= 1.25, p
        assert max(plug(p) / truth(p) for p in (0.05, 0.1, 0.2)) > 10


def test_kish_effective_sample_size():
    assert ge.kish_ess_fraction(np.ones(10)) == pytest.approx(1.0)
    assert ge.kish_ess_fraction(np.array([1.0] + [0.0] * 9)) == pytest.approx(0.1)
    assert ge.kish_ess_fraction(np.array([[1.0, 1.0], [4.0, 0.0]]), axis=1).tolist() == [1.0, 0.5]


def test_the_unguaranteed_bounds_by_hand_their_old_names_and_their_abstention():
    """``t_unguaranteed`` is mean - t_{n-1}(level) sd/sqrt(n), ``cantelli_unguaranteed`` mean - sqrt(level/(1 -
    level)) sd/sqrt(n) (by hand on 16 values); the old names t and cantelli still work, with a warning; below
    ``CERTIFICATE_MIN_PROMPTS`` values they abstain (nan) and say why in one line; the default is the betting bound,
    the trainer's and the simulator's; rows of a 2-D array are bounded one by one; bad levels and methods are
    refused."""
    x = np.linspace(-0.3, 0.6, 16)
    se = x.std(ddof=1) / 4
    assert ge.lower_confidence_bound(x, 0.95, method="cantelli_unguaranteed") == pytest.approx(
        x.mean() - np.sqrt(19.0) * se, abs=1e-12)
    assert ge.lower_confidence_bound(x, 0.95, method="t_unguaranteed") == pytest.approx(
        x.mean() - 1.7530503556925547 * se, abs=1e-12)
    with pytest.warns(FutureWarning, match="now called 't_unguaranteed'"):
        assert ge.lower_confidence_bound(x, 0.95, method="t") == ge.lower_confidence_bound(x, 0.95,
                                                                                           method="t_unguaranteed")
    assert ge.DEFAULT_LCB_METHOD == "betting"
    from grpo_theory.simulate import SimConfig
    from llm import GRPOConfig  # the trainer logs the default certificate

    assert GRPOConfig().improvement_lcb_method == SimConfig().improvement_lcb_method == "betting"
    with pytest.warns(FutureWarning):
        assert GRPOConfig(improvement_lcb_method="cantelli").improvement_lcb_method == "cantelli_unguaranteed"
    assert np.isnan(ge.lower_confidence_bound(x[:15], 0.95, method="t_unguaranteed"))
    assert ge.lower_confidence_bound(x[:4], 0.95, method="t_unguaranteed", min_count=2) == pytest.approx(
        x[:4].mean() - 2.353363434801823 * x[:4].std(ddof=1) / 2, abs=1e-12)
    why = ge.certificate_abstains(4, method="t_unguaranteed")
    assert "needs at least 16" in why and "\n" not in why
    assert ge.certificate_abstains(16, method="t_unguaranteed") is None
    assert ge.certificate_abstains(1) is None and ge.certificate_abstains(0) is not None  # betting: any n
    rows = np.stack([x, x + 0.3])
    assert ge.lower_confidence_bound(rows, 0.9).tolist() == pytest.approx(
        [ge.lower_confidence_bound(x, 0.9), ge.lower_confidence_bound(x + 0.3, 0.9)], abs=1e-12)
    assert ge.mean_and_standard_error([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / np.sqrt(3)), abs=1e-15)
    assert np.isnan(ge.mean_and_standard_error([0.5])[1]) and all(np.isnan(ge.mean_and_standard_error([])))
    with pytest.raises(ValueError, match="level"):
        ge.lower_confidence_bound(x, 1.0)
    with pytest.raises(ValueError, match="method"):
        ge.lower_confidence_bound(x, 0.95, method="bootstrap")


def test_the_betting_bound_refuses_values_outside_its_range_and_agrees_with_its_e_value():
    """Values outside the stated range, or nan, are refused (the guarantee needs the range); the bound is certified
    (> 0) exactly when the e-value reaches 1/(1 - level); it falls as the level rises and rises with the values; n
    values at the top of the range certify from 8 on at level 0.95 (each bet can at most multiply the capital by 1.5
    against a null at the middle of the range, and 1.5^8 > 20), and ``certificate_floor`` is the smallest common value
    that does."""
    from grpo_theory.betting import betting_lower_bound, e_value, smallest_certified_mean

    with pytest.raises(ValueError, match="outside the stated range"):
        ge.lower_confidence_bound([0.5, 1.5], 0.95)
    with pytest.raises(ValueError, match="nan"):
        ge.lower_confidence_bound([0.5, np.nan], 0.95)
    rng = np.random.default_rng(0)
    x = np.clip(rng.normal(0.1, 0.4, (500, 32)), -1, 1)
    lcb = betting_lower_bound(x, 0.95, -1, 1)
    e = e_value(x, 0.95, -1, 1)
    assert ((lcb > 0) == (e >= 20 - 1e-9)).all() and 0 < (lcb > 0).mean() < 1
    assert (betting_lower_bound(x, 0.99, -1, 1) <= lcb).all()
    assert (betting_lower_bound(np.clip(x + 0.1, -1, 1), 0.95, -1, 1) >= lcb - 1e-9).all()
    floor = ge.certificate_floor(32)
    assert betting_lower_bound(np.full(32, floor + 1e-6), 0.95, -1, 1) > 0 >= betting_lower_bound(
        np.full(32, floor - 1e-3), 0.95, -1, 1)
    assert smallest_certified_mean(7, 0.95, -1, 1) == float("inf")
    assert np.isfinite(smallest_certified_mean(8, 0.95, -1, 1))


@pytest.mark.parametrize("seed", range(4))
def test_the_capped_improvement_estimate_is_a_lower_bound_with_its_exact_bias(seed):
    """On random tables (some weights above the cap, rewards in [0, 1], lag > 0): the expectation of
    ``capped_improvement_estimate`` over y ~ alpha equals J(pi) - J(pi_k) minus sum (pi - W alpha)^+ r minus
    sum (pi_k - W alpha)^+ (1 - r), to 1e-12, so it is never above the improvement; every value lies in [-1, W - 1];
    it is 0 where pi = pi_k = alpha."""
    rng = np.random.default_rng(seed)
    n, W = 7, 2.0
    alpha, pi, pi_k = (rng.dirichlet(np.full(n, 0.6)) for _ in range(3))
    r = rng.uniform(0, 1, n)
    expectation = sum(alpha[y] * float(ge.capped_improvement_estimate(r[y:y + 1], pi[y:y + 1] / alpha[y],
                                                                      pi_k[y:y + 1] / alpha[y], W)) for y in range(n))
    improvement = float(pi @ r - pi_k @ r)
    bias = float(np.maximum(pi - W * alpha, 0) @ r + np.maximum(pi_k - W * alpha, 0) @ (1 - r))
    assert expectation == pytest.approx(improvement - bias, abs=1e-12) and bias > 0
    values = ge.capped_improvement_estimate(r[:, None], (pi / alpha)[:, None], (pi_k / alpha)[:, None], W)
    assert -1 <= values.min() and values.max() <= W - 1
    assert float(ge.capped_improvement_estimate(r, np.ones(n), np.ones(n), W)) == pytest.approx(0.0, abs=1e-15)


#: Monte-Carlo replications of the coverage tests; a rate's standard error is at most sqrt(0.05 x 0.95 / 4000) = 0.0034.
COVERAGE_REPS = 4000


@pytest.mark.slow
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_the_certificate_keeps_its_level_where_the_sample_spread_bounds_break(level):
    """The worst cases of docs/theory.md §8.6 (a rare harm at -1 that a small sample misses, a zero mean carried by a
    rarer point mass, mass at both ends, the held-out estimators on the rare-answer tables): the betting certificate
    certifies at most 1 - level of 4,000 replications plus three Monte-Carlo standard errors at 16 and 64 prompts;
    Cantelli's bound with the sample standard deviation certifies the rare harm at 16 prompts on most replications
    (the failure the betting bound replaces)."""
    from grpo_theory.certificate import FAMILIES, TABLES, false_and_power

    allowed = 1 - level
    margin = 3 * np.sqrt(allowed * level / COVERAGE_REPS)
    for family in (*FAMILIES, *TABLES):
        for P in (16, 64):
            false, _ = false_and_power(family, P, COVERAGE_REPS, level)["betting"]
            assert false.rate <= allowed + margin, (family, P, false)
    cantelli, _ = false_and_power(next(iter(FAMILIES)), 16, COVERAGE_REPS, level)["Cantelli (no guarantee)"]
    assert cantelli.rate > 0.5


def test_the_certificate_has_power_where_the_change_is_large_enough():
    """Not vacuous: at 64 prompts the betting certificate certifies most steps of the spread family at a mean of 0.2
    (its floor at 64 prompts: 0.097), far more than its false rate."""
    from grpo_theory.certificate import false_and_power

    false, power = false_and_power("spread (uniform on [-1, 1])", 64, COVERAGE_REPS)["betting"]
    assert power.rate > 0.5 and power.rate > false.rate + 3 * power.se


def test_e_bh_and_alpha_spending_by_hand_and_their_guarantees():
    """e-BH rejects the k* largest e-values, k* = max{k : e_(k) >= n / ((1 - level) k)}; alpha-spending rejects the
    j-th when it reaches 1 / ((1 - level) 6 / (pi^2 j^2)); on 2,000 runs of 50 null steps (e-values of null data) the
    share of runs with any rejection is at most 1 - level for both (all nulls: e-BH's false discovery rate is that
    share), plus three Monte-Carlo standard errors."""
    from grpo_theory.betting import alpha_spending, e_bh, e_value, spent_level

    assert e_bh([30, 1, 25, 0.5, 100], 0.95).tolist() == [False, False, False, False, True]
    assert e_bh([300, 200, 90, 1], 0.95).tolist() == [True, True, True, False]  # 90 >= 4/(0.05 x 3) = 26.7
    assert spent_level(0.95, 1) == pytest.approx(1 - 0.05 * 6 / np.pi**2)
    assert alpha_spending([33.0, 33.0], 0.95).tolist() == [True, False]  # thresholds 32.9 and 131.6
    rng = np.random.default_rng(3)
    x = np.where(rng.random((2000, 50, 16)) < 0.3, -1.0, 3 / 7)  # mean exactly 0 per prompt: every step null
    e = e_value(x, 0.95, -1, 1)
    margin = 3 * np.sqrt(0.05 * 0.95 / 2000)
    assert np.mean([e_bh(run, 0.95).any() for run in e]) <= 0.05 + margin
    assert np.mean([alpha_spending(run, 0.95).any() for run in e]) <= 0.05 + margin

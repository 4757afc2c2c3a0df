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


def test_the_lower_confidence_bound_by_hand_and_its_abstention():
    """``lower_confidence_bound``: cantelli is mean - sqrt(level/(1 - level)) sd/sqrt(n), t is mean - t_{n-1}(level)
    sd/sqrt(n) (by hand on 16 values); below ``CERTIFICATE_MIN_PROMPTS`` values it abstains (nan) and says why in one
    line; rows of a 2-D array are bounded one by one; bad levels and methods are refused."""
    x = np.linspace(-0.3, 0.6, 16)
    se = x.std(ddof=1) / 4
    assert ge.lower_confidence_bound(x, 0.95) == pytest.approx(x.mean() - np.sqrt(19.0) * se, abs=1e-12)
    assert ge.lower_confidence_bound(x, 0.95, method="t") == pytest.approx(x.mean() - 1.7530503556925547 * se,
                                                                          abs=1e-12)
    assert ge.CERTIFICATE_MIN_PROMPTS == 16 and ge.DEFAULT_LCB_METHOD == "cantelli"
    from llm import GRPOConfig  # the trainer logs the default certificate
    assert GRPOConfig().improvement_lcb_method == ge.DEFAULT_LCB_METHOD
    assert np.isnan(ge.lower_confidence_bound(x[:15], 0.95)) and np.isnan(ge.lower_confidence_bound([0.3], 0.95))
    assert ge.lower_confidence_bound(x[:4], 0.95, method="t", min_count=2) == pytest.approx(
        x[:4].mean() - 2.353363434801823 * x[:4].std(ddof=1) / 2, abs=1e-12)
    why = ge.certificate_abstains(4)
    assert "needs at least 16" in why and "\n" not in why and ge.certificate_abstains(16) is None
    rows = np.stack([x, x + 1.0])
    assert ge.lower_confidence_bound(rows, 0.9).tolist() == pytest.approx(
        [ge.lower_confidence_bound(x, 0.9), ge.lower_confidence_bound(x + 1.0, 0.9)], abs=1e-12)
    assert ge.mean_and_standard_error([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / np.sqrt(3)), abs=1e-15)
    assert np.isnan(ge.mean_and_standard_error([0.5])[1]) and all(np.isnan(ge.mean_and_standard_error([])))
    with pytest.raises(ValueError, match="level"):
        ge.lower_confidence_bound(x, 1.0)
    with pytest.raises(ValueError, match="method"):
        ge.lower_confidence_bound(x, 0.95, method="bootstrap")


#: Monte-Carlo replications of the coverage tests; a rate's standard error is at most sqrt(0.05 x 0.95 / 4000) = 0.0034.
COVERAGE_REPS = 4000


@pytest.mark.parametrize("P", [16, 32])
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_the_certificate_keeps_its_level_on_left_skewed_estimates(P, level):
    """On the table where an update moves probability off a rarely sampled correct answer (J changes by -0.0125;
    the per-prompt held-out estimates are mostly slightly positive, negative on 21% of prompts), the certificate
    certifies at most 1 - level of 4,000 replications, plus three Monte-Carlo standard errors. The t bound on the
    same estimates certified 37% at 4 prompts and 15% at 8 (level 0.95), which is why the certificate abstains there."""
    from grpo_theory.certificate import RARE_LOSS, Rate, certified

    assert RARE_LOSS.change < 0
    x = RARE_LOSS.estimates(np.random.default_rng([P, int(level * 100)]), (COVERAGE_REPS, P))
    rate = Rate.of(certified(x, level))  # the certificate the trainer logs, its defaults
    allowed = 1 - level
    margin = 3 * np.sqrt(allowed * level / COVERAGE_REPS)
    assert rate.rate <= allowed + margin, rate
    small = RARE_LOSS.estimates(np.random.default_rng(1), (COVERAGE_REPS, 8))
    assert Rate.of(certified(small, level, "t", 2)).rate > allowed + margin  # why it abstains below 16
    assert not certified(small, level).any()


def test_the_certificate_keeps_its_level_on_every_family_of_the_coverage_table():
    """Every shape of docs/theory.md §8.6's table (symmetric, left- and right-skewed, heavy-tailed; 4,000
    replications at 16 and 32 prompts, level 0.95): the false-certificate rate at most 5% plus three Monte-Carlo
    standard errors, and some power where the change is positive (so the bound is not vacuous)."""
    from grpo_theory.certificate import FAMILIES, false_and_power

    for family in FAMILIES:
        for P in (16, 32):
            false, power = false_and_power(family, P, COVERAGE_REPS)
            assert false.rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / COVERAGE_REPS), (family, P, false)
            assert power.rate > false.rate + 3 * power.se, (family, P, false, power)

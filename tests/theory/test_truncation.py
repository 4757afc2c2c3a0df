"""Truncated sampling as a policy (grpo_theory.truncation): the kept set against a literal reading of vLLM's three
filters, and why the importance weight must be the ratio of the filtered distributions: with it the estimates of TV
and of the improvement are their exact values; with the full-softmax pi (TRL's ratio under top-p) they are not."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import grpo_theory as gt
from grpo_theory.estimators import improvement_estimate, tv_estimate
from grpo_theory.truncation import NO_FILTER, TokenFilter, filtered_log_softmax, filtered_policy, kept_mask

filters = st.builds(TokenFilter, top_k=st.sampled_from([0, 1, 2, 3, 5]), top_p=st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.1]),
                    min_p=st.sampled_from([0.0, 0.05, 0.2]))
logits = st.integers(2, 9).flatmap(lambda n: st.lists(st.floats(-4, 4), min_size=n, max_size=n)).map(np.asarray)


def literal_kept(z: np.ndarray, f: TokenFilter) -> np.ndarray:
    """The kept set read off vLLM's steps one by one, with Python loops: min-p on the softmax, then the top-k values
    (ties with the k-th kept), then top-p by position: walking the survivors in ascending order (ties by column), a
    position is dropped while the renormalised mass up to and including it is at most 1 - top_p, never the last."""
    keep = np.ones(len(z), bool)
    p = np.exp(z - z.max())
    p /= p.sum()
    if f.min_p > 0:
        keep &= p >= f.min_p * p.max()
    if f.top_k > 0:
        kth = sorted(z[keep], reverse=True)[min(f.top_k, keep.sum()) - 1]
        keep &= z >= kth
    if f.top_p < 1:
        order = [int(i) for i in np.argsort(z, kind="stable") if keep[i]]
        q = np.exp(z[order] - z[order].max())
        q /= q.sum()
        total = 0.0
        for pos, i in enumerate(order[:-1]):
            total += q[pos]
            if total > 1.0 - f.top_p:
                break
            keep[i] = False
    return keep


@given(logits, filters)
@example(np.array([1.0, 1.0, 0.0]), TokenFilter(top_k=1))  # a tie at the k-th value: both kept
@example(np.array([3.0, 0.0, -1.0]), TokenFilter(top_p=0.1))  # the top token alone
@example(np.array([0.0, 0.0, 0.0, 0.0]), TokenFilter(top_p=0.5))  # a tie split by top-p: the last two columns kept
def test_the_kept_set_is_vllms_three_filters_in_order(z, f):
    assert np.array_equal(kept_mask(z, f), literal_kept(z, f))


def test_top_p_splits_a_tie_by_position_as_the_samplers_do():
    """Four equal logits at top-p 0.5: the cumulative sums are 0.25, 0.5, 0.75, 1; vLLM and transformers drop the
    positions with sum <= 0.5, so two of the four tied tokens are kept (the project keeps the higher columns), and the
    filtered log-probability of a kept one is log(1/2), not log(1/4)."""
    z = np.zeros(4)
    f = TokenFilter(top_p=0.5)
    assert kept_mask(z, f).tolist() == [False, False, True, True]
    assert filtered_log_softmax(z, f)[2:] == pytest.approx(np.log([0.5, 0.5]))


@given(logits, filters, st.sampled_from([0.5, 1.0, 1.7]))
def test_the_filtered_policy_is_the_renormalised_softmax_on_the_kept_set(z, f, temperature):
    pi = filtered_policy(z, temperature, f)
    kept = literal_kept(z / temperature, f)
    full = gt.softmax(z / temperature)
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(pi[~kept] == 0) and np.allclose(pi[kept], full[kept] / full[kept].sum(), rtol=1e-12)
    assert np.all(np.isneginf(filtered_log_softmax(z / temperature, f)[~kept]))


def test_no_filter_is_the_plain_softmax():
    z = np.random.default_rng(0).normal(size=(4, 7))
    assert np.allclose(filtered_policy(z, 0.8, NO_FILTER), gt.softmax(z / 0.8), rtol=1e-14)
    assert not NO_FILTER.active and TokenFilter(top_p=0.9).active


@pytest.mark.parametrize("bad", [dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0), dict(min_p=-0.1)])
def test_bad_filters_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=f"^{next(iter(bad))}: "):
        TokenFilter(**bad)


def _case(seed: int, f: TokenFilter, nested: bool = False):
    """alpha, pi_k, pi_new: the filtered distributions of three nearby logit vectors over 12 responses (a one-token
    'language model'), the full softmax of pi_k's and pi_new's logits, and a reward per response. ``nested``: pi_k's and
    pi_new's logits are raised by 3 on alpha's kept set, so their own kept sets lie inside it (their full softmax still
    has mass outside)."""
    rng = np.random.default_rng(seed)
    z_alpha = rng.normal(scale=1.0, size=12)
    z_k = z_alpha + rng.normal(scale=0.5, size=12)
    z_new = z_k + rng.normal(scale=0.5, size=12)
    if nested:
        kept = filtered_policy(z_alpha, 1.0, f) > 0
        z_k, z_new = z_k + 2.0 * kept, z_new + 2.0 * kept
    r = rng.integers(0, 2, size=12).astype(float)
    return [filtered_policy(z, 1.0, f) for z in (z_alpha, z_k, z_new)], [gt.softmax(z) for z in (z_k, z_new)], r


def _expected_estimates(alpha, pi_k, pi_new, r):
    """The exact expectations over y ~ alpha of the per-response TV and improvement estimates (the improvement's
    baseline at its expectation J(alpha)), with w = pi/alpha on alpha's support."""
    on = alpha > 0
    w_k, w_new = (np.where(on, p / np.where(on, alpha, 1.0), 0.0) for p in (pi_k, pi_new))
    tv = float(np.sum(alpha * np.maximum(1 - w_k, 0)))
    gain = float(np.sum(alpha * (w_new - w_k) * (r - gt.expected_reward(alpha, r))))
    return tv, gain


FILTERS = [TokenFilter(top_p=0.8), TokenFilter(top_k=4), TokenFilter(top_p=0.9, top_k=6, min_p=0.02)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("f", FILTERS)
def test_filtered_weights_give_the_exact_tv_and_the_full_softmax_ratio_does_not(seed, f):
    """E_alpha[(1 - w)^+] with w = pi_k/alpha of the filtered pi_k is TV(pi_k, alpha) to 1e-12, whatever the two kept
    sets (mass pi_k puts where alpha cannot sample counts through (1 - w)^+ on alpha's side). With the full-softmax
    pi_k in the numerator (a trainer that ignores the sampler's filter, TRL's ratio under top-p) it is not: the
    expectation misses the filtered TV by more than 1e-3."""
    (alpha, pi_k, pi_new), (full_k, full_new), r = _case(seed, f)
    tv, _ = _expected_estimates(alpha, pi_k, pi_new, r)
    assert tv == pytest.approx(float(gt.tv_distance(pi_k, alpha)), abs=1e-12)
    tv_full, _ = _expected_estimates(alpha, full_k, full_new, r)
    assert abs(tv_full - float(gt.tv_distance(pi_k, alpha))) > 1e-3, (tv_full, gt.tv_distance(pi_k, alpha))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("f", FILTERS)
def test_the_improvement_estimate_is_exact_where_alpha_can_sample_what_pi_can(seed, f):
    """The improvement estimate's expectation is sum over alpha's kept set of (pi_new - pi_k)(r - J(alpha)): the
    exact J(pi_new) - J(pi_k) of the filtered policies when their kept sets lie inside alpha's (to 1e-12), and off
    by exactly the mass outside it otherwise (importance sampling sees nothing alpha cannot draw)."""
    for nested in (True, False):
        (alpha, pi_k, pi_new), _, r = _case(seed, f, nested)
        exact = float(gt.expected_reward(pi_new, r) - gt.expected_reward(pi_k, r))
        off = alpha == 0
        missed = float(np.sum(((pi_new - pi_k) * (r - gt.expected_reward(alpha, r)))[off]))
        _, gain = _expected_estimates(alpha, pi_k, pi_new, r)
        assert gain == pytest.approx(exact - missed, abs=1e-12)
        if nested:
            assert np.all(pi_k[off] == 0) and np.all(pi_new[off] == 0) and gain == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("f", FILTERS)
def test_the_full_softmax_ratio_misses_the_improvement_where_the_kept_sets_nest(f):
    """Where the filtered estimate is exact (kept sets nested), the full-softmax pi in the numerator is not: over
    five cases its expectation misses J(pi_new) - J(pi_k) by more than 1e-3 on average (a single case can miss by
    little when the mass it wrongly counts has rewards near J(alpha))."""
    misses = []
    for seed in range(5):
        (alpha, pi_k, pi_new), (full_k, full_new), r = _case(seed, f, nested=True)
        exact = float(gt.expected_reward(pi_new, r) - gt.expected_reward(pi_k, r))
        misses.append(abs(_expected_estimates(alpha, full_k, full_new, r)[1] - exact))
    assert np.mean(misses) > 1e-3, misses


def test_the_estimators_on_samples_of_the_filtered_alpha_average_to_the_exact_values():
    """Monte Carlo with the estimators themselves: 4,000 groups of G = 8 responses drawn from alpha (top-p 0.8):
    the mean TV and improvement estimates with filtered weights lie within 4 standard errors of the exact values."""
    (alpha, pi_k, pi_new), _, r = _case(0, TokenFilter(top_p=0.8), nested=True)
    rng = np.random.default_rng(1)
    y = rng.choice(len(alpha), p=alpha, size=(4000, 8))
    w_k, w_new = pi_k[y] / alpha[y], pi_new[y] / alpha[y]
    for est, exact in ((tv_estimate(w_k), gt.tv_distance(pi_k, alpha)),
                       (improvement_estimate(r[y], w_new, w_k), gt.expected_reward(pi_new, r) - gt.expected_reward(pi_k, r))):
        assert abs(est.mean() - exact) <= 4 * est.std(ddof=1) / np.sqrt(len(est)), (est.mean(), exact)

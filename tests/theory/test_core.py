"""grpo_theory.core: TV, KL, advantages, the clipped objective, validation."""

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from grpo_theory import (
    bernoulli_penalty_weight,
    clip_objective,
    clipped_surrogate,
    expected_reward,
    group_advantages,
    improvement_lower_bound,
    kl_divergence,
    penalty_weight,
    reward_std,
    surrogate,
    tv_distance,
    whitened_advantage,
)
from tests.strategies import bandits, n_actions, policies

ATOL = 1e-12


@st.composite
def pairs(draw):
    n = draw(n_actions)
    return draw(policies(n)), draw(policies(n))


@given(pairs())
@example((np.array([1.0, 0.0]), np.array([0.0, 1.0])))
@example((np.array([0.5, 0.5]), np.array([0.5, 0.5])))
def test_tv_symmetric_and_in_unit_interval(pq):
    p, q = pq
    assert tv_distance(p, q) == pytest.approx(tv_distance(q, p), abs=ATOL)
    assert -ATOL <= tv_distance(p, q) <= 1 + ATOL


@given(pairs())
def test_pinsker(pq):
    p, q = pq
    assert tv_distance(p, q) <= np.sqrt(kl_divergence(p, q) / 2) + 1e-9


def test_tv_is_half_l1():
    assert tv_distance([1.0, 0.0], [0.0, 1.0]) == 1.0
    assert tv_distance([0.5, 0.5, 0.0], [0.0, 0.5, 0.5]) == 0.5


def test_kl_conventions():
    assert kl_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(np.log(2))
    assert kl_divergence([0.5, 0.5], [1.0, 0.0]) == np.inf
    assert kl_divergence([0.2, 0.8], [0.2, 0.8]) == 0.0


@given(bandits())
def test_advantage_zero_mean_under_alpha(case):
    _, _, alpha, r, eps = case
    a = whitened_advantage(alpha, r, eps)
    scale = max(1.0, np.max(np.abs(a)))
    assert abs(np.sum(alpha * a)) <= 1e-12 * scale


@given(bandits())
def test_advantage_unit_variance_when_eps_zero(case):
    _, _, alpha, r, _ = case
    assume(reward_std(alpha, r) >= 1e-4)
    a = whitened_advantage(alpha, r, 0.0)
    assert np.sum(alpha * a**2) == pytest.approx(1.0, abs=1e-9)


def test_zero_variance_gives_zero_advantage_not_nan():
    a = whitened_advantage([0.3, 0.7], [1.0, 1.0], 0.0)
    assert np.array_equal(a, [0.0, 0.0])


@given(bandits(), st.floats(0.0, 1.0))
def test_clipped_surrogate_at_most_unclipped(case, clip):
    pi, pi_k, alpha, r, eps = case
    c = clipped_surrogate(pi, pi_k, alpha, r, eps, clip)
    u = surrogate(pi, alpha, r, eps)
    scale = max(1.0, np.max(np.abs(whitened_advantage(alpha, r, eps))))
    assert c <= u + 1e-12 * scale


@given(bandits(), st.floats(0.05, 1.0), st.floats(0.0, 0.99))
@example((np.full(3, 1 / 3), np.array([4.90235613e-01, 5.09764380e-01, 7.12437267e-09]),
          np.exp(30 * np.array([0.0, 0.359375, -1.46875])) / np.exp(30 * np.array([0.0, 0.359375, -1.46875])).sum(),
          np.zeros(3), 0.0), 0.5, 0.75)  # alpha_3 ~ 1.5e-24: float64 cannot resolve the window there (CI, stop 44)
def test_clipped_equals_unclipped_inside_clip_range(case, clip, frac):
    """If every ratio pi/alpha is within clip of pi_k/alpha, clipping changes nothing. pi is built inside the window:
    pi = pi_k + t alpha z with sum(alpha z) = 0 and |z| <= 2, so pi/alpha - pi_k/alpha = t z, with t at most
    frac clip / 2 and small enough that pi >= 0 (every generated case is one of this property's). Where alpha is so
    small that pi_k/alpha exceeds 1e12, float64 cannot resolve a change of clip in the ratio (pi itself rounds by more
    than t alpha z): the window is checked on the other actions, and those actions weigh alpha * ratio * A, at
    rounding level, in both surrogates."""
    _, pi_k, alpha, r, eps = case
    signs = np.where(np.arange(len(alpha)) % 2 == 0, 1.0, -1.0)
    z = signs - alpha @ signs
    shrink = np.where(alpha * z < 0, pi_k / np.where(alpha * z < 0, -alpha * z, 1.0), np.inf)
    t = min(frac * clip / 2, float(shrink.min()))
    pi = pi_k + t * alpha * z
    ratio, ratio_k = pi / np.where(alpha > 0, alpha, 1.0), pi_k / np.where(alpha > 0, alpha, 1.0)
    resolved = (alpha > 0) & (ratio_k < 1e12)
    assert np.all(np.abs(ratio - ratio_k)[resolved] <= clip + 1e-12) and np.all(pi >= -1e-15)
    scale = max(1.0, np.max(np.abs(whitened_advantage(alpha, r, eps))))
    assert clipped_surrogate(np.clip(pi, 0, None), pi_k, alpha, r, eps, clip) == pytest.approx(
        surrogate(np.clip(pi, 0, None), alpha, r, eps), abs=1e-12 * scale)


def test_clip_objective_with_unit_reference_is_ppo():
    rng = np.random.default_rng(0)
    ratio, adv = rng.uniform(0, 3, 1000), rng.normal(size=1000)
    ppo = np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)
    assert np.array_equal(clip_objective(ratio, np.ones(1000), adv, 0.2), ppo)


def test_clip_objective_moves_window_with_reference():
    # r' = 2, clip 0.2: the ratio may move within [1.8, 2.2]; positive advantage caps at 2.2.
    assert clip_objective(3.0, 2.0, 1.0, 0.2) == pytest.approx(2.2)
    assert clip_objective(1.0, 2.0, -1.0, 0.2) == pytest.approx(-1.8)
    assert clip_objective(0.05, 0.1, 1.0, 0.2) == pytest.approx(0.05)  # lower edge max(r'-clip, 0)


def test_bernoulli_penalty_weight_values():
    assert bernoulli_penalty_weight(0.5, 0.0) == pytest.approx(1.0)  # s = 1/2
    assert bernoulli_penalty_weight(0.0, 0.0) == np.inf
    assert bernoulli_penalty_weight(1.0, 0.25) == pytest.approx(1.0)  # s = 1/2
    p = np.linspace(0, 1, 101)
    assert np.all(bernoulli_penalty_weight(p, 0.01) <= (1 - 0.1) / 0.1 + 1e-12)
    assert np.array_equal(bernoulli_penalty_weight(p, 0.01), penalty_weight(np.sqrt(p * (1 - p)), 0.01))


class TestGroupAdvantages:
    def test_unbiased_variance(self):
        r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
        expected = (r - 0.6) / np.sqrt(np.var(r, ddof=1) + 1e-4)
        assert np.allclose(group_advantages(r, 1e-4), expected, atol=1e-15)

    def test_zero_std_groups_are_exact_zeros(self):
        r = np.array([[0.3, 0.3, 0.3], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
        a = group_advantages(r, 0.0)
        assert np.array_equal(a[:2], np.zeros((2, 3)))
        assert np.all(np.isfinite(a)) and a[2, 1] > 0

    def test_no_scaling_is_centring(self):
        r = np.array([[1.0, 0.0, 0.0, 0.0]])
        assert np.allclose(group_advantages(r, 0.1, scale=False), [[0.75, -0.25, -0.25, -0.25]])

    @given(st.lists(st.floats(0, 1), min_size=2, max_size=16))
    def test_zero_mean(self, r):
        assert abs(np.sum(group_advantages(np.array(r), 1e-6))) < 1e-9 * len(r)

    def test_needs_two_samples(self):
        with pytest.raises(ValueError, match="G >= 2"):
            group_advantages(np.array([1.0]), 0.0)


class TestValidation:
    def test_probabilities_must_sum_to_one(self):
        with pytest.raises(ValueError, match="pi: probabilities must sum to 1"):
            expected_reward([0.5, 0.6], [1.0, 0.0])

    def test_negative_probabilities(self):
        with pytest.raises(ValueError, match="alpha: contains negative"):
            surrogate([0.5, 0.5], [1.2, -0.2], [1.0, 0.0], 0.1)

    def test_rewards_in_unit_interval_for_bound(self):
        with pytest.raises(ValueError, match="r: rewards must lie in"):
            improvement_lower_bound([0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [2.0, 0.0], 0.1)

    @pytest.mark.parametrize("eps", [-0.1, 0.8, np.nan])
    def test_eps_range(self, eps):
        with pytest.raises(ValueError, match="eps: must lie in"):
            improvement_lower_bound([0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0], eps)

    def test_mismatched_actions(self):
        with pytest.raises(ValueError, match="mismatched numbers of actions"):
            tv_distance([0.5, 0.5], [0.2, 0.3, 0.5])

    def test_shapes_that_do_not_broadcast(self):
        with pytest.raises(ValueError, match="do not broadcast"):
            tv_distance(np.full((2, 2), 0.5), np.full((3, 2), 0.5))

    def test_clipped_needs_alpha_coverage(self):
        with pytest.raises(ValueError, match="alpha: must be positive"):
            clipped_surrogate([0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [1.0, 0.0], 0.1, 0.2)


def test_batch_scaling_centres_per_group_and_scales_by_the_whole_batch():
    """TRL's scale_rewards="batch": (r - group mean) / sqrt(var of every reward + eps); all-equal groups stay 0."""
    r = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    got = group_advantages(r, 1e-4, scale="batch")
    want = (r - r.mean(axis=1, keepdims=True)) / np.sqrt(r.var(ddof=1) + 1e-4)
    want[1] = 0.0
    assert np.allclose(got, want, atol=1e-15)
    assert np.array_equal(group_advantages(r, 1e-4, scale="group"), group_advantages(r, 1e-4, scale=True))
    with pytest.raises(ValueError, match="^scale: "):
        group_advantages(r, 1e-4, scale="rows")

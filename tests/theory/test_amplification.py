"""Success amplification (grpo_theory.amplification): the recursion, its fixed points, the closed form."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from grpo_theory import (
    closed_form_iterates,
    expected_reward,
    local_convergence_beta,
    mirror_success_iterates,
    success_fixed_point,
    success_fixed_points,
    success_iterates,
    success_map,
    success_map_derivative,
)
from tests.strategies import policies

p_refs = st.floats(0.01, 0.99)


betas = st.floats(0.05, 5.0)


epss = st.floats(1e-4, 0.75)


@given(p_refs, betas, epss)
def test_every_iterate_exceeds_p_ref(p_ref, beta, eps):
    it = success_iterates(p_ref, beta, eps, 30)
    assert np.all(it[1:] > p_ref)


@given(p_refs, betas, epss)
def test_fixed_point_is_a_fixed_point_above_p_ref(p_ref, beta, eps):
    p_star = success_fixed_point(p_ref, beta, eps)
    assert p_star > p_ref
    assert success_map(p_star, p_ref, beta, eps) == pytest.approx(p_star, abs=1e-12)


@given(st.floats(0.5, 0.99), betas, epss)
def test_iteration_converges_where_locally_stable(p_ref, beta, eps):
    """p_ref >= 1/2: h is increasing on [p_ref, 1], so iterates rise monotonically to p*."""
    p_star = float(success_fixed_point(p_ref, beta, eps))
    assume(beta > local_convergence_beta(p_star, eps) * 1.5)
    it = success_iterates(p_ref, beta, eps, 300)
    assert it[-1] == pytest.approx(p_star, abs=1e-8)
    assert np.all(np.diff(it) >= -1e-15)


def test_local_convergence_threshold_is_where_slope_is_one():
    p_star, eps = 0.9, 0.01
    beta = float(local_convergence_beta(p_star, eps))
    # h'(p*) evaluated with the h(1 - h) = p*(1 - p*) substitution equals 1 at that beta.
    s = np.sqrt(p_star * (1 - p_star) + eps)
    assert p_star * (1 - p_star) * (2 * p_star - 1) / (2 * beta * s**3) == pytest.approx(1.0)
    assert success_map_derivative(0.3, 0.2, 1.0, 0.1) < 0 < success_map_derivative(0.7, 0.2, 1.0, 0.1)


def test_fixed_points_need_not_be_unique():
    # A small search finds a setting with several fixed points (beta small, p_ref small).
    found = [(pr, b) for pr in np.linspace(0.01, 0.3, 15) for b in np.linspace(0.05, 0.5, 15)
             if len(success_fixed_points(pr, b, 1e-3)) > 1]
    assert found, "expected at least one (p_ref, beta) with several fixed points"


@st.composite
def bernoulli_bandits(draw):
    n = draw(st.integers(2, 8))
    pi_ref = draw(policies(n))
    wins = draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(lambda w: 0 < sum(w) < len(w)))
    return pi_ref, np.array(wins, dtype=float)


@given(bernoulli_bandits(), betas, epss)
def test_closed_form_policy_reproduces_recursion(bandit, beta, eps):
    pi_ref, r = bandit
    p_ref = expected_reward(pi_ref, r)
    assume(1e-6 < p_ref < 1 - 1e-6)
    policies_n = closed_form_iterates(pi_ref, r, beta, eps, 10)
    p_policy = expected_reward(policies_n, r)
    p_rec = success_iterates(p_ref, beta, eps, 10)
    # the two agree up to rounding, which the map amplifies by |h'(p)| at each step (beta = 4, eps = 1e-4 took an
    # iterate from 0.99 to 0.0015 and back: 2e-10 apart at step 9 with every step's own rounding near 1e-16)
    gain = np.maximum(1.0, np.abs(success_map_derivative(p_rec[:-1], p_ref, beta, eps)))
    allowed = 1e-12 * np.concatenate([[1.0], np.cumprod(gain)]) * np.arange(1, len(p_rec) + 1)
    assert np.all(np.abs(p_policy - p_rec) <= allowed), (np.abs(p_policy - p_rec), allowed)


@given(p_refs, betas, epss)
def test_mirror_iterates_increase(p_ref, beta, eps):
    it = mirror_success_iterates(p_ref, beta, eps, 10)
    assert np.all(np.diff(it) >= 0)


@pytest.mark.parametrize("bad", [dict(p_ref=0.0), dict(beta=-1.0), dict(eps=0.0)])
def test_bad_arguments_named(bad):
    args = dict(p_ref=0.3, beta=0.5, eps=0.1) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        success_map(0.5, **args)

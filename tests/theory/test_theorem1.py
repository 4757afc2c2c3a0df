"""Theorem 1 and the tight bound, never violated, attained where claimed; the bound-check command."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from grpo_theory import (
    bound_terms,
    expected_reward,
    improvement_lower_bound,
    reward_std,
    surrogate,
)
from grpo_theory.check import CheckConfig, run_check
from grpo_theory.numerics import rounding_tolerance
from tests.strategies import bandits

#: Equality cases must hold to this absolute tolerance.
EQUALITY_ATOL = 1e-12


ONE_HOT = np.array([1.0, 0.0, 0.0])


UNIFORM = np.full(3, 1 / 3)


SKEWED = np.array([0.7, 0.2, 0.1])


def _holds(pi, pi_k, alpha, r, eps, tight):
    terms = bound_terms(pi, pi_k, alpha, r, eps, tight=tight)
    improvement = expected_reward(pi, r) - expected_reward(pi_k, r)
    if np.isneginf(terms.lower):  # only sigma_alpha = 0 with eps = 0 makes the bound vacuous
        assert eps == 0 and reward_std(alpha, r) == 0, terms
        return
    tol = rounding_tolerance(alpha, r, eps, terms, tight)
    assert np.isfinite(tol), (tol, terms)  # a finite bound is checked with a finite allowance
    assert improvement >= terms.lower - tol, (improvement, terms)


@given(bandits())
@example((SKEWED, UNIFORM, ONE_HOT, np.array([1.0, 0.0, 0.0]), 0.0))  # deterministic alpha, zero variance
@example((UNIFORM, UNIFORM, UNIFORM, np.array([0.5, 0.5, 0.5]), 0.0))  # zero-variance rewards
@example((ONE_HOT, SKEWED, UNIFORM, np.array([1.0, 0.0, 1.0]), 1e-12))  # eps -> 0
@example((ONE_HOT, UNIFORM, SKEWED, np.array([0.0, 1.0, 0.3]), 0.75))  # largest eps
def test_theorem1_paper_constant_never_violated(case):
    _holds(*case, tight=False)


@given(bandits())
@example((SKEWED, UNIFORM, ONE_HOT, np.array([1.0, 0.0, 0.0]), 0.0))
@example((UNIFORM, UNIFORM, UNIFORM, np.array([0.5, 0.5, 0.5]), 0.0))
@example((ONE_HOT, SKEWED, UNIFORM, np.array([1.0, 0.0, 1.0]), 1e-12))
def test_tight_bound_never_violated(case):
    _holds(*case, tight=True)


@given(bandits())
def test_corollary1_on_policy(case):
    """alpha = pi_k: the lag term vanishes and J(pi) - J(pi_k) >= L - 2 (1-s)/s TV(pi, pi_k)."""
    pi, pi_k, _, r, eps = case
    terms = bound_terms(pi, pi_k, pi_k, r, eps)
    assert terms.penalty_lag == 0.0
    _holds(pi, pi_k, pi_k, r, eps, tight=False)


@given(bandits())
def test_tight_bound_is_at_least_paper_bound(case):
    pi, pi_k, alpha, r, eps = case
    paper = improvement_lower_bound(pi, pi_k, alpha, r, eps)
    tight = improvement_lower_bound(pi, pi_k, alpha, r, eps, tight=True)
    assert tight >= paper or (np.isinf(paper) and paper < 0)


@given(st.floats(0.01, 0.98), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 0.75))
@example(0.5, 0.6, 0.9, 0.0)
def test_tight_bound_equality_two_armed_bernoulli(a1, u, w, eps):
    """Two arms, r = (0, 1): with pi and pi_k both moving mass onto the rewarded arm, every
    inequality in the proof is an equality, so the tight bound equals the improvement."""
    pk1 = a1 + u * (1 - a1)
    p1 = a1 + w * (1 - a1)
    alpha, pi_k, pi = (np.array([1 - x, x]) for x in (a1, pk1, p1))
    r = np.array([0.0, 1.0])
    improvement = expected_reward(pi, r) - expected_reward(pi_k, r)
    bound = improvement_lower_bound(pi, pi_k, alpha, r, eps, tight=True)
    assert abs(bound - improvement) <= EQUALITY_ATOL


def test_tight_equality_hand_built():
    alpha, pi_k, pi = np.array([0.7, 0.3]), np.array([0.6, 0.4]), np.array([0.2, 0.8])
    r = np.array([0.0, 1.0])
    terms = bound_terms(pi, pi_k, alpha, r, 0.1, tight=True)
    s = np.sqrt(0.21 + 0.1)
    assert terms.surrogate == pytest.approx(0.5 / s, abs=EQUALITY_ATOL)
    assert terms.penalty_tv == pytest.approx((1 - s) / s * 0.5, abs=EQUALITY_ATOL)
    assert terms.penalty_lag == pytest.approx(0.1, abs=EQUALITY_ATOL)
    assert terms.lower == pytest.approx(0.4, abs=EQUALITY_ATOL)  # = J(pi) - J(pi_k)


@given(bandits())
def test_surrogate_identity(case):
    """sigma_{alpha,eps} L_alpha(pi) = J(pi) - J(alpha) whenever sigma_{alpha,eps} > 0."""
    pi, _, alpha, r, eps = case
    s = np.sqrt(reward_std(alpha, r) ** 2 + eps)
    assume(s >= 1e-6)
    lhs = s * surrogate(pi, alpha, r, eps)
    rhs = expected_reward(pi, r) - expected_reward(alpha, r)
    assert lhs == pytest.approx(rhs, abs=1e-12)


@given(bandits())
def test_bound_terms_are_the_penalties_of_theorem1(case):
    """Each penalty is its formula, written out here from the definitions: c (1 - s)/s TV(pi, alpha) and
    c TV(pi_k, alpha), with c = 2 (paper) or the reward range max r - min r (tight); both non-negative."""
    pi, pi_k, alpha, r, eps = case
    s = np.sqrt(np.sum(alpha * (r - np.sum(alpha * r)) ** 2) + eps)
    assume(s >= 1e-6)
    for tight, c in ((False, 2.0), (True, float(np.ptp(r)))):
        t = bound_terms(pi, pi_k, alpha, r, eps, tight=tight)
        assert t.penalty_tv >= 0 and t.penalty_lag >= 0
        assert t.penalty_lag == pytest.approx(c * 0.5 * np.abs(pi_k - alpha).sum(), abs=1e-13)
        assert t.penalty_tv == pytest.approx(c * (1 - s) / s * 0.5 * np.abs(pi - alpha).sum(), rel=1e-9, abs=1e-12)


def test_batched_matches_loop():
    rng = np.random.default_rng(1)
    from grpo_theory.instances import random_instances

    inst = random_instances(rng, 50, 4)
    batched = bound_terms(inst.pi, inst.pi_k, inst.alpha, inst.r, inst.eps)
    for i in range(50):
        one = bound_terms(inst.pi[i], inst.pi_k[i], inst.alpha[i], inst.r[i], inst.eps[i])
        for a, b in zip(batched, one):
            assert a[i] == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_bound_check_finds_no_violation():
    res = run_check(CheckConfig(n=20_000, seed=7))
    for row in res.rows.values():
        assert row["violations"] == 0
    # The tight constant is informative far more often than the paper's.
    assert res.rows["tight"]["frac_positive"] > res.rows["paper"]["frac_positive"] > 0


def test_bound_check_detects_a_wrong_bound(monkeypatch):
    """The check can fail: dropping the lag penalty (an on-policy bound used off-policy) is caught."""
    import grpo_theory.check as check
    from grpo_theory import core

    def no_lag(pi, pi_k, alpha, r, eps, tight=False):
        t = core.bound_terms(pi, pi_k, alpha, r, eps, tight=tight)
        return core.BoundTerms(t.surrogate, t.penalty_tv, 0 * t.penalty_lag, t.surrogate - t.penalty_tv)

    monkeypatch.setattr(check, "bound_terms", no_lag)
    res = check.run_check(CheckConfig(n=5_000, seed=0))
    assert res.rows["tight"]["violations"] > 0


PY = sys.executable


def test_theory_cli_error_is_one_line():
    res = subprocess.run([PY, "-m", "grpo_theory.check", "--n", "0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "n: need at least one" in res.stderr

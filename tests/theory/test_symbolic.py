"""The sympy derivations of grpo_theory.symbolic against the numpy functions."""

import numpy as np
import pytest
import sympy as sp

from grpo_theory import (
    bernoulli_penalty_weight,
    clip_objective,
    local_convergence_beta,
    reward_std,
    success_map,
    success_map_derivative,
)
from grpo_theory import symbolic as S

RNG = np.random.default_rng(20250522)


N = 200


def test_bernoulli_variance_is_p_one_minus_p():
    assert sp.simplify(S.bernoulli_variance_expr() - S.p * (1 - S.p)) == 0
    f = sp.lambdify(S.p, S.bernoulli_variance_expr())
    p = RNG.uniform(0, 1, N)
    # the numeric reward variance of a two-action policy (p, 1 - p) with rewards (1, 0) is the same function
    policies = np.stack([p, 1 - p], axis=1)
    assert np.allclose(reward_std(policies, np.array([1.0, 0.0])) ** 2, f(p), atol=1e-15)


@pytest.mark.parametrize("n_actions", [2, 3, 4])
def test_surrogate_identity_symbolic(n_actions):
    assert S.surrogate_identity_residual(n_actions) == 0


def test_penalty_weight_matches_numpy():
    f = sp.lambdify((S.p, S.eps), S.penalty_weight_expr())
    p, eps = RNG.uniform(0, 1, N), RNG.uniform(0, 0.75, N)
    assert np.allclose(f(p, eps), bernoulli_penalty_weight(p, eps), rtol=1e-12)


def test_penalty_weight_limits():
    lim = S.penalty_weight_limits()
    assert lim["eps0_p0"] == sp.oo and lim["eps0_p1"] == sp.oo
    bound = (1 - sp.sqrt(S.eps)) / sp.sqrt(S.eps)
    assert sp.simplify(lim["sup_eps"] - bound) == 0 and sp.simplify(lim["sup_eps_at_1"] - bound) == 0
    d = sp.lambdify((S.p, S.eps), lim["argmax_check"])
    eps = RNG.uniform(1e-3, 0.75, N)
    assert np.all(d(RNG.uniform(0.01, 0.49, N), eps) < 0) and np.all(d(RNG.uniform(0.51, 0.99, N), eps) > 0)
    # numpy: the weight never exceeds the symbolic supremum and reaches it at p = 0.
    assert np.all(bernoulli_penalty_weight(RNG.uniform(0, 1, N), eps) <= (1 - np.sqrt(eps)) / np.sqrt(eps) + 1e-12)
    assert np.allclose(bernoulli_penalty_weight(0.0, eps), (1 - np.sqrt(eps)) / np.sqrt(eps))


def test_ppo_reduction():
    assert S.ppo_reduction_residual() == 0


def test_f_eps_matches_numpy():
    r_, rk_, a_, c_ = sp.symbols("r rk a c", real=True)
    f = sp.lambdify((r_, rk_, a_, c_), S.f_eps_expr(r_, rk_, a_, c_))
    ratio, ratio_k, adv, clip = RNG.uniform(0, 3, N), RNG.uniform(0, 3, N), RNG.normal(size=N), RNG.uniform(0, 1, N)
    expected = np.array([float(f(*x)) for x in zip(ratio, ratio_k, adv, clip)])
    assert np.allclose(clip_objective(ratio, ratio_k, adv, clip), expected, atol=1e-14)


def test_success_map_matches_numpy_and_policy_form():
    h = sp.lambdify((S.p, S.p_ref, S.beta, S.eps), S.success_map_expr())
    h_pol = sp.lambdify((S.p, S.p_ref, S.beta, S.eps), S.success_map_from_policy_expr())
    args = RNG.uniform(0, 1, N), RNG.uniform(0.01, 0.99, N), RNG.uniform(0.05, 2, N), RNG.uniform(1e-3, 0.75, N)
    assert np.allclose(h(*args), success_map(*args), rtol=1e-12)
    assert np.allclose(h_pol(*args), success_map(*args), rtol=1e-10)


def test_success_map_derivative():
    dh = sp.lambdify((S.p, S.p_ref, S.beta, S.eps), S.success_map_derivative_expr())
    args = RNG.uniform(0.01, 0.99, N), RNG.uniform(0.01, 0.99, N), RNG.uniform(0.05, 2, N), RNG.uniform(1e-3, 0.75, N)
    assert np.allclose(dh(*args), success_map_derivative(*args), rtol=1e-9, atol=1e-12)


def test_convergence_threshold():
    thr = sp.lambdify((S.p, S.eps), S.convergence_threshold_expr())
    p, eps = RNG.uniform(0.01, 0.99, N), RNG.uniform(1e-3, 0.75, N)
    assert np.allclose(thr(p, eps), local_convergence_beta(p, eps), rtol=1e-12)

"""Symbolic derivations (sympy) of the closed forms the numpy core uses (docs/theory.md, §2, §5, §6, §9).

Each function derives a result from definitions and returns a sympy object: ``*_expr`` an expression
to compare with the numpy function of the same stem, ``*_residual`` a difference that simplifies to 0.
``tests/theory/test_symbolic.py`` checks every result against the numpy functions on random inputs.
"""

from __future__ import annotations

import sympy as sp

p, eps, beta, p_ref = sp.symbols("p epsilon beta p_ref", positive=True)


def bernoulli_variance_expr() -> sp.Expr:
    """Var r for r ~ Bernoulli(p), from E[r^2] - E[r]^2 over the two outcomes: p(1 - p)."""
    outcomes = {0: 1 - p, 1: p}
    mean = sum(r * w for r, w in outcomes.items())
    second = sum(r**2 * w for r, w in outcomes.items())
    return sp.factor(sp.simplify(second - mean**2))


def surrogate_identity_residual(n_actions: int = 3) -> sp.Expr:
    """sigma_{alpha,eps} L_alpha(pi) - (J(pi) - J(alpha)) on a symbolic n-armed bandit.

    pi and alpha are symbolic probability vectors (last entry 1 - the others), rewards symbolic.
    Returns the simplified difference, which is 0: the identity holds for any pi, alpha, r, eps.
    """
    a = sp.symbols(f"a0:{n_actions - 1}", positive=True)
    q = sp.symbols(f"q0:{n_actions - 1}", positive=True)
    r = sp.symbols(f"r0:{n_actions}", real=True)
    alpha = list(a) + [1 - sum(a)]
    pi = list(q) + [1 - sum(q)]
    mu = sum(w * x for w, x in zip(alpha, r))
    var = sum(w * (x - mu) ** 2 for w, x in zip(alpha, r))
    s = sp.sqrt(var + eps)
    adv = [(x - mu) / s for x in r]
    # E_{y~alpha}[pi/alpha * A] written as the importance-weighted sum.
    L = sum(w * (pi_y / w) * A for w, pi_y, A in zip(alpha, pi, adv))
    J_pi = sum(w * x for w, x in zip(pi, r))
    return sp.simplify(s * L - (J_pi - mu))


def penalty_weight_expr() -> sp.Expr:
    """(1 - s)/s with s = sqrt(Var + eps), Var the Bernoulli variance derived above."""
    s = sp.sqrt(bernoulli_variance_expr() + eps)
    return (1 - s) / s


def penalty_weight_limits() -> dict[str, sp.Expr]:
    """Limits of the Bernoulli penalty weight.

    - ``eps0_p0`` and ``eps0_p1``: with eps = 0, the limits p -> 0+ and p -> 1- (both +oo).
    - ``sup_eps``: with eps > 0, the value at p in {0, 1}, where the weight is largest,
      (1 - sqrt(eps))/sqrt(eps); ``argmax_check`` is d/dp of the weight, which is negative on
      (0, 1/2) and positive on (1/2, 1), so the endpoints are the maxima.
    """
    q = sp.Symbol("q", positive=True)
    w = penalty_weight_expr()
    w0 = w.subs(eps, 0)
    return {
        "eps0_p0": sp.limit(w0, p, 0, "+"),
        # p -> 1- written as q = 1 - p -> 0+ (sympy's sqrt branch handling is safer this way).
        "eps0_p1": sp.limit(w0.subs(p, 1 - q), q, 0, "+"),
        "sup_eps": sp.simplify(w.subs(p, 0)),
        "sup_eps_at_1": sp.simplify(w.subs(p, 1)),
        "argmax_check": sp.simplify(sp.diff(w, p)),
    }


def f_eps_expr(r: sp.Expr, r_k: sp.Expr, a: sp.Expr, clip: sp.Expr) -> sp.Expr:
    """f_clip(r, r', a) = min(r a, clip(r, max(r' - clip, 0), r' + clip) a) as a sympy expression."""
    clipped = sp.Min(sp.Max(r, sp.Max(r_k - clip, 0)), r_k + clip)
    return sp.Min(r * a, clipped * a)


def ppo_reduction_residual() -> sp.Expr:
    """f_clip(r, 1, a) minus PPO's min(r a, clip(r, 1 - clip, 1 + clip) a), for 0 <= clip <= 1.

    Derived by substituting r' = 1: max(1 - clip, 0) = 1 - clip when clip <= 1, so the
    difference simplifies to 0.
    """
    r, a = sp.symbols("r a", real=True)
    c = sp.Symbol("c", positive=True)
    ppo = sp.Min(r * a, sp.Min(sp.Max(r, 1 - c), 1 + c) * a)
    diff = f_eps_expr(r, sp.Integer(1), a, c) - ppo
    # On 0 < c <= 1 the inner Max(1 - c, 0) is 1 - c; substitute c = 1 - d with d >= 0.
    d = sp.Symbol("d", nonnegative=True)
    return sp.simplify(diff.subs(c, 1 - d))


def success_map_expr() -> sp.Expr:
    """h(p) = 1 / (1 + (1 - p_ref)/p_ref exp(-1/(beta sqrt(p(1-p) + eps))))."""
    s = sp.sqrt(bernoulli_variance_expr() + eps)
    return 1 / (1 + (1 - p_ref) / p_ref * sp.exp(-1 / (beta * s)))


def success_map_from_policy_expr() -> sp.Expr:
    """h derived from the closed-form policy pi ∝ pi_ref exp(A/beta) on a two-outcome bandit.

    The success mass is p_ref exp(A(1)/beta) and the failure mass (1 - p_ref) exp(A(0)/beta),
    A(y) = (y - p)/sqrt(p(1-p) + eps). Returns their normalised ratio, which equals ``success_map``.
    """
    s = sp.sqrt(bernoulli_variance_expr() + eps)
    win = p_ref * sp.exp((1 - p) / (s * beta))
    lose = (1 - p_ref) * sp.exp((0 - p) / (s * beta))
    return win / (win + lose)


def success_map_derivative_expr() -> sp.Expr:
    """dh/dp, simplified."""
    return sp.simplify(sp.diff(success_map_expr(), p))


def convergence_threshold_expr() -> sp.Expr:
    """beta above which |h'(p*)| < 1 at a fixed point p* (h(p*) = p*): derived by substituting
    h = p into h' = h(1-h) du/dp, u = 1/(beta s), and solving |h'| = 1 for beta."""
    s = sp.sqrt(bernoulli_variance_expr() + eps)
    du_dp = sp.diff(1 / (beta * s), p)
    h_prime_at_fixed = p * (1 - p) * du_dp  # h(1 - h) with h = p
    # |h'(p*)| < 1  <=>  beta > |beta * h'(p*)|, and beta * h'(p*) does not depend on beta.
    return sp.simplify(sp.Abs(sp.expand(h_prime_at_fixed * beta)))

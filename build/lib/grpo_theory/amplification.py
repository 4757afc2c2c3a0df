"""Success amplification (Mroueh, arXiv 2503.06639; docs/theory.md, §9).

With {0, 1} rewards, no clipping, KL to pi_ref with weight beta and eps > 0, the success
probability of one prompt follows p_n = h(p_{n-1}), p_0 = p_ref, with

    h(p) = 1 / (1 + (1 - p_ref)/p_ref * exp(-1 / (beta * sqrt(p(1-p) + eps)))).

On a finite bandit the iterate policy has the closed form pi_n ∝ pi_ref exp(A_{n-1}/beta), where
A_{n-1} is the whitened advantage under pi_{n-1}; ``closed_form_iterates`` computes it with the
core's ``whitened_advantage`` so the two routes can be compared.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from .core import whitened_advantage
from .validation import as_policy, as_reward

#: Grid used to bracket the fixed points of h before bisection.
_FIXED_POINT_GRID = 4097
#: Bisection steps (interval shrinks by 2**-60: below float64 resolution).
_BISECTION_STEPS = 60


def _check(p_ref, beta, eps):
    p_ref = np.asarray(p_ref, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    eps = np.asarray(eps, dtype=np.float64)
    if np.any(~(p_ref > 0)) or np.any(~(p_ref < 1)):
        raise ValueError("p_ref: must lie strictly inside (0, 1)")
    if np.any(~(beta > 0)) or np.any(~np.isfinite(beta)):
        raise ValueError("beta: must be a positive finite number")
    if np.any(~(eps > 0)) or np.any(~np.isfinite(eps)):
        raise ValueError("eps: the success recursion needs eps > 0")
    return p_ref, beta, eps


def success_map(p, p_ref, beta, eps) -> np.ndarray:
    """h(p): the success probability after one GRPO iteration from success probability p."""
    p_ref, beta, eps = _check(p_ref, beta, eps)
    p = np.asarray(p, dtype=np.float64)
    if np.any(p < 0) or np.any(p > 1):
        raise ValueError("p: a success probability must lie in [0, 1]")
    s = np.sqrt(p * (1.0 - p) + eps)
    return 1.0 / (1.0 + (1.0 - p_ref) / p_ref * np.exp(-1.0 / (beta * s)))


def success_iterates(p_ref, beta, eps, n_steps: int) -> np.ndarray:
    """p_0 = p_ref, p_n = h(p_{n-1}); returns shape (n_steps + 1, *broadcast shape)."""
    p_ref, beta, eps = _check(p_ref, beta, eps)
    p = np.broadcast_to(p_ref, np.broadcast_shapes(p_ref.shape, beta.shape, eps.shape)).copy()
    out = [p]
    for _ in range(n_steps):
        p = success_map(p, p_ref, beta, eps)
        out.append(p)
    return np.stack(out)


def success_fixed_points(p_ref: float, beta: float, eps: float) -> np.ndarray:
    """All fixed points p* = h(p*) in (0, 1), sorted (they need not be unique). Scalars only."""
    p_ref, beta, eps = (float(x) for x in _check(p_ref, beta, eps))
    grid = np.linspace(0.0, 1.0, _FIXED_POINT_GRID)
    g = success_map(grid, p_ref, beta, eps) - grid
    roots = []
    for i in np.nonzero(np.sign(g[:-1]) * np.sign(g[1:]) <= 0)[0]:
        lo, hi = grid[i], grid[i + 1]
        if g[i] == 0:
            roots.append(lo)
            continue
        for _ in range(_BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            gm = success_map(mid, p_ref, beta, eps) - mid
            if np.sign(gm) == np.sign(success_map(lo, p_ref, beta, eps) - lo):
                lo = mid
            else:
                hi = mid
        roots.append(0.5 * (lo + hi))
    return np.unique(np.round(np.array(roots), 14))


def success_fixed_point(p_ref, beta, eps) -> np.ndarray:
    """The smallest fixed point of h above p_ref (elementwise over broadcast inputs).

    One always exists, since h(p_ref) > p_ref and h(1) < 1. When h is increasing on the way
    (e.g. p_ref >= 1/2) the iterates rise monotonically to it; in general the iteration
    converges to a fixed point only if |h'(p*)| < 1 (see ``local_convergence_beta``).
    """
    p_ref, beta, eps = _check(p_ref, beta, eps)
    shape = np.broadcast_shapes(p_ref.shape, beta.shape, eps.shape)
    flat = [np.broadcast_to(x, shape).ravel() for x in (p_ref, beta, eps)]
    out = np.empty(int(np.prod(shape)))
    for j, (pr, b, e) in enumerate(zip(*flat)):
        roots = success_fixed_points(pr, b, e)
        out[j] = roots[roots > pr][0]
    return out.reshape(shape)


def success_map_derivative(p, p_ref, beta, eps) -> np.ndarray:
    """h'(p) = h(1 - h) (2p - 1) / (2 beta s^3), s = sqrt(p(1-p) + eps) (checked with sympy)."""
    h = success_map(p, p_ref, beta, eps)
    s = np.sqrt(np.asarray(p) * (1.0 - np.asarray(p)) + eps)
    return h * (1.0 - h) * (2.0 * np.asarray(p) - 1.0) / (2.0 * beta * s**3)


def local_convergence_beta(p_star, eps) -> np.ndarray:
    """The iteration is locally convergent at a fixed point p* iff beta exceeds this value:
    p*(1-p*)|2p*-1| / (2 (p*(1-p*) + eps)^{3/2})."""
    p_star = np.asarray(p_star, dtype=np.float64)
    v = p_star * (1.0 - p_star)
    return v * np.abs(2.0 * p_star - 1.0) / (2.0 * (v + eps) ** 1.5)


def closed_form_iterates(pi_ref, r, beta, eps, n_steps: int) -> np.ndarray:
    """Policies pi_0 = pi_ref, pi_n ∝ pi_ref exp(A_{pi_{n-1}}/beta) on a finite bandit.

    ``r`` must be a {0, 1} table. Returns shape (n_steps + 1, ..., n_actions).
    """
    pi_ref = as_policy(pi_ref, "pi_ref")
    r = as_reward(r, "r")
    if np.any((r != 0) & (r != 1)):
        raise ValueError("r: the success recursion needs {0, 1} rewards")
    _check(0.5, beta, eps)
    log_ref = np.log(pi_ref)
    pi = pi_ref
    out = [pi]
    for _ in range(n_steps):
        logits = log_ref + whitened_advantage(pi, r, eps) / beta
        logits = logits - logits.max(axis=-1, keepdims=True)
        pi = np.exp(logits)
        pi = pi / pi.sum(axis=-1, keepdims=True)
        out.append(pi)
    return np.stack(out)


def mirror_success_iterates(p_ref, beta, eps, n_steps: int) -> np.ndarray:
    """"Mirror" GRPO (KL to the previous iterate): logit p_n = logit p_{n-1} + 1/(beta sqrt(p(1-p)+eps))."""
    p_ref, beta, eps = _check(p_ref, beta, eps)
    p = np.broadcast_to(p_ref, np.broadcast_shapes(p_ref.shape, beta.shape, eps.shape)).copy()
    logit = np.log(p) - np.log1p(-p)
    out = [p]
    for _ in range(n_steps):
        logit = logit + 1.0 / (beta * np.sqrt(p * (1.0 - p) + eps))
        p = expit(logit)
        out.append(p)
    return np.stack(out)

"""How far a correct float64 evaluation of Theorem 1 can appear violated (docs/theory.md, §10).

Shared by the bound-check command and the bandit simulator: an instance counts as a violation only
when the bound exceeds the improvement by more than this per-instance allowance.
"""

from __future__ import annotations

import numpy as np

from .core import bound_constant, penalty_weight, reward_std, whitened_advantage

#: Relative rounding allowance on the terms of the bound.
VIOLATION_RTOL = 1e-12
#: Instances whose rounding allowance exceeds this are ill-conditioned in float64 (sigma_eps -> 0
#: with near-deterministic policies): still checked, but left out of the reported minimum slack.
ILL_CONDITIONED = 1e-9
#: Unit roundoff of float64.
_U = 2.0**-53


def rounding_tolerance(alpha, r, eps, terms, tight: bool) -> np.ndarray:
    """How far a correct float64 evaluation of Theorem 1 can appear violated, per instance.

    A stored policy is only within about n * u (u = 2**-53) per coordinate of an exact probability
    vector (near-deterministic policies lose their small masses against the 1 of the largest).
    The bound moves by at most that perturbation times its sensitivity, roughly
    (max |A_alpha| + c w + 2c + 1) per coordinate, which is huge when sigma_{alpha,eps} -> 0.
    The returned allowance is that forward error (with a safety factor 8) plus a relative
    1e-12 of the terms' size. It is zero-free but tiny on well-conditioned instances.
    """
    n = np.shape(alpha)[-1]
    a_max = np.max(np.abs(whitened_advantage(alpha, r, eps)), axis=-1)
    c = bound_constant(r, tight=tight)
    w = penalty_weight(reward_std(alpha, r), eps)
    # w = inf (sigma_alpha = eps = 0) leaves the bound finite only where TV(pi, alpha) is exactly 0, i.e. pi is
    # alpha's own stored vector: rounding cannot move that term, so it adds nothing to the allowance.
    with np.errstate(invalid="ignore"):
        sensitivity = 1.0 + a_max + np.where((c == 0) | ~np.isfinite(w), 0.0, c * w) + 2.0 * c
    size = 1.0 + np.abs(terms.surrogate) + terms.penalty_tv + terms.penalty_lag
    return VIOLATION_RTOL * size + 8.0 * n * n * _U * sensitivity

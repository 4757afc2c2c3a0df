"""Input checks shared by the exact core. Every check raises ``ValueError`` naming the argument."""

from __future__ import annotations

import numpy as np

#: Tolerance on ``sum(pi) == 1`` for a policy given as an array of probabilities.
PROB_SUM_ATOL = 1e-8
#: Largest variance epsilon for which Theorem 1 holds (it needs sigma_{alpha,eps} <= 1).
EPS_MAX = 0.75


def as_policy(x, name: str) -> np.ndarray:
    """Return ``x`` as a float64 array of probabilities over the last axis, or raise."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        raise ValueError(f"{name}: a policy needs a last axis of actions, got a scalar")
    if a.shape[-1] < 1:
        raise ValueError(f"{name}: the last axis (actions) is empty")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains NaN or infinite probabilities")
    if np.any(a < 0):
        raise ValueError(f"{name}: contains negative probabilities (min {a.min():.3g})")
    err = np.max(np.abs(a.sum(axis=-1) - 1.0))
    if err > PROB_SUM_ATOL:
        raise ValueError(f"{name}: probabilities must sum to 1 on the last axis (off by {err:.3g})")
    return a


def as_reward(x, name: str = "r", *, unit_interval: bool = True) -> np.ndarray:
    """Return rewards as float64; with ``unit_interval`` they must lie in [0, 1] (the bound needs it)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        raise ValueError(f"{name}: rewards need a last axis of actions, got a scalar")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains NaN or infinite rewards")
    if unit_interval and (np.any(a < 0) or np.any(a > 1)):
        raise ValueError(f"{name}: rewards must lie in [0, 1] (got min {a.min():.3g}, max {a.max():.3g})")
    return a


def check_eps(eps, name: str = "eps") -> np.ndarray:
    """The variance epsilon of sigma_{alpha,eps} = sqrt(sigma^2 + eps); Theorem 1 needs 0 <= eps <= 3/4."""
    e = np.asarray(eps, dtype=np.float64)
    if not np.all(np.isfinite(e)) or np.any(e < 0) or np.any(e > EPS_MAX):
        raise ValueError(f"{name}: must lie in [0, 3/4] (Theorem 1 needs sigma_eps <= 1), got {eps!r}")
    return e


def check_same_actions(**arrays: np.ndarray) -> None:
    """All arrays must broadcast together and agree on the number of actions (last axis)."""
    names = list(arrays)
    n = {k: v.shape[-1] for k, v in arrays.items()}
    if len(set(n.values())) > 1:
        detail = ", ".join(f"{k}: {n[k]}" for k in names)
        raise ValueError(f"mismatched numbers of actions on the last axis ({detail})")
    try:
        np.broadcast_shapes(*(v.shape for v in arrays.values()))
    except ValueError:
        detail = ", ".join(f"{k}: {arrays[k].shape}" for k in names)
        raise ValueError(f"shapes do not broadcast ({detail})") from None

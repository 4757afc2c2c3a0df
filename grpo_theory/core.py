"""Exact quantities of off-policy GRPO on finite action sets (docs/theory.md, §1-§6).

Pure functions, float64, vectorised over leading batch dimensions: a policy or a reward table is
an array of shape ``(..., n_actions)`` and results have shape ``(...)`` unless said otherwise.

Conventions pinned here (and nowhere else):
- TV(p, q) = 1/2 sum_y |p(y) - q(y)| (half L1); KL(p || q) = sum_y p log(p / q), p first.
- sigma_alpha is the *population* standard deviation of r under alpha;
  sigma_{alpha,eps} = sqrt(sigma_alpha^2 + eps).
- A zero standard deviation (with eps = 0) gives all-zero advantages, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

import numpy as np

from .validation import as_policy, as_reward, check_eps, check_same_actions

#: The constant in front of both TV terms of Theorem 1 as stated in the paper.
PAPER_CONSTANT = 2.0


# ----------------------------------------------------------------------------------------------
# Policies, expectations and distances
# ----------------------------------------------------------------------------------------------


def softmax(logits) -> np.ndarray:
    """The softmax-tabular policy exp(z) / sum exp(z) over the last axis (shifted by the max, so no overflow)."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def expected_reward(pi, r) -> np.ndarray:
    """J(pi) = E_{y~pi} r(y) = sum_y pi(y) r(y). Shapes (..., n) -> (...)."""
    pi = as_policy(pi, "pi")
    r = as_reward(r, "r", unit_interval=False)
    check_same_actions(pi=pi, r=r)
    return np.sum(pi * r, axis=-1)


def tv_distance(p, q) -> np.ndarray:
    """TV(p, q) = 1/2 sum_y |p(y) - q(y)| (half L1, in [0, 1]). Shapes (..., n) -> (...)."""
    p, q = as_policy(p, "p"), as_policy(q, "q")
    check_same_actions(p=p, q=q)
    return 0.5 * np.sum(np.abs(p - q), axis=-1)


def kl_divergence(p, q) -> np.ndarray:
    """KL(p || q) = sum_y p log(p/q), with 0 log 0 = 0 and +inf where q = 0 < p.

    Summed as sum_y [p log(p/q) - p + q] (the added terms sum to 0), whose every term is >= 0,
    so rounding never makes the result negative.
    """
    p, q = as_policy(p, "p"), as_policy(q, "q")
    check_same_actions(p=p, q=q)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)) - p + q, q)
    return np.maximum(np.sum(terms, axis=-1), 0.0)


# ----------------------------------------------------------------------------------------------
# Reward statistics and whitened advantages
# ----------------------------------------------------------------------------------------------


def _reward_mean(alpha: np.ndarray, r: np.ndarray) -> np.ndarray:
    """mu_alpha = E_{y~alpha} r, shape (..., 1); exactly the common value when r is constant on alpha's support
    (so a constant reward gives exactly zero variance, not rounding noise)."""
    on = alpha > 0
    r_b = np.broadcast_to(r, np.broadcast_shapes(r.shape, alpha.shape))
    lo = np.min(np.where(on, r_b, np.inf), axis=-1, keepdims=True)
    hi = np.max(np.where(on, r_b, -np.inf), axis=-1, keepdims=True)
    return np.where(lo == hi, lo, np.sum(alpha * r, axis=-1, keepdims=True))


def reward_std(alpha, r) -> np.ndarray:
    """sigma_alpha = sqrt(Var_{y~alpha} r(y)), the population standard deviation under alpha."""
    alpha = as_policy(alpha, "alpha")
    r = as_reward(r, "r", unit_interval=False)
    check_same_actions(alpha=alpha, r=r)
    mu = _reward_mean(alpha, r)
    return np.sqrt(np.sum(alpha * (r - mu) ** 2, axis=-1))


def standardised_reward(r, mu, sigma, eps) -> np.ndarray:
    """(r - mu) / sqrt(sigma^2 + eps), and 0 where that denominator is 0. Broadcasts.

    The one place the whitening formula is written: ``whitened_advantage`` calls it with alpha's exact
    mean and standard deviation; the LLM diagnostics with a group's, evaluated on other samples.
    """
    r, mu, sigma = (np.asarray(x, dtype=np.float64) for x in (r, mu, sigma))
    s = np.sqrt(sigma**2 + check_eps(eps))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 0, (r - mu) / np.where(s > 0, s, 1.0), 0.0)


def whitened_advantage(alpha, r, eps) -> np.ndarray:
    """A_alpha(y) = (r(y) - mu_alpha) / sigma_{alpha,eps}. Shape (..., n_actions) (docs/theory.md, §1).

    Zero where sigma_{alpha,eps} = 0 (constant reward under alpha with eps = 0).
    """
    alpha = as_policy(alpha, "alpha")
    r = as_reward(r, "r", unit_interval=False)
    eps = check_eps(eps)
    check_same_actions(alpha=alpha, r=r)
    return standardised_reward(r, _reward_mean(alpha, r), reward_std(alpha, r)[..., None], eps[..., None])


#: The advantage estimators (the config's ``scale_rewards``, TRL's name), declared once: how the centred rewards of a
#: group are scaled. ``ADVANTAGE_SCALES`` holds one function per name: (rewards r, centred r - mean, eps, axis) -> the
#: divisor (1 for none).
ScaleRewards = Literal["group", "batch", "none"]
ADVANTAGE_SCALES: dict[str, Callable] = {
    "group": lambda r, centred, eps, axis: np.sqrt(r.var(axis=axis, ddof=1, keepdims=True) + eps),
    "batch": lambda r, centred, eps, axis: np.sqrt(np.full_like(r.mean(axis=axis, keepdims=True), r.var(ddof=1))
                                                   + eps),
    "none": lambda r, centred, eps, axis: np.ones_like(r.mean(axis=axis, keepdims=True)),
}
assert tuple(ADVANTAGE_SCALES) == get_args(ScaleRewards)


def group_advantages(rewards, eps, *, scale: bool | str = True, axis: int = -1) -> np.ndarray:
    """Advantages of a sampled group of G rewards: (r - mean) / sqrt(var + eps), var unbiased (ddof=1).

    This is the estimate of A_alpha used by the bandit simulator and the LLM trainer alike.
    With ``scale=False`` (or "none") it is r - mean (Dr. GRPO); with ``scale="batch"`` (TRL's batch scaling) the
    variance is that of every reward of the array, not of the group (the centring stays per group). A group whose
    rewards are all equal gets exact zeros (never NaN, never rounding noise). ``eps`` must be >= 0.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim == 0 or r.shape[axis] < 2:
        raise ValueError(f"rewards: a group needs G >= 2 samples along axis {axis}, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards: contains NaN or infinite values")
    eps = float(eps)
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps: must be >= 0, got {eps!r}")
    mode = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else scale
    if mode not in ADVANTAGE_SCALES:
        raise ValueError(f"scale: expected {', '.join(ADVANTAGE_SCALES)}, got {scale!r}")
    mean = r.mean(axis=axis, keepdims=True)
    zero_std = np.ptp(r, axis=axis, keepdims=True) == 0
    centred = np.where(zero_std, 0.0, r - mean)
    if mode == "none":
        return centred
    denom = ADVANTAGE_SCALES[mode](r, centred, eps, axis)
    return np.where(zero_std, 0.0, centred / np.where(zero_std, 1.0, denom))


# ----------------------------------------------------------------------------------------------
# Surrogates
# ----------------------------------------------------------------------------------------------


def surrogate(pi, alpha, r, eps) -> np.ndarray:
    """L_alpha(pi) = E_{y~alpha}[pi(y)/alpha(y) A_alpha(y)] = sum_y pi(y) A_alpha(y).

    The second form is the importance-sampled expectation whenever pi is absolutely continuous
    w.r.t. alpha; it is the one for which sigma_{alpha,eps} L_alpha(pi) = J(pi) - J(alpha).
    Evaluated as sum_y (pi(y) - alpha(y)) A_alpha(y) (equal, since E_alpha A_alpha = 0), which
    keeps the rounding error proportional to TV(pi, alpha)/sigma rather than 1/sigma.
    """
    pi, alpha = as_policy(pi, "pi"), as_policy(alpha, "alpha")
    a = whitened_advantage(alpha, r, eps)
    check_same_actions(pi=pi, A=a)
    return np.sum((pi - alpha) * a, axis=-1)


def clip_window(ratio_k, clip, clip_high=None):
    """The interval [max(r' - clip, 0), r' + clip_high] the ratio r = pi/alpha may move in (docs/theory.md, §6).

    ``ratio_k`` = r' = pi_k/alpha; ``clip_high`` None: ``clip`` (the paper's symmetric window). Returns
    ``(low, high)``. With r' = 1 it is PPO's [1 - clip, 1 + clip_high].
    """
    ratio_k = np.asarray(ratio_k, dtype=np.float64)
    return np.maximum(ratio_k - clip, 0.0), ratio_k + (clip if clip_high is None else clip_high)


def clip_flags(ratio, ratio_k, adv, clip, clip_high=None):
    """Where the clip of f_eps stops the gradient: ``(low, high)`` boolean arrays.

    low: r below the window with a negative advantage; high: r above it with a positive advantage.
    Elsewhere the unclipped branch r a of the min is active and the gradient flows through r.
    """
    ratio, adv = np.asarray(ratio, dtype=np.float64), np.asarray(adv, dtype=np.float64)
    low, high = clip_window(ratio_k, clip, clip_high)
    return (ratio < low) & (adv < 0), (ratio > high) & (adv > 0)


def clip_objective(ratio, ratio_k, adv, clip, clip_high=None, delta=0.0):
    """f_eps(r, r', a) = min(r a, clip(r, max(r' - clip, 0), r' + clip) a), elementwise (docs/theory.md, §6).

    ``ratio`` = pi/alpha, ``ratio_k`` = pi_k/alpha, ``adv`` = A_alpha. With r' = 1 this is PPO's
    clipping. ``clip_high``: the window's upper width (None: ``clip``); ``delta`` > 0: the unclipped branch's ratio
    is capped at r' + delta - 1 (the two-sided clip, docs/theory.md §6.1; at r' = 1 TRL's r <= delta). Works on
    numpy arrays; the torch loss in ``llm`` is tested against it.
    """
    ratio, ratio_k, adv, clip = (np.asarray(x, dtype=np.float64) for x in (ratio, ratio_k, adv, clip))
    if not np.all(np.isfinite(clip)) or np.any(clip < 0):
        raise ValueError(f"clip: must be >= 0, got {clip!r}")
    clipped = np.clip(ratio, *clip_window(ratio_k, clip, clip_high))
    free = np.minimum(ratio, ratio_k + delta - 1.0) if delta > 0 else ratio
    return np.minimum(free * adv, clipped * adv)


def clipped_surrogate(pi, pi_k, alpha, r, eps, clip) -> np.ndarray:
    """L^c_alpha(pi) = E_{y~alpha} f_clip(pi/alpha, pi_k/alpha, A_alpha). Shapes (..., n) -> (...).

    alpha must be positive wherever pi or pi_k is (otherwise the ratios are undefined).
    """
    pi, pi_k, alpha = as_policy(pi, "pi"), as_policy(pi_k, "pi_k"), as_policy(alpha, "alpha")
    check_same_actions(pi=pi, pi_k=pi_k, alpha=alpha)
    if np.any((alpha == 0) & ((pi > 0) | (pi_k > 0))):
        raise ValueError("alpha: must be positive wherever pi or pi_k is positive (ratios undefined)")
    a = whitened_advantage(alpha, r, eps)
    safe = np.where(alpha > 0, alpha, 1.0)
    f = clip_objective(pi / safe, pi_k / safe, a, clip)
    return np.sum(np.where(alpha > 0, alpha * f, 0.0), axis=-1)


# ----------------------------------------------------------------------------------------------
# Theorem 1, one function per term
# ----------------------------------------------------------------------------------------------


def penalty_weight(sigma, eps) -> np.ndarray:
    """(1 - s)/s with s = sqrt(sigma^2 + eps): the weight of TV(pi, alpha) in Theorem 1.

    +inf where s = 0. Non-negative whenever s <= 1 (rewards in [0, 1] and eps <= 3/4).
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    eps = check_eps(eps)
    if np.any(sigma < 0):
        raise ValueError("sigma: a standard deviation must be >= 0")
    s = np.sqrt(sigma**2 + eps)
    with np.errstate(divide="ignore"):
        return np.where(s > 0, (1.0 - s) / np.where(s > 0, s, 1.0), np.inf)


def bernoulli_penalty_weight(p, eps) -> np.ndarray:
    """(1 - s)/s with s = sqrt(p(1-p) + eps): the penalty weight for {0,1} rewards with success rate p."""
    p = np.asarray(p, dtype=np.float64)
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise ValueError("p: a success probability must lie in [0, 1]")
    return penalty_weight(np.sqrt(p * (1.0 - p)), eps)


def bound_constant(r=None, *, tight: bool = False, reward_range=None) -> np.ndarray:
    """Constant c in front of both TV terms: 2 (paper), or the reward range max r - min r (tight).

    For the tight constant give either the reward table ``r`` (range over its last axis) or a
    known ``reward_range`` (1 is valid for any rewards in [0, 1]).
    """
    if not tight:
        return np.asarray(PAPER_CONSTANT)
    if reward_range is not None:
        c = np.asarray(reward_range, dtype=np.float64)
        if np.any(c < 0) or np.any(c > 1):
            raise ValueError("reward_range: must lie in [0, 1] for rewards in [0, 1]")
        return c
    if r is None:
        raise ValueError("r: the tight constant needs the reward table or reward_range")
    r = as_reward(r, "r")
    return np.ptp(r, axis=-1)


def tv_penalty(weight, tv_new, c) -> np.ndarray:
    """c * (1 - s)/s * TV(pi, alpha); exactly 0 where TV(pi, alpha) = 0 or c = 0 (even if the weight is inf).

    c = 0 (tight constant) means a constant reward, so J(pi) = J(alpha) and nothing is lost.
    """
    weight, tv_new, c = (np.asarray(x, dtype=np.float64) for x in (weight, tv_new, c))
    with np.errstate(invalid="ignore"):
        return np.where((tv_new == 0) | (c == 0), 0.0, c * weight * tv_new)


def lag_penalty(tv_lag, c) -> np.ndarray:
    """c * TV(pi_k, alpha): the price of sampling from the stale policy alpha instead of pi_k."""
    return c * np.asarray(tv_lag, dtype=np.float64)


class BoundTerms(NamedTuple):
    """The terms of Theorem 1; ``lower = surrogate - penalty_tv - penalty_lag``."""

    surrogate: np.ndarray
    penalty_tv: np.ndarray
    penalty_lag: np.ndarray
    lower: np.ndarray


def combine_bound(surrogate_value, weight, tv_new, tv_lag, c) -> BoundTerms:
    """Assemble Theorem 1 from its ingredients (exact values or per-prompt estimates)."""
    sur = np.asarray(surrogate_value, dtype=np.float64)
    p_tv = tv_penalty(weight, tv_new, c)
    p_lag = lag_penalty(tv_lag, c)
    return BoundTerms(sur, p_tv, p_lag, sur - p_tv - p_lag)


def bound_terms(pi, pi_k, alpha, r, eps, tight: bool = False) -> BoundTerms:
    """Every term of Theorem 1 for each prompt: J(pi) - J(pi_k) >= L - c w TV(pi, alpha) - c TV(pi_k, alpha).

    w = (1 - s)/s, s = sigma_{alpha,eps}; c = 2 (paper) or, with ``tight``, the reward range.
    Needs rewards in [0, 1] and eps in [0, 3/4].
    """
    pi, pi_k, alpha = as_policy(pi, "pi"), as_policy(pi_k, "pi_k"), as_policy(alpha, "alpha")
    r = as_reward(r, "r")
    eps = check_eps(eps)
    check_same_actions(pi=pi, pi_k=pi_k, alpha=alpha, r=r)
    w = penalty_weight(reward_std(alpha, r), eps)
    c = bound_constant(r, tight=tight)
    return combine_bound(surrogate(pi, alpha, r, eps), w, tv_distance(pi, alpha), tv_distance(pi_k, alpha), c)


def improvement_lower_bound(pi, pi_k, alpha, r, eps, tight: bool = False) -> np.ndarray:
    """Right-hand side of Theorem 1 (paper constants; ``tight=True`` uses the reward range)."""
    return bound_terms(pi, pi_k, alpha, r, eps, tight=tight).lower

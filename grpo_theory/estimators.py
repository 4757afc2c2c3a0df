"""Estimates of Theorem 1's terms from a group of G responses sampled from alpha (docs/theory.md, §8).

A language model's policies cannot be enumerated, so per prompt the trainer sees G responses y_g ~ alpha, their
rewards r_g in [0, 1] and the importance weights w_g = pi(y_g)/alpha(y_g) (and w_k,g = pi_k(y_g)/alpha(y_g)).
These functions are the estimators, arrays of shape (..., G) in, one value per group (..., ) out; what each
estimates and its bias are stated in its docstring and pinned by exact-expectation tests (``tests/theory``):

- ``tv_estimate``: mean_g (1 - w_g)^+, unbiased for TV(pi, alpha), always in [0, 1];
- ``tv_between_estimate``: mean_g |w_g - w_k,g| / 2, unbiased for TV(pi, pi_k) where alpha covers both (one step's
  drift, measured on alpha's samples);
- ``improvement_estimate``: mean_g (w_g - w_k,g)(r_g - rbar_{-g}), unbiased for J(pi) - J(pi_k), exactly 0 when the
  group's rewards are all equal (rbar_{-g}: the mean of the other G - 1 rewards, a leave-one-out baseline);
- ``mean_and_standard_error``: the mean of independent estimates and its standard error (every ``*_se``);
- ``lower_confidence_bound``: a one-sided lower confidence bound on the mean of independent per-prompt estimates
  that abstains (nan) below ``CERTIFICATE_MIN_PROMPTS`` (the improvement certificate: docs/theory.md, §8.6);
- ``bound_estimates``: Theorem 1's surrogate, TV penalty, lag penalty and lower bound. The only non-linear
  ingredient is 1/s; it is estimated for each response from the *other* G - 1 rewards (``inverse_sigma``), so it
  is independent of that response's weight and the estimate's expectation is exactly the bound's formula with
  E[1/s~] in place of 1/s (``inverse_sigma_expectation`` gives E[1/s~] for Bernoulli rewards).
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from .core import combine_bound, penalty_weight

#: Pseudo-observations at reward 0 and at reward 1 (``SIGMA_PSEUDO_COUNT`` each) added to the other G - 1 rewards
#: before their variance is taken (``inverse_sigma``). Chosen by measurement on exact binomial expectations
#: (``inverse_sigma_expectation``): it minimises the mean squared log-ratio of E[1/s~] to 1/s over success rates
#: p uniform on [0.005, 0.995] at eps = 1e-4 for G = 4 and 8 (0.35 for G = 16; the plug-in, no pseudo-observations,
#: is off by a factor of up to 15 at G = 8). docs/theory.md, §8.5 tabulates the remaining bias.
SIGMA_PSEUDO_COUNT = 0.3


def leave_one_out_mean(r) -> np.ndarray:
    """rbar_{-g}: the mean of the other G - 1 rewards of each response's group, shape (..., G); needs G >= 2."""
    r = np.asarray(r, dtype=np.float64)
    G = r.shape[-1]
    if G < 2:
        raise ValueError("r: a leave-one-out mean needs G >= 2 responses per group")
    return (r.sum(axis=-1, keepdims=True) - r) / (G - 1)


def leave_one_out_sigma(r, pseudo: float = SIGMA_PSEUDO_COUNT) -> np.ndarray:
    """s~-style standard deviation of each response's group without it: the population standard deviation of the
    other G - 1 rewards together with ``pseudo`` pseudo-rewards at 0 and ``pseudo`` at 1 (rewards in [0, 1]), shape
    (..., G). For Bernoulli rewards with k successes among the others it is sqrt(m (1 - m)), m = (k + a)/(G - 1 + 2a):
    the plug-in shrunk towards 1/2, never 0, so 1/s stays finite on an all-equal group."""
    r = np.asarray(r, dtype=np.float64)
    G = r.shape[-1]
    n = G - 1 + 2 * pseudo
    first = (r.sum(axis=-1, keepdims=True) - r + pseudo) / n
    second = ((r**2).sum(axis=-1, keepdims=True) - r**2 + pseudo) / n
    return np.sqrt(np.maximum(second - first**2, 0.0))


def inverse_sigma(r, eps, pseudo: float = SIGMA_PSEUDO_COUNT) -> np.ndarray:
    """1/s~_{-g} = 1/sqrt(leave_one_out_sigma^2 + eps), the estimate of 1/s = 1/sigma_{alpha,eps} used for response g,
    shape (..., G). It depends only on the other responses of the group."""
    return 1.0 / np.sqrt(leave_one_out_sigma(r, pseudo) ** 2 + eps)


def inverse_sigma_expectation(p, G: int, eps, pseudo: float = SIGMA_PSEUDO_COUNT) -> np.ndarray:
    """E[1/s~] for Bernoulli rewards with success rate ``p`` and groups of G: the exact binomial expectation over the
    other G - 1 rewards (compare 1/s = 1/sqrt(p(1 - p) + eps))."""
    from scipy.stats import binom

    p = np.asarray(p, dtype=np.float64)
    k = np.arange(G)
    m = (k + pseudo) / (G - 1 + 2 * pseudo)
    h = 1.0 / np.sqrt(m * (1 - m) + eps)
    return np.sum(binom.pmf(k, G - 1, p[..., None]) * h, axis=-1)


def tv_estimate(w) -> np.ndarray:
    """mean_g (1 - w_g)^+: unbiased for TV(pi, alpha) = sum_y (alpha(y) - pi(y))^+ (also where pi puts mass outside
    alpha's support, which 1/2 mean |w - 1| misses), and in [0, 1] whatever the weights: heavy-tailed sequence weights
    enter only through min(w, 1)."""
    return np.mean(np.maximum(1.0 - np.asarray(w, dtype=np.float64), 0.0), axis=-1)


def tv_between_estimate(w_a, w_b) -> np.ndarray:
    """mean_g |w_a,g - w_b,g| / 2 for the weights of two policies a and b against the same alpha: unbiased for
    TV(a, b) = sum_y |a(y) - b(y)| / 2 where alpha(y) > 0 on both supports (every softmax policy's case). Responses
    off alpha's support (truncated sampling) are never drawn: there the estimate is biased low by exactly
    sum_{y: alpha(y) = 0} |a(y) - b(y)| / 2. With w_b = 1 (b = alpha) it is |1 - w_a| / 2, whose mean is ``tv_estimate``'s on alpha's support."""
    return 0.5 * np.mean(np.abs(np.asarray(w_a, dtype=np.float64) - np.asarray(w_b, dtype=np.float64)), axis=-1)


def improvement_estimate(r, w_new, w_k) -> np.ndarray:
    """mean_g (w_new,g - w_k,g)(r_g - rbar_{-g}): unbiased for J(pi) - J(pi_k) (E[w_new - w_k] = 0 and the baseline is
    independent of response g), exactly 0 on a group of equal rewards."""
    r = np.asarray(r, dtype=np.float64)
    return np.mean((np.asarray(w_new) - np.asarray(w_k)) * (r - leave_one_out_mean(r)), axis=-1)


def mean_and_standard_error(values) -> tuple[float, float]:
    """The mean of independent estimates ``values`` and its standard error, the sample standard deviation (ddof 1)
    over sqrt(n): nan for both when there are none, nan for the error below 2."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), (float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan"))


#: The fewest independent per-prompt estimates from which ``lower_confidence_bound`` bounds their mean; below it the
#: certificate abstains (nan). Measured (``grpo_theory.certificate``, docs/theory.md §8.6): a harm that shows in few
#: prompts is invisible in a small sample whatever the interval: with a change of -0.0125 whose per-prompt estimates
#: are negative on 21% of prompts and slightly positive on the rest, every interval tried certified 14.9-15% of the
#: steps at 8 prompts, 2.1-2.3% at 16.
CERTIFICATE_MIN_PROMPTS = 16
#: The bound's methods: ``cantelli``, mean - sqrt(level/(1 - level)) sd/sqrt(n) (the one-sided Chebyshev-Cantelli
#: inequality with the sample standard deviation: it assumes no shape, and kept the level on every distribution
#: measured from 16 prompts on, strongly left-skewed ones included); ``t``, mean - t_{n-1}(level) sd/sqrt(n) (exact for
#: normal estimates, and far more powerful, but it certified 9-18% of the steps on left-skewed estimates at 16-32
#: prompts, at level 0.95). Declared once: the trainer's and the simulator's configs take the type and the default here.
LcbMethod = Literal["cantelli", "t"]
LCB_METHODS: tuple[str, ...] = get_args(LcbMethod)
DEFAULT_LCB_METHOD: LcbMethod = "cantelli"


def certificate_abstains(n: int, min_count: int = CERTIFICATE_MIN_PROMPTS) -> str | None:
    """Why ``lower_confidence_bound`` gives nan for ``n`` estimates (None when it gives a bound): one line."""
    if n >= max(min_count, 2):
        return None
    return (f"{n} held-out prompt{'s' if n != 1 else ''} per step: the certificate needs at least {max(min_count, 2)} "
            "(with fewer, a harm that shows on few prompts goes unseen whatever the interval; docs/theory.md, §8.6); "
            "heldout/improvement_lcb is nan")


def lower_confidence_bound(values, level: float = 0.95, *, method: LcbMethod = DEFAULT_LCB_METHOD,
                           min_count: int = CERTIFICATE_MIN_PROMPTS) -> float:
    """A one-sided lower confidence bound at ``level`` on the expectation of n independent estimates ``values`` (each
    unbiased for the same quantity, e.g. the per-prompt ``improvement_estimate`` of held-out prompts; an array
    (..., n) gives one bound per row): ``method``
    ``cantelli`` (default) mean - sqrt(level/(1 - level)) sd/sqrt(n), or ``t`` mean - t_{n-1}(level) sd/sqrt(n)
    (``LCB_METHODS``). nan (the certificate abstains) below ``min_count`` values (``CERTIFICATE_MIN_PROMPTS``; at
    least 2). Neither method is exact for every distribution: their false-certificate rates and power, measured over
    symmetric, skewed and heavy-tailed estimates, are docs/theory.md §8.6's table (``grpo_theory.certificate``)."""
    if not 0.5 <= level < 1:
        raise ValueError(f"level: must be in [0.5, 1), got {level}")
    if method not in LCB_METHODS:
        raise ValueError(f"method: expected one of {', '.join(LCB_METHODS)}, got {method!r}")
    x = np.asarray(values, dtype=np.float64)
    x = x.reshape(-1) if x.ndim <= 1 else x  # (..., n): one bound per row, vectorised for coverage studies
    n = x.shape[-1]
    if certificate_abstains(n, min_count) is not None:
        return float("nan") if x.ndim == 1 else np.full(x.shape[:-1], np.nan)
    from scipy import stats

    width = np.sqrt(level / (1 - level)) if method == "cantelli" else stats.t.ppf(level, n - 1)
    bound = x.mean(axis=-1) - width * x.std(axis=-1, ddof=1) / np.sqrt(n)
    return float(bound) if x.ndim == 1 else bound


def kish_ess_fraction(w, axis=None) -> np.ndarray:
    """Kish's effective sample size of importance weights as a fraction of their number: (sum w)^2 / (n sum w^2), in
    (0, 1]; 1 when every weight is equal, 1/n when one weight carries everything."""
    w = np.asarray(w, dtype=np.float64)
    n = w.size if axis is None else w.shape[axis]
    with np.errstate(invalid="ignore", over="ignore"):
        return np.sum(w, axis=axis) ** 2 / (n * np.sum(w**2, axis=axis))


def bound_estimates(r, w_new, w_k, eps, c):
    """Theorem 1's terms (``BoundTerms``, one value per group) from a group of G responses:

        surrogate   = mean_g (w_g - 1)(r_g - rbar_{-g}) / s~_{-g}
        penalty_tv  = c mean_g (1 - w_g)^+ (1 - s~_{-g})/s~_{-g}
        penalty_lag = c mean_g (1 - w_k,g)^+
        lower       = surrogate - penalty_tv - penalty_lag

    with w = pi/alpha, w_k = pi_k/alpha. Each response's 1/s~ comes from the others (``inverse_sigma``), so
    E[surrogate] = (J(pi) - J(alpha)) E[1/s~], E[penalty_tv] = c TV(pi, alpha)(E[1/s~] - 1) and penalty_lag is
    unbiased: the estimate of the lower bound is off by (J(pi) - J(alpha) - c TV(pi, alpha)) (E[1/s~] - 1/s), which is
    0 where E[1/s~] = 1/s and otherwise has the sign of 1/s - E[1/s~] (J(pi) - J(alpha) <= c TV when c >= the reward
    range). On a group of equal rewards the surrogate is exactly 0."""
    r = np.asarray(r, dtype=np.float64)
    w_new, w_k = np.asarray(w_new, dtype=np.float64), np.asarray(w_k, dtype=np.float64)
    sigma = leave_one_out_sigma(r)
    with np.errstate(invalid="ignore", over="ignore"):
        surrogate = (w_new - 1.0) * (r - leave_one_out_mean(r)) / np.sqrt(sigma**2 + eps)
    weight = penalty_weight(sigma, eps)  # (1 - s~)/s~ = 1/s~ - 1
    per_response = combine_bound(surrogate, weight, np.maximum(1.0 - w_new, 0.0), np.maximum(1.0 - w_k, 0.0), c)
    return type(per_response)(*(np.mean(term, axis=-1) for term in per_response))

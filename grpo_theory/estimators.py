"""Estimates of Theorem 1's terms from a group of G responses sampled from alpha (docs/theory.md, §8).

A language model's policies cannot be enumerated, so per prompt the trainer sees G responses y_g ~ alpha, their
rewards r_g in [0, 1] and the importance weights w_g = pi(y_g)/alpha(y_g) (and w_k,g = pi_k(y_g)/alpha(y_g)).
These functions are the estimators, arrays of shape (..., G) in, one value per group (..., ) out; what each
estimates and its bias are stated in its docstring and pinned by exact-expectation tests (``tests/theory``):

- ``tv_estimate``: mean_g (1 - w_g)^+, unbiased for TV(pi, alpha), always in [0, 1];
- ``tv_between_estimate``: mean_g |w_g - w_k,g| / 2, unbiased for TV(pi, pi_k) where alpha covers both (one step's
  drift, measured on alpha's samples);
- ``tv_anchored_estimate``: mean_g (w_ref,g - w_g)^+, unbiased for the same TV, each value at most w_ref (the
  staleness reading of ``llm.integrations``, where one sequence's weight of pi_k can be huge);
- ``improvement_estimate``: mean_g (w_g - w_k,g)(r_g - rbar_{-g}), unbiased for J(pi) - J(pi_k), exactly 0 when the
  group's rewards are all equal (rbar_{-g}: the mean of the other G - 1 rewards, a leave-one-out baseline);
- ``mean_and_standard_error``: the mean of independent estimates and its standard error (every ``*_se``);
- ``capped_improvement_estimate``: mean_g [min(w_g, W) r_g + min(w_k,g, W)(1 - r_g) - 1], in [-1, W - 1], biased
  low by a stated amount: its expectation is a lower bound on J(pi) - J(pi_k) (the certificate's quantity);
- ``lower_confidence_bound``: a one-sided lower confidence bound on the mean of independent values; by default the
  betting bound on values of a known range, whose level is a theorem (the improvement certificate: docs/theory.md,
  §8.6);
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


def tv_anchored_estimate(w, w_ref) -> np.ndarray:
    """mean_g (w_ref,g - w_g)^+ for the weights of a policy p (``w``) and a reference policy q (``w_ref``) against the
    same alpha: unbiased for TV(p, q) = E_q (1 - p/q)^+ = sum_y (q(y) - p(y))^+ where alpha(y) > 0 on q's support (low by
    sum_{y: alpha(y) = 0} (q(y) - p(y))^+ otherwise). Each value is at most w_ref: anchored on q, a heavy weight of p
    enters not at all, where ``tv_between_estimate``'s |w - w_ref| / 2 is unbounded (one completion with w = 3,324
    adds 1,662 / G to it); exactly 0 when p and q give the same weights. With w_ref = 1 (q = alpha) it is
    ``tv_estimate``. The staleness reading of ``llm.integrations``: p = pi_k, q = the policy the sampler was synced
    from, whose weight against the sampler is the engine's mismatch, near 1."""
    return np.mean(np.maximum(np.asarray(w_ref, dtype=np.float64) - np.asarray(w, dtype=np.float64), 0.0), axis=-1)


def improvement_estimate(r, w_new, w_k) -> np.ndarray:
    """mean_g (w_new,g - w_k,g)(r_g - rbar_{-g}): unbiased for J(pi) - J(pi_k) (E[w_new - w_k] = 0 and the baseline is
    independent of response g), exactly 0 on a group of equal rewards."""
    r = np.asarray(r, dtype=np.float64)
    return np.mean((np.asarray(w_new) - np.asarray(w_k)) * (r - leave_one_out_mean(r)), axis=-1)


#: W: the importance weights in ``capped_improvement_estimate`` are capped at this, so each response's value lies in
#: [-1, W - 1] and the certificate's betting bound needs no assumption beyond the range (docs/theory.md, §8.6).
IMPROVEMENT_WEIGHT_CAP = 2.0


def capped_improvement_estimate(r, w_new, w_k, cap: float = IMPROVEMENT_WEIGHT_CAP) -> np.ndarray:
    """mean_g [min(w_new,g, W) r_g + min(w_k,g, W) (1 - r_g) - 1] for rewards r in [0, 1] and W = ``cap``: a value in
    [-1, W - 1] whose expectation is a lower bound on J(pi) - J(pi_k), exactly

        J(pi) - J(pi_k) - E = sum_y (pi(y) - W alpha(y))^+ r(y) + sum_y (pi_k(y) - W alpha(y))^+ (1 - r(y)) >= 0

    (each policy's mass above W times alpha's, pi's where the reward is high and pi_k's where it is low; plus the mass
    either policy puts off alpha's support), since E_alpha[min(w, W) r] <= E_pi[r] and E_alpha[min(w_k, W)(1 - r)] <=
    E_pi_k[1 - r]. It is 0 when pi = pi_k = alpha and needs no leave-one-out baseline; the bias is one-sided, so a
    lower confidence bound on its mean is one on the improvement."""
    r = np.asarray(r, dtype=np.float64)
    if r.size and (r.min() < 0 or r.max() > 1):
        raise ValueError("r: the capped estimate needs rewards in [0, 1] (rescale them first)")
    if not cap >= 1:
        raise ValueError(f"cap: must be >= 1, got {cap}")
    capped = lambda w: np.minimum(np.asarray(w, dtype=np.float64), cap)  # noqa: E731
    return np.mean(capped(w_new) * r + capped(w_k) * (1.0 - r) - 1.0, axis=-1)


def mean_and_standard_error(values) -> tuple[float, float]:
    """The mean of independent estimates ``values`` and its standard error, the sample standard deviation (ddof 1)
    over sqrt(n): nan for both when there are none, nan for the error below 2."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), (float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan"))


#: The fewest independent per-prompt estimates from which the unguaranteed bounds (``t_unguaranteed``,
#: ``cantelli_unguaranteed``) bound their mean; below it they abstain (nan). The betting bound needs no such floor: its
#: level holds at every n, and with few values it simply does not certify (``certificate_floor`` says from where).
CERTIFICATE_MIN_PROMPTS = 16
#: The bound's methods: ``betting`` (default), the betting lower confidence bound on values of a stated range
#: (``grpo_theory.betting``: Waudby-Smith and Ramdas 2024), whose level is a theorem for every distribution on the
#: range; ``t_unguaranteed``, mean - t_{n-1}(level) sd/sqrt(n), exact for normal values only; ``cantelli_unguaranteed``,
#: mean - sqrt(level/(1 - level)) sd/sqrt(n), Cantelli's inequality with the sample's own standard deviation. The last
#: two are built on the sample's spread alone and have no level over every distribution (Bahadur and Savage 1956):
#: a harm carried by a rare point mass that the sample missed is certified as an improvement (docs/theory.md, §8.6,
#: measures how often). Declared once: the trainer's and the simulator's configs take the type and the default here.
LcbMethod = Literal["betting", "t_unguaranteed", "cantelli_unguaranteed", "t", "cantelli"]
#: The earlier names of the unguaranteed methods, still accepted (with a warning) for their new names.
RENAMED_LCB_METHODS = {"t": "t_unguaranteed", "cantelli": "cantelli_unguaranteed"}
LCB_METHODS: tuple[str, ...] = tuple(m for m in get_args(LcbMethod) if m not in RENAMED_LCB_METHODS)
DEFAULT_LCB_METHOD: LcbMethod = "betting"
#: The betting bound's default range: the capped improvement estimate's at W = 2 ([-1, W - 1]).
DEFAULT_LCB_RANGE = (-1.0, IMPROVEMENT_WEIGHT_CAP - 1.0)


def lcb_method(name: str) -> str:
    """``name`` as one of ``LCB_METHODS`` (an earlier name with a one-line warning); ValueError otherwise."""
    if name in RENAMED_LCB_METHODS:
        import warnings

        warnings.warn(f"lcb method {name!r} is now called {RENAMED_LCB_METHODS[name]!r} (it has no guarantee)",
                      FutureWarning, stacklevel=3)  # a user's word: shown by default
        return RENAMED_LCB_METHODS[name]
    if name not in LCB_METHODS:
        raise ValueError(f"method: expected one of {', '.join(LCB_METHODS)}, got {name!r}")
    return name


def certificate_abstains(n: int, min_count: int = CERTIFICATE_MIN_PROMPTS, method: str = DEFAULT_LCB_METHOD
                         ) -> str | None:
    """Why ``lower_confidence_bound`` gives nan for ``n`` estimates (None when it gives a bound): one line. The
    betting bound abstains only without values."""
    if method == "betting":
        return None if n >= 1 else "no held-out prompts: heldout/improvement_lcb is nan"
    if n >= max(min_count, 2):
        return None
    return (f"{n} held-out prompt{'s' if n != 1 else ''} per step: the {method} bound needs at least "
            f"{max(min_count, 2)}; heldout/improvement_lcb is nan")


def certificate_floor(n: int, level: float = 0.95, low: float = DEFAULT_LCB_RANGE[0],
                      high: float = DEFAULT_LCB_RANGE[1]) -> float:
    """The smallest change the betting certificate can certify from ``n`` values in [``low``, ``high``]: n values all
    equal to it are certified, any sample of n values with a smaller mean is not (``betting.smallest_certified_mean``).
    """
    from .betting import smallest_certified_mean

    return smallest_certified_mean(n, level, low, high)


def lower_confidence_bound(values, level: float = 0.95, *, method: LcbMethod = DEFAULT_LCB_METHOD,
                           low: float = DEFAULT_LCB_RANGE[0], high: float = DEFAULT_LCB_RANGE[1],
                           min_count: int = CERTIFICATE_MIN_PROMPTS) -> float:
    """A one-sided lower confidence bound at ``level`` on the expectation of n independent values ``values`` (each
    with the same expectation, e.g. the per-prompt ``capped_improvement_estimate`` of held-out prompts; an array
    (..., n) gives one bound per row).

    ``betting`` (default): the values must lie in [``low``, ``high``] (default [-1, 1], the capped estimate's range
    at W = 2; a value outside raises ValueError) and then, by the theorem of ``grpo_theory.betting``, the bound is
    below the expectation with probability at least ``level`` whatever their distribution on that range, at every n.
    ``t_unguaranteed`` and ``cantelli_unguaranteed`` (earlier ``t``, ``cantelli``) ignore the range and have no
    such guarantee (``LcbMethod``); they abstain (nan) below ``min_count`` values."""
    if not 0.5 <= level < 1:
        raise ValueError(f"level: must be in [0.5, 1), got {level}")
    method = lcb_method(method)
    x = np.asarray(values, dtype=np.float64)
    x = x.reshape(-1) if x.ndim <= 1 else x  # (..., n): one bound per row, vectorised for coverage studies
    n = x.shape[-1]
    if certificate_abstains(n, min_count, method) is not None:
        return float("nan") if x.ndim == 1 else np.full(x.shape[:-1], np.nan)
    if method == "betting":
        from .betting import betting_lower_bound

        return betting_lower_bound(x, level, low, high)
    from scipy import stats

    width = np.sqrt(level / (1 - level)) if method == "cantelli_unguaranteed" else stats.t.ppf(level, n - 1)
    bound = x.mean(axis=-1) - width * x.std(axis=-1, ddof=1) / np.sqrt(n)
    return float(bound) if x.ndim == 1 else bound


def improvement_certificate(r, w_new, w_k, level: float = 0.95, method: LcbMethod = DEFAULT_LCB_METHOD,
                            cap: float = IMPROVEMENT_WEIGHT_CAP) -> dict[str, float]:
    """The improvement certificate of one step from P independent groups (rewards ``r`` in [0, 1], weights (P, G)):
    ``lcb``, a lower confidence bound at ``level`` on J(pi) - J(pi_k) (positive: the step is certified), and with the
    betting method ``e_value`` (the betting capital against "no improvement": >= 1/(1 - level) exactly when certified;
    an e-value, so steps' values combine across a run) and ``capped`` (the mean of the capped estimates, a lower
    bound's estimate). Betting bounds ``capped_improvement_estimate`` at ``cap`` on its range [-1, cap - 1]; the
    unguaranteed methods bound the unbiased ``improvement_estimate``."""
    method = lcb_method(method)
    if method != "betting":
        return {"lcb": lower_confidence_bound(improvement_estimate(r, w_new, w_k), level, method=method)}
    from .betting import e_value

    per = capped_improvement_estimate(r, w_new, w_k, cap)
    low, high = -1.0, cap - 1.0
    if per.size == 0 or np.isnan(per).any():  # no groups, or a broken weight (nan): no certificate, not a crash
        return {"lcb": float("nan"), "e_value": float("nan"), "capped": float("nan")}
    return {"lcb": lower_confidence_bound(per, level, low=low, high=high),
            "e_value": e_value(per, level, low, high), "capped": float(np.mean(per))}


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

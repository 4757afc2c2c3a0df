"""Betting confidence bounds on the mean of bounded independent values (Waudby-Smith and Ramdas, "Estimating means
of bounded random variables by betting", JRSS-B 2024), the improvement certificate's bound (docs/theory.md, §8.6).

The theorem: let y_1..y_n be independent (or only each with conditional mean mu given the ones before it) and in
[0, 1]. For a candidate mean m, a gambler who starts with capital 1 and bets lambda_i (x) (y_i - m) on each in turn
holds K_n(m) = prod_i (1 + lambda_i (y_i - m)). If every lambda_i is chosen before y_i is seen (predictable) and lies
in [0, 1/m), every factor is positive and, whenever mu <= m, E[1 + lambda_i (y_i - m) | past] = 1 + lambda_i (mu - m)
<= 1: K(m) is a nonnegative supermartingale, and by Ville's inequality P(sup_i K_i(m) >= 1/a) <= a. So
{m : K_n(m) < 1/a} holds mu with probability >= 1 - a, whatever the distribution on [0, 1]: no shape, no variance,
no sample size assumed. Each factor is non-increasing in m (``capital``), so that set is an interval [l, 1] and l is
the lower confidence bound; K_n(m0) is an e-value for the null mu <= m0 (its expectation under the null is at most
1), and l > m0 exactly when K_n(m0) >= 1/a.

The bets are WSR's predictable plug-in for a fixed n, upward only (a one-sided bound; their hedged process splits the
capital theta : 1 - theta between an upward and a downward gambler for a two-sided interval, and theta = 1 is the
one-sided case used here): lambda_i = sqrt(2 log(1/a) / (n sigma_{i-1}^2)), with sigma_{i-1}^2 the regularised
variance of y_1..y_{i-1} about their running means (1/4 and 1/2 as prior pseudo-observations), truncated at c/m with
c = 1/2. The truncation keeps the bet valid; the tuning only decides the power.

What it cannot do: certify from a sample that has not seen the harm. A mean near a point mass at the end of the range
that a small sample misses is covered because the bound never goes above what the sample's values allow for every
distribution on [0, 1]; the price is that n values must sit well above m0 before K_n(m0) reaches 1/a
(``smallest_certified_mean``).
"""

from __future__ import annotations

import numpy as np

#: WSR's truncation of the bets: lambda_i <= TRUNCATION / m (any value below 1 keeps the capital positive).
TRUNCATION = 0.5
#: Bisection steps for the bound (the bracket shrinks to 2^-40 of the range; the bound reported is its lower end).
BISECTION_STEPS = 40


def plug_in_bets(y: np.ndarray, alpha: float) -> np.ndarray:
    """WSR's predictable plug-in bets for a fixed n, before truncation: lambda_i = sqrt(2 log(1/alpha) /
    (n sigma_{i-1}^2)), sigma_{i-1}^2 from y_1..y_{i-1} only. ``y`` (..., n) in [0, 1]."""
    y = np.asarray(y, dtype=np.float64)
    n = y.shape[-1]
    i = np.arange(1, n + 1)
    mu = (0.5 + np.cumsum(y, axis=-1)) / (i + 1)  # mu_i from y_1..y_i
    sq = np.cumsum((y - mu) ** 2, axis=-1)
    sigma2 = (0.25 + sq) / (i + 1)  # sigma_i^2 from y_1..y_i
    previous = np.concatenate([np.full(y.shape[:-1] + (1,), 0.25), sigma2[..., :-1]], axis=-1)  # sigma_{i-1}^2
    return np.sqrt(2.0 * np.log(1.0 / alpha) / (n * previous))


def log_capital(y: np.ndarray, m, bets: np.ndarray) -> np.ndarray:
    """log K_n(m) = sum_i log(1 + min(bet_i, TRUNCATION/m) (y_i - m)) for ``y`` (..., n) and ``m`` (...,) in [0, 1):
    non-increasing in m (each factor is: for m <= TRUNCATION/bet it is 1 + bet (y - m); above, 1 + TRUNCATION (y/m
    - 1), and y >= 0)."""
    m = np.asarray(m, dtype=np.float64)[..., None]
    with np.errstate(divide="ignore"):
        lam = np.minimum(bets, np.where(m > 0, TRUNCATION / np.maximum(m, 1e-300), np.inf))
    return np.sum(np.log1p(lam * (y - m)), axis=-1)


def _unit(values, low: float, high: float) -> np.ndarray:
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ValueError(f"range: need finite low < high, got [{low}, {high}]")
    x = np.asarray(values, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("values: nan among them (a broken estimate): no bound")
    if (x < low).any() or (x > high).any():
        raise ValueError(f"values: outside the stated range [{low:g}, {high:g}] (min {x.min():g}, max {x.max():g}): "
                         "the betting bound's guarantee holds only inside it")
    return np.clip((x - low) / (high - low), 0.0, 1.0)


def betting_lower_bound(values, level: float, low: float, high: float) -> np.ndarray | float:
    """The lower confidence bound at ``level`` on the mean of independent ``values`` (..., n) known to lie in
    [``low``, ``high``]: inf {m : K_n(m) < 1/(1 - level)} (module docstring), in the values' units, one per row.
    Values outside the range raise ``ValueError``: the guarantee needs the range."""
    y = _unit(values, low, high)
    alpha = 1.0 - level
    bets = plug_in_bets(y, alpha)
    threshold = np.log(1.0 / alpha)
    lo, hi = np.zeros(y.shape[:-1]), np.ones(y.shape[:-1])  # K(lo) >= threshold (or lo = 0), K(hi) < threshold
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        rejected = log_capital(y, mid, bets) >= threshold
        lo, hi = np.where(rejected, mid, lo), np.where(rejected, hi, mid)
    bound = low + (high - low) * lo
    return float(bound) if np.ndim(bound) == 0 else bound


def e_value(values, level: float, low: float, high: float, null: float = 0.0) -> np.ndarray | float:
    """K_n(m0) for the null "mean <= ``null``" (m0 its place in the range), with the bets ``betting_lower_bound`` uses
    at ``level``: an e-value (expectation at most 1 under the null), >= 1/(1 - level) exactly when the bound is above
    ``null``."""
    y = _unit(values, low, high)
    m0 = (null - low) / (high - low)
    if not 0 <= m0 < 1:
        raise ValueError(f"null: must lie in [{low:g}, {high:g}), got {null:g}")
    out = np.exp(log_capital(y, np.full(y.shape[:-1], m0), plug_in_bets(y, 1.0 - level)))
    return float(out) if np.ndim(out) == 0 else out


def smallest_certified_mean(n: int, level: float, low: float, high: float, null: float = 0.0) -> float:
    """The smallest value v such that n values all equal to v give a bound above ``null``: no sample of n values whose
    mean is at most this can be certified (a spread sample needs a larger mean). Bisection over v."""
    lo, hi = null, high
    if betting_lower_bound(np.full(n, high), level, low, high) <= null:
        return float("inf")  # not even n values at the top of the range certify
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if betting_lower_bound(np.full(n, mid), level, low, high) > null:
            hi = mid
        else:
            lo = mid
    return hi


def spent_level(level: float, look: int) -> float:
    """The level of the ``look``-th of any number of bounds (1, 2, ...) whose misses add up to at most 1 - ``level``:
    1 - (1 - level) 6 / (pi^2 look^2) (alpha-spending; sum over looks of 6/(pi^2 j^2) = 1). Every bound holds at once
    with probability >= ``level``, however many are read."""
    if look < 1:
        raise ValueError(f"look: must be >= 1, got {look}")
    return 1.0 - (1.0 - level) * 6.0 / (np.pi**2 * look**2)


def e_bh(e_values, level: float) -> np.ndarray:
    """e-BH (Wang and Ramdas, JRSS-B 2022) over e-values of any dependence: the hypotheses rejected so that the
    expected share of true nulls among them is at most 1 - ``level``: the k* largest, k* = max{k : e_(k) >= n /
    ((1 - level) k)}. nan e-values count as 0 (nothing learnt). True where rejected."""
    e = np.nan_to_num(np.asarray(e_values, dtype=np.float64), nan=0.0)
    n = e.size
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    order = np.argsort(-e, kind="stable")
    k = np.arange(1, n + 1)
    ok = e[order] >= n / ((1.0 - level) * k)
    if ok.any():
        out[order[: int(k[ok].max())]] = True
    return out


def alpha_spending(e_values, level: float) -> np.ndarray:
    """The j-th e-value (1-based, in order) rejected when it is at least 1 / (1 - ``spent_level(level, j)``): with
    probability >= ``level`` no true null is rejected at all, over a run of any length (the union bound). True where
    rejected."""
    e = np.nan_to_num(np.asarray(e_values, dtype=np.float64), nan=0.0)
    thresholds = np.array([1.0 / (1.0 - spent_level(level, j)) for j in range(1, e.size + 1)])
    return e >= thresholds

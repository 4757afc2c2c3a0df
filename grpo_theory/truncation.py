"""Truncated sampling (top-k, top-p, min-p) as a policy of its own (docs/theory.md, §1.1).

A sampler asked for ``top_k``, ``top_p`` or ``min_p`` does not sample from softmax(z / T): it samples from that
distribution restricted to a *kept set* of tokens and renormalised. The project defines the policy that way on both
sides: alpha is the filtered distribution of the sampler's weights, and pi_theta (pi_k, pi_{k+1}) the filtered
distribution of the trainer's weights, each with its own kept set. The importance weight pi_k/alpha is then the ratio
of two filtered distributions, exact, and Theorem 1 (which holds for any three policies) bounds the improvement of
the filtered policy, the one that is deployed.

The kept set, in vLLM's order (``vllm/v1/sample/sampler.py``: temperature, then the min-p processor, then top-k, then
top-p), for logits z already divided by T:

    min_p  keep z_i with p_i >= min_p max_j p_j                      (p = softmax(z))
    top_k  keep the k largest of what is left (every token tied with the k-th)
    top_p  sort what is left ascending, renormalise, take the cumulative sums c; drop the tokens with c <= 1 - top_p,
           never the largest

Each step keeps an upper set of z, so the kept set is {i : z_i >= tau} for one threshold tau per row
(``kept_threshold``); the filtered log-probability is z_i - logsumexp_{z_j >= tau} z_j on the set and -inf off it.
The neutral values (top_k 0, top_p 1, min_p 0) keep every token: the plain softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenFilter:
    """The truncation of a next-token distribution (TRL's and vLLM's names): ``top_k`` (0: off), ``top_p`` in
    (0, 1] (1: off), ``min_p`` in [0, 1) (0: off)."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        if self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0 (0: off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must lie in (0, 1] (1: off), got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p: must lie in [0, 1) (0: off), got {self.min_p}")

    @property
    def active(self) -> bool:
        """Whether any token can be dropped."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


#: No truncation: the plain softmax.
NO_FILTER = TokenFilter()


def kept_threshold(z, token_filter: TokenFilter) -> np.ndarray:
    """tau per row of ``z`` (..., V), logits already divided by the temperature: the kept set is {z >= tau}
    (-inf: every token). Float64, vLLM's order of the three filters (module docstring)."""
    z = np.asarray(z, dtype=np.float64)
    tau = np.full(z.shape[:-1], -np.inf)
    if token_filter.min_p > 0:
        zmax = z.max(axis=-1)
        tau = np.maximum(tau, zmax + np.log(token_filter.min_p))  # p_i >= min_p p_max  <=>  z_i >= z_max + log min_p
    if token_filter.top_k > 0 and token_filter.top_k < z.shape[-1]:
        kth = -np.sort(-z, axis=-1)[..., token_filter.top_k - 1]
        tau = np.maximum(tau, kth)
    if token_filter.top_p < 1.0:
        masked = np.where(z >= tau[..., None], z, -np.inf)
        srt = np.sort(masked, axis=-1)  # ascending
        p = np.exp(srt - srt[..., -1:])
        c = np.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
        drop = c <= 1.0 - token_filter.top_p
        drop[..., -1] = False
        first_kept = np.argmin(drop, axis=-1)  # drop is True on a prefix: its first False
        tau = np.maximum(tau, np.take_along_axis(srt, first_kept[..., None], axis=-1)[..., 0])
    return tau


def filtered_log_softmax(z, token_filter: TokenFilter = NO_FILTER) -> np.ndarray:
    """log of the filtered distribution of ``z`` (..., V) (logits divided by T): z_i - logsumexp over the kept set
    on it, -inf off it."""
    z = np.asarray(z, dtype=np.float64)
    kept = z >= kept_threshold(z, token_filter)[..., None]
    masked = np.where(kept, z, -np.inf)
    top = masked.max(axis=-1, keepdims=True)
    return masked - (top + np.log(np.exp(masked - top).sum(axis=-1, keepdims=True)))


def filtered_policy(logits, temperature: float = 1.0, token_filter: TokenFilter = NO_FILTER) -> np.ndarray:
    """The distribution a sampler draws from: softmax(logits / T) restricted to the kept set and renormalised."""
    return np.exp(filtered_log_softmax(np.asarray(logits, dtype=np.float64) / temperature, token_filter))

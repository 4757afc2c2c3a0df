"""Truncated sampling (top-k, top-p, min-p) as a policy of its own (docs/theory.md, §1.1).

A sampler asked for ``top_k``, ``top_p`` or ``min_p`` does not sample from softmax(z / T): it samples from that
distribution restricted to a *kept set* of tokens and renormalised. The project defines the policy that way on both
sides: alpha is the filtered distribution of the sampler's weights, and pi_theta (pi_k, pi_{k+1}) the filtered
distribution of the trainer's weights, each with its own kept set. The importance weight pi_k/alpha is then the ratio
of two filtered distributions, exact, and Theorem 1 (which holds for any three policies) bounds the improvement of
the filtered policy, the one that is deployed.

The kept set, in vLLM's order (``vllm/v1/sample/sampler.py``: temperature, then the min-p processor, then top-k, then
top-p, ``vllm/v1/sample/ops/topk_topp_sampler.py``: ``apply_top_k_top_p_pytorch``), for logits z already divided by T:

    min_p  keep z_i with p_i >= min_p max_j p_j                      (p = softmax(z))
    top_k  keep the k largest of what is left (every token tied with the k-th)
    top_p  sort what is left ascending, renormalise, take the cumulative sums c; drop the positions with
           c <= 1 - top_p, never the last

top-p cuts by position, so it can split a tie at the boundary: the kept set is {z > tau} and {z = tau, column >= c}
for a boundary value tau and a first kept column c per row (``kept_boundary``; ties ordered by column). The samplers'
own sorts order ties otherwise (the torch twin, ``llm.tensors.token_filter.kept_mask``, uses their sort and keeps their
tied tokens), which changes which tied tokens are kept but never how many, so never the normaliser: the filtered
log-probability of a kept token is z_i - logsumexp over the kept set, -inf off it. The
neutral values (top_k 0, top_p 1, min_p 0) keep every token: the plain softmax. On a GPU vLLM cuts with its own
kernels, which differ at ties (docs/theory.md, §1.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .core import softmax


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


def kept_boundary(z, token_filter: TokenFilter) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``z`` (..., V), logits already divided by the temperature: the boundary value tau and the first kept
    column c among the tokens equal to it; the kept set is {z > tau} and {z = tau, column >= c} (``kept_mask``).
    Float64, vLLM's three filters in its order (module docstring): tau is the smallest kept value (the smallest
    finite one when nothing is dropped), c is 0 unless top-p's cut splits a tie (ties ordered by column)."""
    masked = np.asarray(z, dtype=np.float64)
    if token_filter.min_p > 0:
        p = softmax(masked)
        masked = np.where(p < token_filter.min_p * p.max(axis=-1, keepdims=True), -np.inf, masked)
    if 0 < token_filter.top_k < masked.shape[-1]:
        kth = -np.sort(-masked, axis=-1)[..., token_filter.top_k - 1:token_filter.top_k]
        masked = np.where(masked < kth, -np.inf, masked)
    if token_filter.top_p < 1.0:
        idx = np.argsort(masked, axis=-1, kind="stable")  # ascending; ties in column order
        srt = np.take_along_axis(masked, idx, axis=-1)
        drop = np.cumsum(softmax(srt), axis=-1) <= 1.0 - token_filter.top_p
        drop[..., -1] = False
        first = np.argmin(drop, axis=-1)[..., None]  # drop is True on a prefix: its first False
        return np.take_along_axis(srt, first, axis=-1)[..., 0], np.take_along_axis(idx, first, axis=-1)[..., 0]
    tau = np.where(np.isneginf(masked), np.inf, masked).min(axis=-1)
    return tau, np.zeros(masked.shape[:-1], dtype=np.int64)


def kept_mask(z, token_filter: TokenFilter) -> np.ndarray:
    """The kept set (..., V) bool of every row of ``z``: {z > tau} and {z = tau, column >= c} (``kept_boundary``)."""
    z = np.asarray(z, dtype=np.float64)
    tau, first = kept_boundary(z, token_filter)
    col = np.arange(z.shape[-1])
    return (z > tau[..., None]) | ((z == tau[..., None]) & (col >= first[..., None]))


def filtered_log_softmax(z, token_filter: TokenFilter = NO_FILTER) -> np.ndarray:
    """log of the filtered distribution of ``z`` (..., V) (logits divided by T): z_i - logsumexp over the kept set
    on it, -inf off it."""
    z = np.asarray(z, dtype=np.float64)
    masked = np.where(kept_mask(z, token_filter), z, -np.inf)
    top = masked.max(axis=-1, keepdims=True)
    return masked - (top + np.log(np.exp(masked - top).sum(axis=-1, keepdims=True)))


def filtered_policy(logits, temperature: float = 1.0, token_filter: TokenFilter = NO_FILTER) -> np.ndarray:
    """The distribution a sampler draws from: softmax(logits / T) restricted to the kept set and renormalised."""
    return np.exp(filtered_log_softmax(np.asarray(logits, dtype=np.float64) / temperature, token_filter))

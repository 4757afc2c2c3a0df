"""top-k, top-p and min-p in torch: the twin of ``grpo_theory.truncation`` (docs/theory.md, §1.1), used on both sides
of the importance weight. The samplers draw from the filtered distribution (vLLM with its own kernels, the
transformers sampler with ``filtered_logits`` in its last logits processor), and the trainer's log-probabilities of
pi_theta, pi_k, alpha and pi_ref are those of the filtered distributions of their weights (``llm.core.logprobs``), so
pi_k/alpha is exact.

The kept set is vLLM's, step by step and in its arithmetic (``vllm/v1/sample/ops/topk_topp_sampler.py``:
``apply_top_k_top_p_pytorch``; its min-p logits processor): min-p on the softmax (p >= min_p max p, min_p in the
logits' dtype), then top-k (every token tied with the k-th value kept), then top-p on what is left: sort ascending,
cumulative softmax, drop the positions whose sum is <= 1 - top_p (computed in the logits' dtype), never the last. The
top-p cut is by position, so a tie at the boundary is split: ``kept_boundary`` gives per row the boundary value tau
and the first kept column c among the tokens equal to it, and the kept set is {z > tau} and {z = tau, column >= c}
(ties ordered by column, a stable sort; vLLM's and transformers' unstable sorts order ties otherwise, which changes
which tied tokens are kept, never how many, so never the normaliser). A sampled token tied at the boundary was kept
by its sampler whatever the order: the trainer's log-probability of a target (``llm.core.logprobs``) counts it as kept.

A token outside the kept set has probability 0. Its log-probability is stored as ``OFF_SET_LOGP`` (-10^4) rather
than -inf: exp of it is exactly 0 in float32 and float64, and products with a zero mask stay finite where -inf
would give NaN. A ratio with such a token in the numerator is 0; in the denominator (alpha could not have sampled
it: only a sync gap or a float difference at the boundary does that) it overflows and is capped like any stale
ratio.
"""

from __future__ import annotations

import math

import torch

from grpo_theory.truncation import NO_FILTER, TokenFilter

__all__ = ["NO_FILTER", "OFF_SET_LOGP", "ON_SET_LOGP", "TokenFilter", "filtered_log_softmax", "filtered_logits", "kept_boundary",
           "kept_from", "kept_mask"]

#: The stored log-probability of a token the filter drops (module docstring), and the line below which a
#: log-probability is read as such a token rather than as a number to average.
OFF_SET_LOGP = -1.0e4
ON_SET_LOGP = OFF_SET_LOGP / 10


def kept_boundary(z: torch.Tensor, token_filter: TokenFilter) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``z`` (..., V) (logits already divided by T): the boundary value tau and the first kept column c among
    the tokens equal to it; the kept set is ``kept_from(z, tau, c)`` (module docstring). tau is the smallest kept value
    (the smallest finite one when nothing is dropped), c 0 unless top-p splits a tie.
    ``grpo_theory.truncation.kept_boundary`` in torch (tested equal)."""
    masked = z
    if token_filter.min_p > 0:
        p = masked.softmax(dim=-1)
        floor = p.amax(dim=-1, keepdim=True) * torch.tensor(token_filter.min_p, dtype=z.dtype, device=z.device)
        masked = masked.masked_fill(p < floor, -math.inf)
    if 0 < token_filter.top_k < z.shape[-1]:
        masked = masked.masked_fill(masked < masked.topk(token_filter.top_k, dim=-1).values[..., -1:], -math.inf)
    if token_filter.top_p < 1.0:
        srt, idx = masked.sort(dim=-1, stable=True)  # ascending; ties in column order
        limit = 1 - torch.tensor(token_filter.top_p, dtype=z.dtype, device=z.device)  # vLLM's 1 - p, in its dtype
        drop = srt.softmax(dim=-1).cumsum(dim=-1) <= limit
        drop[..., -1] = False
        first = drop.to(torch.uint8).argmin(dim=-1, keepdim=True)  # drop holds on a prefix: its first False
        return srt.gather(-1, first)[..., 0], idx.gather(-1, first)[..., 0]
    tau = masked.masked_fill(torch.isneginf(masked), math.inf).amin(dim=-1)
    return tau, torch.zeros(z.shape[:-1], dtype=torch.long, device=z.device)


def kept_from(z: torch.Tensor, tau: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """The kept set (..., V) bool of ``kept_boundary``'s (tau, c): {z > tau} and {z = tau, column >= c}."""
    col = torch.arange(z.shape[-1], device=z.device)
    return (z > tau[..., None]) | ((z == tau[..., None]) & (col >= first[..., None]))


def kept_mask(z: torch.Tensor, token_filter: TokenFilter) -> torch.Tensor:
    """The kept set of every row of ``z`` (..., V), bool."""
    return kept_from(z, *kept_boundary(z, token_filter))


def filtered_logits(z: torch.Tensor, token_filter: TokenFilter) -> torch.Tensor:
    """``z`` with -inf off the kept set (a new tensor; ``z`` itself when the filter drops nothing)."""
    if not token_filter.active:
        return z
    return z.masked_fill(~kept_mask(z, token_filter), -math.inf)


def filtered_log_softmax(z: torch.Tensor, token_filter: TokenFilter = NO_FILTER) -> torch.Tensor:
    """log of the filtered distribution of ``z`` (..., V): z - logsumexp over the kept set on it, ``OFF_SET_LOGP``
    off it (the plain log-softmax without a filter)."""
    if not token_filter.active:
        return torch.log_softmax(z, dim=-1)
    logq = torch.log_softmax(filtered_logits(z, token_filter), dim=-1)
    return logq.clamp(min=OFF_SET_LOGP)

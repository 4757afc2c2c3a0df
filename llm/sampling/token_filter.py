"""top-k, top-p and min-p in torch: the twin of ``grpo_theory.truncation`` (docs/theory.md, §1.1), used on both sides
of the importance weight. The samplers draw from the filtered distribution (vLLM with its own kernels, the
transformers sampler with ``filtered_logits`` in its last logits processor), and the trainer's log-probabilities of
pi_theta, pi_k, alpha and pi_ref are those of the filtered distributions of their weights (``llm.logprobs``), so
pi_k/alpha is exact. The kept set is {z >= tau} for one threshold per row (``kept_threshold``), in vLLM's order:
min-p, top-k, top-p.

A token outside the kept set has probability 0. Its log-probability is stored as ``OFF_SET_LOGP`` (-10^4) rather
than -inf: exp of it is exactly 0 in float32 and float64, and products with a zero mask stay finite where -inf
would give NaN. A ratio with such a token in the numerator is 0; in the denominator (alpha could not have sampled
it: only a sync gap or a float tie at the boundary does that) it overflows and is capped like any stale ratio.
"""

from __future__ import annotations

import math

import torch

from grpo_theory.truncation import NO_FILTER, TokenFilter

__all__ = ["NO_FILTER", "OFF_SET_LOGP", "TokenFilter", "filtered_log_softmax", "filtered_logits", "kept_threshold"]

#: The stored log-probability of a token the filter drops (module docstring).
OFF_SET_LOGP = -1.0e4


def kept_threshold(z: torch.Tensor, token_filter: TokenFilter) -> torch.Tensor:
    """tau per row of ``z`` (..., V) (logits already divided by T, float32 or wider): the kept set is {z >= tau};
    -inf where nothing is dropped. ``grpo_theory.truncation.kept_threshold`` in torch (tested equal)."""
    tau = torch.full(z.shape[:-1], -math.inf, dtype=z.dtype, device=z.device)
    if token_filter.min_p > 0:
        tau = torch.maximum(tau, z.amax(dim=-1) + math.log(token_filter.min_p))
    if 0 < token_filter.top_k < z.shape[-1]:
        tau = torch.maximum(tau, z.topk(token_filter.top_k, dim=-1).values[..., -1])
    if token_filter.top_p < 1.0:
        masked = torch.where(z >= tau[..., None], z, torch.full_like(z, -math.inf))
        srt = masked.sort(dim=-1).values  # ascending
        drop = srt.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - token_filter.top_p
        drop[..., -1] = False
        first_kept = drop.to(torch.uint8).argmin(dim=-1, keepdim=True)  # drop holds on a prefix: its first False
        tau = torch.maximum(tau, srt.gather(-1, first_kept)[..., 0])
    return tau


def filtered_logits(z: torch.Tensor, token_filter: TokenFilter) -> torch.Tensor:
    """``z`` with -inf off the kept set (a new tensor; ``z`` itself when the filter drops nothing)."""
    if not token_filter.active:
        return z
    return z.masked_fill(z < kept_threshold(z, token_filter)[..., None], -math.inf)


def filtered_log_softmax(z: torch.Tensor, token_filter: TokenFilter = NO_FILTER) -> torch.Tensor:
    """log of the filtered distribution of ``z`` (..., V): z - logsumexp over the kept set on it, ``OFF_SET_LOGP``
    off it (the plain log-softmax without a filter)."""
    if not token_filter.active:
        return torch.log_softmax(z, dim=-1)
    logq = torch.log_softmax(filtered_logits(z, token_filter), dim=-1)
    return logq.clamp(min=OFF_SET_LOGP)

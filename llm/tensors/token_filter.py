"""top-k, top-p and min-p in torch: the twin of ``grpo_theory.truncation`` (docs/theory.md, §1.1), used on both sides
of the importance weight. The samplers draw from the filtered distribution (vLLM with its own kernels, the
transformers sampler with ``filtered_logits`` in its last logits processor), and the trainer's log-probabilities of
pi_theta, pi_k, alpha and pi_ref are those of the filtered distributions of their weights (``llm.tensors.logprobs``), so
pi_k/alpha is exact.

The kept set is vLLM's, step by step and in its arithmetic (``vllm/v1/sample/ops/topk_topp_sampler.py``:
``apply_top_k_top_p_pytorch``; its min-p logits processor): min-p on the softmax (p >= min_p max p, min_p in the
logits' dtype), then top-k (every token tied with the k-th value kept), then top-p on what is left: sort ascending
with the same call as vLLM's CPU path and transformers' ``TopPLogitsWarper`` (``Tensor.sort``, not stable: its order
of tied values is the one those samplers use), cumulative softmax, drop the positions whose sum is <= 1 - top_p
(computed in the logits' dtype), never the last (``kept_mask``). The top-p cut is by position, so a tie at the
boundary value tau (``boundary_value``) is split, and which of the tied tokens are kept is that sort's order: on the
same logits the kept set is vLLM's and transformers', row for row, tied tokens included (tested on bfloat16 rows
with ties, for batches of any size). The trainer's logits differ from the sampler's by float rounding, so a token
the sampler drew from a tie at its boundary can fall outside the trainer's cut: the trainer's log-probability of a
target (``llm.tensors.logprobs``) then swaps it into the kept set in place of a tied token of the same value
(``swap_in_targets``), so that its value and its gradient are those of a distribution that kept the token drawn.

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

__all__ = ["NO_FILTER", "OFF_SET_LOGP", "ON_SET_LOGP", "TokenFilter", "apply_swaps", "boundary_value",
           "filtered_log_softmax", "filtered_logits", "kept_mask", "swap_in_targets"]

#: The stored log-probability of a token the filter drops (module docstring), and the line below which a
#: log-probability is read as such a token rather than as a number to average.
OFF_SET_LOGP = -1.0e4
ON_SET_LOGP = OFF_SET_LOGP / 10


def _min_p(z: torch.Tensor, token_filter: TokenFilter) -> torch.Tensor:
    """``z`` with -inf where min-p drops a token (vLLM's min-p logits processor, before its sampler's sort)."""
    if token_filter.min_p <= 0:
        return z
    p = z.softmax(dim=-1)
    floor = p.amax(dim=-1, keepdim=True) * torch.tensor(token_filter.min_p, dtype=z.dtype, device=z.device)
    return z.masked_fill(p < floor, -math.inf)


def kept_mask(z: torch.Tensor, token_filter: TokenFilter) -> torch.Tensor:
    """The kept set of every row of ``z`` (..., V) (logits already divided by T), bool: vLLM's own (module
    docstring): min-p, then one ascending sort (its call, so its order of ties), top-k on the sorted values (every
    token tied with the k-th kept) and top-p's cut on them, scattered back. ``grpo_theory.truncation.kept_mask`` in
    torch (tested equal on rows without ties, where the order of ties does not matter)."""
    masked = _min_p(z, token_filter)
    top_k = 0 < token_filter.top_k < z.shape[-1]
    if token_filter.top_p >= 1.0:  # vLLM's top-k alone does not sort: a threshold at the k-th value
        if top_k:
            masked = masked.masked_fill(masked < masked.topk(token_filter.top_k, dim=-1).values[..., -1:], -math.inf)
        return ~torch.isneginf(masked)
    srt, idx = masked.sort(dim=-1)  # ascending, vLLM's call: ties in that sort's order
    if top_k:
        srt = srt.masked_fill(srt < srt.narrow(-1, z.shape[-1] - token_filter.top_k, 1), -math.inf)
    limit = 1 - torch.tensor(token_filter.top_p, dtype=z.dtype, device=z.device)  # vLLM's 1 - p, in its dtype
    drop = srt.softmax(dim=-1).cumsum(dim=-1) <= limit
    drop[..., -1] = False
    drop |= torch.isneginf(srt)
    return ~drop.scatter(-1, idx, drop)


def boundary_value(z: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """tau per row: the smallest kept value of ``z`` (..., V) over the kept set ``kept`` (``kept_mask``)."""
    return z.masked_fill(~kept, math.inf).amin(dim=-1)


def swap_in_targets(z: torch.Tensor, kept: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (n, V) whose target (n,) is tied with the boundary value but outside ``kept``: the sampler kept it (module
    docstring). ``kept`` is changed in place so that the target is kept and the first kept column of the same value
    is not (the count, so every probability's value, unchanged). Returns (whether each row's target is kept now,
    the column swapped out per row, -1 where none)."""
    rows = torch.arange(z.shape[0], device=z.device)
    z_t = z[rows, targets]
    in_set = kept[rows, targets]
    tau = boundary_value(z, kept)
    swap = ~in_set & (z_t == tau)
    out = torch.full_like(targets, -1)
    if bool(swap.any()):
        r = rows[swap]
        out[r] = (kept[r] & (z[r] == tau[r, None])).to(torch.uint8).argmax(dim=-1)
        apply_swaps(kept, targets, out)
    return in_set | swap, out


def apply_swaps(kept: torch.Tensor, targets: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``swap_in_targets``' change from its returned columns: each row's target kept and its column ``out`` not (in
    place; returns ``kept``); the backward re-applies the forward's swaps with it."""
    r = torch.nonzero(out >= 0).squeeze(-1)
    if r.numel():
        kept[r, out[r]] = False
        kept[r, targets[r]] = True
    return kept


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

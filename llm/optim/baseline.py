"""VCPO's off-policy optimal baseline (Huang et al., arXiv 2602.17616; its code mit-han-lab/vcpo, ``grad_baselining``
in its actor config): the baseline b that minimises the second moment of the step's gradient estimate
sum_i (R_i - b) g_i, where g_i is completion i's own gradient at unit advantage and w_i = pi_k/alpha its sequence
weight:

    b* = sum_i W_i R_i / sum_i W_i,   W_i = ||g_i||^2 w_i^2   (/ L_i^2 with ``normalize_by_length``)

over each group of G completions of one prompt (scope group) or over the step's completions (scope minibatch).

The authors accumulate each trajectory's gradient twice (scaled by R_i, and by 1) and subtract b* times the second
sum; the step's gradient is sum_i (R_i - b*) g_i / sigma. Here the baseline moves the advantages instead: with the
group's advantages A_i = (R_i - mean) / s (s the group's scale, or 1), the W-weighted mean of the A_i is
(b* - mean) / s, so A_i minus it is (R_i - b*) / s, the authors' coefficient (``norm_by_std`` is this trainer's
``scale_rewards``); the optimiser then steps on it as on any advantage. The two gradients are equal wherever the
objective is linear in the advantage at the step's weights, as every objective is at pi = pi_k where no clip
binds (the first optimiser step of each batch); with ``num_iterations`` > 1 the later steps' clips act on the
shifted advantages. g_i is the objective's gradient of completion i alone at A = 1, summed over its tokens (the
authors' "unscaled" norm: their aggregation's 1/length and 1/batch undone), without the KL and entropy terms; it
needs one backward pass per completion, as the authors' actor takes with micro-batches of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llm.tensors.batch import Batch
from llm.tensors.loss import Clip, grpo_loss
from llm.tensors.passes import Passes

@dataclass(frozen=True)
class Baselining:
    """The baseline's settings (the authors' names under ``grad_baselining``)."""

    scope: str = "group"
    use_is_weights: bool = True
    normalize_by_length: bool = False


def baseline_log_weights(grad_norm: np.ndarray, log_w: np.ndarray, lengths: np.ndarray,
                         settings: Baselining) -> np.ndarray:
    """log W_i = 2 log ||g_i|| (+ 2 log w_i with ``use_is_weights``) (- 2 log L_i with ``normalize_by_length``):
    in logs, so that a sequence weight e^500 neither overflows nor turns the baseline into nan. -inf where
    ||g_i|| = 0 or L_i = 0 (no weight)."""
    with np.errstate(divide="ignore"):
        out = 2.0 * np.log(np.asarray(grad_norm, dtype=np.float64))
        if settings.use_is_weights:
            out = out + 2.0 * np.asarray(log_w, dtype=np.float64)
        if settings.normalize_by_length:
            out = out - 2.0 * np.log(np.asarray(lengths, dtype=np.float64))
    return np.where(np.isfinite(out), out, -np.inf)


def weighted_mean(values: np.ndarray, log_weights: np.ndarray) -> float | None:
    """sum W v / sum W with W = exp(``log_weights``), computed after scaling by the largest W; None when every W
    is 0 (no completion with a gradient)."""
    top = np.max(log_weights) if log_weights.size else -np.inf
    if not np.isfinite(top):
        return None
    w = np.exp(log_weights - top)
    return float(np.sum(w * values) / np.sum(w))


def shift_advantages(advantages: np.ndarray, log_weights: np.ndarray, live: np.ndarray,
                     scope: str) -> tuple[np.ndarray, float]:
    """``advantages`` (P, G) minus their W-weighted mean over each group (scope group) or over the step (minibatch),
    the mean over ``live`` (P, G) completions only (the loss's; the others keep their advantage). A group (or step)
    whose live completions all have W = 0 keeps its advantages. Returns the shifted advantages and the mean |shift|
    over the live completions (0 with none)."""
    adv = np.asarray(advantages, dtype=np.float64)
    live = np.asarray(live, dtype=bool)
    shift = np.zeros_like(adv)
    blocks = [(slice(None),)] if scope == "minibatch" else [(p,) for p in range(adv.shape[0])]
    for block in blocks:
        on = np.zeros_like(live)
        on[block] = live[block]
        b = weighted_mean(adv[on], log_weights[on])
        if b is not None:
            shift[on] = b
    return adv - shift, float(np.abs(shift[live]).mean()) if live.any() else 0.0


def completion_gradient_norms(passes: Passes, clip: Clip, policy: torch.nn.Module, batch: Batch,
                              logp_alpha: torch.Tensor | None, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """||g_i|| and log w_i = sum_t log pi_k/alpha for each row i of ``batch`` where ``live`` (B,): g_i the gradient
    of the objective's ``clip`` term of completion i alone at advantage 1, summed over its loss tokens, at the
    current weights (pi_k); one forward and backward pass per completion. The parameters' gradients are left
    unset (None). Rows not live, or with no loss token, get norm 0 and log w 0."""
    norms, log_w = np.zeros(len(live)), np.zeros(len(live))
    params = [p for p in policy.parameters() if p.requires_grad]
    for i in np.flatnonzero(live):
        rows = torch.tensor([int(i)])
        mb = batch.take(rows)
        t = mb.completion_ids.shape[1]
        fwd = passes.forward(policy, mb, entropy=False)
        logp_k = fwd.logp.detach()
        alpha = logp_k if logp_alpha is None else logp_alpha[rows, :t].to(logp_k.device)
        mask = batch.policy_mask[rows, :t].to(logp_k.device)
        loss, stats = grpo_loss(fwd.logp, logp_k, alpha, torch.ones(1, device=logp_k.device), mask, clip=clip)
        if not stats.tokens:
            continue
        loss.backward()  # (not autograd.grad: reentrant checkpointing supports backward only)
        norms[i] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)))
        policy.zero_grad(set_to_none=True)
        log_w[i] = float(((logp_k - alpha).double() * mask).sum())
    return norms, log_w

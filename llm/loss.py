"""The off-policy clipped GRPO loss: a pure function of tensors (docs/theory.md, §6).

Per completion token (or per sequence with ``ratio_level="sequence"``):

    r  = pi_theta / alpha        (the ratio being optimised)
    r' = pi_k / alpha            (the importance weight of the trainer policy at the step start)
    f  = min(r A, clip(r, max(r' - eps, 0), r' + eps) A)          -- grpo_theory.clip_objective
    loss_token = -f + beta * k3(pi_theta, pi_ref),  k3 = exp(ref - logp) - (ref - logp) - 1

With alpha = pi_k (v = 1) r' = 1 and this is on-policy GRPO/PPO clipping. r' is computed from the
log-probabilities; it is never assumed to be 1.
"""

from __future__ import annotations

from typing import Literal

import torch

LossType = Literal["grpo", "dapo", "dr_grpo"]


def clip_window_torch(ratio_k: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[max(r' - clip, 0), r' + clip]; the torch twin of ``grpo_theory.clip_window`` (tested equal)."""
    return torch.clamp(ratio_k - clip, min=0.0), ratio_k + clip


def clip_flags_torch(ratio: torch.Tensor, ratio_k: torch.Tensor, adv: torch.Tensor, clip: float):
    """Where the clip stops the gradient, ``(low, high)``; the torch twin of ``grpo_theory.clip_flags``."""
    low, high = clip_window_torch(ratio_k, clip)
    return (ratio < low) & (adv < 0), (ratio > high) & (adv > 0)


def clip_objective_torch(ratio: torch.Tensor, ratio_k: torch.Tensor, adv: torch.Tensor, clip: float) -> torch.Tensor:
    """f_eps(r, r', a) elementwise; the torch twin of ``grpo_theory.clip_objective`` (tested equal)."""
    low, high = clip_window_torch(ratio_k, clip)
    clipped = torch.minimum(torch.maximum(ratio, low), high)
    return torch.minimum(ratio * adv, clipped * adv)


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) on tokens sampled from pi: e^d - d - 1, d = ref - logp."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


def normalise(per_token: torch.Tensor, mask: torch.Tensor, loss_type: LossType, max_completion_length: int) -> torch.Tensor:
    """Reduce a (B, T) per-token loss over the tokens where ``mask`` is 1.

    grpo: mean over each sequence's tokens, then mean over sequences that have any token;
    dapo: sum over tokens / number of tokens; dr_grpo: sum / (sequences x max_completion_length).
    Masked-out sequences count in neither numerator nor normaliser.
    """
    total = (per_token * mask).sum()
    if loss_type == "dapo":
        return total / mask.sum().clamp(min=1.0)
    seq_tokens = mask.sum(dim=1)
    n_seq = (seq_tokens > 0).sum().clamp(min=1)
    if loss_type == "dr_grpo":
        return total / (n_seq * max_completion_length)
    if loss_type == "grpo":
        return ((per_token * mask).sum(dim=1) / seq_tokens.clamp(min=1.0)).sum() / n_seq
    raise ValueError(f"loss_type: expected grpo, dapo or dr_grpo, got {loss_type!r}")


def grpo_loss(
    logp: torch.Tensor,
    logp_k: torch.Tensor,
    logp_alpha: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    clip: float,
    loss_type: LossType = "dapo",
    ratio_level: Literal["token", "sequence"] = "token",
    max_completion_length: int = 1,
    beta: float = 0.0,
    logp_ref: torch.Tensor | None = None,
    sequence_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss (to minimise) and statistics of one optimiser step.

    Shapes: ``logp`` (pi_theta, with grad), ``logp_k`` (pi_k), ``logp_alpha`` (alpha), ``logp_ref``:
    (B, T) log-probabilities of the sampled completion tokens, float32; ``advantages`` (B,);
    ``completion_mask`` (B, T), 1 on real completion tokens; ``sequence_mask`` (B,), 0 for
    sequences of masked (zero-variance) groups. ``logp_k`` and ``logp_alpha`` carry no gradient.
    """
    if logp.shape != logp_k.shape or logp.shape != logp_alpha.shape or logp.shape != completion_mask.shape:
        raise ValueError("logp, logp_k, logp_alpha and completion_mask must share one (B, T) shape")
    if beta > 0 and logp_ref is None:
        raise ValueError("logp_ref: needed when beta > 0")
    mask = completion_mask.to(logp.dtype)
    if sequence_mask is not None:
        mask = mask * sequence_mask.to(logp.dtype)[:, None]
    logp_k, logp_alpha = logp_k.detach(), logp_alpha.detach()
    if ratio_level == "token":
        log_ratio = logp - logp_alpha
        log_ratio_k = logp_k - logp_alpha
    elif ratio_level == "sequence":
        cm = completion_mask.to(logp.dtype)
        log_ratio = ((logp - logp_alpha) * cm).sum(dim=1, keepdim=True).expand_as(logp)
        log_ratio_k = ((logp_k - logp_alpha) * cm).sum(dim=1, keepdim=True).expand_as(logp)
    else:
        raise ValueError(f"ratio_level: expected token or sequence, got {ratio_level!r}")
    ratio, ratio_k = torch.exp(log_ratio), torch.exp(log_ratio_k)
    adv = advantages.to(logp.dtype)[:, None]
    objective = clip_objective_torch(ratio, ratio_k, adv, clip)
    per_token = -objective
    kl = None
    if beta > 0:
        kl = k3_kl(logp, logp_ref.detach())
        per_token = per_token + beta * kl
    loss = normalise(per_token, mask, loss_type, max_completion_length)

    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        flag_low, flag_high = clip_flags_torch(ratio, ratio_k, adv, clip)
        is_low, is_high = flag_low.to(mask.dtype) * mask, flag_high.to(mask.dtype) * mask
        on = mask > 0
        rk = ratio_k[on] if on.any() else torch.ones(1)
        stats = {
            "loss": float(loss.detach()),
            "clip_ratio/low_mean": float(is_low.sum() / n),
            "clip_ratio/high_mean": float(is_high.sum() / n),
            "clip_ratio/region_mean": float((is_low + is_high).sum() / n),
            "is_weight/mean": float(rk.mean()),
            "is_weight/min": float(rk.min()),
            "is_weight/max": float(rk.max()),
            "kl": float((kl * mask).sum() / n) if kl is not None else 0.0,
            "num_loss_tokens": float(mask.sum()),
        }
    return loss, stats

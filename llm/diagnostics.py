"""Per-step estimates of the TV distances and of every term of Theorem 1 on a language model (docs/theory.md, §8).

All estimates use the step's own batch: G completions per prompt sampled from alpha.

Sequence-level importance-sampling (IS) estimates, per prompt x, with w(y) = pi(y|x)/alpha(y|x)
the product of the token ratios:
- TV(pi, alpha) = 1/2 E_alpha |w - 1|  ->  1/2 mean_g |w_g - 1|            (``tv/pi_k_alpha``, ``tv/pi_new_alpha``)
- J(pi_{k+1}) - J(pi_k) = E_alpha[(w_new - w_k) r]  ->  mean_g (w_new,g - w_k,g) r_g  (``improvement``)
- the bound's terms come from ``grpo_theory`` applied to the empirical distribution of the group
  (uniform over its G samples): sigma is the group's population std, A its whitened advantage,
  L_alpha(pi) = E_alpha[(w - 1) A] (E_alpha A = 0), and the penalties use the TV estimates above.

Biases, stated plainly:
- pi_{k+1} was fitted on this very batch, so ``tv/pi_new_alpha``, ``bound/surrogate`` and
  ``improvement`` are in-sample (optimistic) estimates, as a training loss is.
- 1/2 E|w - 1| is unbiased for each sample but w is heavy-tailed when pi and alpha are far apart;
  with few samples it underestimates TV (it cannot see mass alpha does not sample).
- sigma from G samples is the plug-in (ddof = 0) value, which keeps s <= 1 as Theorem 1 needs.
- ``bound/*_nonzero_std`` and ``improvement_nonzero_std`` average over the prompts whose group has
  reward variance (the ones the zero-variance mask trains on); elsewhere the weight (1 - s)/s is
  (1 - sqrt(eps))/sqrt(eps), which makes the plain average very negative.
- the tight constant uses reward range 1 (rewards lie in [0, 1]; the true range is unknown).

Token-level upper bounds (``tv/*_tok_ub``): for autoregressive policies,
TV(pi, alpha) <= E_{y~alpha} sum_t TV(pi(.|x, y_<t), alpha(.|x, y_<t)), from full next-token
distributions; averaged over the batch. Exact per position, so no heavy tails, but an upper bound.
"""

from __future__ import annotations

import numpy as np
import torch

import grpo_theory as gt


def tv_rows(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Half-L1 distance between the rows of two (..., V) log-probability tensors (the TV convention of
    ``grpo_theory.tv_distance``, tested equal), computed in float32 without normalisation checks."""
    return 0.5 * (logp_a.float().exp() - logp_b.float().exp()).abs().sum(dim=-1)


def entropy_rows(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of a (..., V) log-probability tensor, in nats."""
    p = logp.float().exp()
    return -(p * logp.float()).sum(dim=-1)


def mean_entropy(logp_full: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean next-token entropy over the completion positions where ``mask`` (B, T) is 1."""
    return float((entropy_rows(logp_full) * mask).sum() / mask.sum())


def sequence_log_ratio(logp: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor, P: int, G: int) -> np.ndarray:
    """log pi(y|x)/alpha(y|x) of every completion, summed over its tokens: float64 array of shape (P, G)."""
    return ((logp - logp_alpha) * mask).sum(1).cpu().numpy().reshape(P, G)


def rollout_metrics(rewards: np.ndarray, zero_std: np.ndarray, completions: list[list[int]], eos: int) -> dict[str, float]:
    """Sampled rewards (P, G), all-equal-reward groups and completion lengths of a step."""
    return {
        "reward": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "frac_reward_zero_std": float(zero_std.mean()),
        "completions/mean_length": float(np.mean([len(c) for c in completions])),
        "completions/clipped_ratio": float(np.mean([len(c) == 0 or c[-1] != eos for c in completions])),
    }


def sampler_gap(logp_sampler: torch.Tensor, logp_trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """|sampler's log alpha - trainer's recomputation| over the completion tokens: mean and worst token."""
    diff = (logp_sampler - logp_trainer).abs() * mask
    return {"sampling/logp_diff_mean": float(diff.sum() / mask.sum()), "sampling/logp_diff_max": float(diff.max())}


def token_tv_upper_bound(logp_a_full: torch.Tensor, logp_b_full: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over sequences of sum_t TV(a_t, b_t) over completion positions (``mask`` (B, T))."""
    per_token = tv_rows(logp_a_full, logp_b_full) * mask
    return float(per_token.sum(dim=1).mean())


def group_bound_estimates(rewards: np.ndarray, log_w_k: np.ndarray, log_w_new: np.ndarray, eps: float) -> dict[str, float]:
    """Theorem 1 estimates from one batch. Shapes (P, G): rewards, and the sequence log-ratios
    log pi_k/alpha and log pi_{k+1}/alpha of every completion. Returns batch means over prompts."""
    r = np.asarray(rewards, dtype=np.float64)
    P, G = r.shape
    w_k, w_new = np.exp(np.asarray(log_w_k, np.float64)), np.exp(np.asarray(log_w_new, np.float64))
    alpha_hat = np.full((P, G), 1.0 / G)  # the group's empirical distribution

    tv_k = 0.5 * np.mean(np.abs(w_k - 1.0), axis=1)
    tv_new = 0.5 * np.mean(np.abs(w_new - 1.0), axis=1)
    adv = gt.whitened_advantage(alpha_hat, r, eps)  # (r - mean) / sqrt(var_pop + eps)
    surrogate = np.mean((w_new - 1.0) * adv, axis=1)
    sigma = gt.reward_std(alpha_hat, r)
    weight = gt.penalty_weight(sigma, eps)
    paper = gt.combine_bound(surrogate, weight, tv_new, tv_k, gt.bound_constant(tight=False))
    tight = gt.combine_bound(surrogate, weight, tv_new, tv_k, gt.bound_constant(tight=True, reward_range=1.0))
    improvement = np.mean((w_new - w_k) * r, axis=1)
    finite_w = weight[np.isfinite(weight)]
    varied = sigma > 0  # the prompts the zero-variance mask keeps
    nz = (lambda x: float(x[varied].mean()) if varied.any() else float("nan"))
    return {
        "tv/pi_k_alpha": float(tv_k.mean()),
        "tv/pi_new_alpha": float(tv_new.mean()),
        "improvement": float(improvement.mean()),
        "bound/surrogate": float(paper.surrogate.mean()),
        "bound/penalty_tv": float(paper.penalty_tv.mean()),
        "bound/penalty_lag": float(paper.penalty_lag.mean()),
        "bound/lower": float(paper.lower.mean()),
        "bound/penalty_tv_tight": float(tight.penalty_tv.mean()),
        "bound/penalty_lag_tight": float(tight.penalty_lag.mean()),
        "bound/lower_tight": float(tight.lower.mean()),
        "bound/frac_lower_tight_positive": float(np.mean(tight.lower > 0)),
        "bound/lower_nonzero_std": nz(paper.lower),
        "bound/lower_tight_nonzero_std": nz(tight.lower),
        "improvement_nonzero_std": nz(improvement),
        "sigma/mean": float(sigma.mean()),
        "sigma/min": float(sigma.min()),
        "bound/weight_mean": float(finite_w.mean()) if finite_w.size else float("inf"),
        "bound/weight_max": float(weight.max()),
        "is_weight_seq/max": float(w_k.max()),
    }

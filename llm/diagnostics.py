"""Per-step estimates of the TV distances and of every term of Theorem 1 on a language model (docs/theory.md, §8).

Every estimate is computed on completions sampled from alpha. For a completion y of prompt x,
w = pi(y|x)/alpha(y|x) is the product of its token ratios. Per prompt:

- TV(pi, alpha)         = 1/2 E_alpha |w - 1|           ->  1/2 mean |w - 1|
- J(pi) - J(pi_k)       = E_alpha[(w_new - w_k) r]       ->  mean (w_new - w_k) r
- L_alpha(pi)           = (J(pi) - J(alpha)) / s          ->  mean (w_new - 1) r / s   (docs/theory.md, §2)

with s = sqrt(sigma^2 + eps), sigma the group's plug-in (ddof = 0) standard deviation (so s <= 1 as
Theorem 1 needs), and the bound's terms assembled by ``grpo_theory.combine_bound``. For a policy that does
not depend on the samples, the TV, improvement and surrogate-numerator estimates are unbiased; s is a
plug-in. What the average is taken over therefore decides the bias:

- ``insample/*``: over the training prompts and their completions. pi_{k+1} was fitted to both, so every
  estimate involving pi_{k+1} is biased: the improvement upwards (the update raises J most on the prompts
  and completions it trained on, and may lower it elsewhere), and TV(pi_{k+1}, alpha) upwards too (the
  update moves probability onto exactly the completions it is then evaluated on).
- ``heldout/*``: over extra prompts drawn independently of the training ones, whose completions never
  entered the loss. pi_k and pi_{k+1} do not depend on them, so the estimates are unbiased for the
  expectation over the prompt distribution.
- ``tv/pi_k_alpha`` on the training batch is unbiased: pi_k depends on no sample of its own step.

Rewards outside [0, 1] (reward functions may return any finite number): Theorem 1 holds for rewards in a known
range [lo, hi] through r' = (r - lo)/(hi - lo), which lies in [0, 1]: every term is computed for r' (its sigma,
s <= 1 and weight) and the terms in units of J (improvement, surrogate, penalties, lower bound) are multiplied
back by hi - lo. ``RewardRange`` holds the range used: [0, 1], widened to every training and held-out reward the
run has seen. A measured range can only be narrower than the true one, and the bound holds only for rewards inside
it; for rewards in [0, 1] nothing changes. With the shift, the improvement estimate is
mean (w_new - w_k)(r - lo), still unbiased (E_alpha[w_new - w_k] = 0).

Chain-rule estimate (``*_chain_ub_est``): TV(pi, alpha) <= E_{y~alpha} sum_t TV(pi(.|x, y_<t), alpha(.|x, y_<t));
the batch mean of the inner sum is a Monte-Carlo estimate of that upper bound, not a bound on each batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import grpo_theory as gt

from .logprobs import TokenDists


@dataclass(frozen=True)
class RewardRange:
    """The reward range Theorem 1's terms are computed for: [0, 1] widened to hold every reward seen so far."""

    lo: float = 0.0
    hi: float = 1.0

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def widened(self, rewards: np.ndarray) -> "RewardRange":
        """The smallest range holding this one and ``rewards``."""
        return RewardRange(min(self.lo, float(np.min(rewards))), max(self.hi, float(np.max(rewards))))

    def rescale(self, rewards: np.ndarray) -> np.ndarray:
        """r' = (r - lo)/(hi - lo), in [0, 1] for rewards inside the range."""
        return (np.asarray(rewards, dtype=np.float64) - self.lo) / self.width


#: Rewards in [0, 1], Theorem 1's own range: r' = r.
UNIT_RANGE = RewardRange()


def tv_rows(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Half-L1 distance between the rows of two (..., V) log-probability tensors (the TV convention of
    ``grpo_theory.tv_distance``, tested equal), computed in float32 without normalisation checks."""
    return 0.5 * (logp_a.float().exp() - logp_b.float().exp()).abs().sum(dim=-1)


def mean_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean next-token entropy (``entropy`` (B, T), nats) over the completion positions where ``mask`` is 1."""
    return float((entropy * mask).sum() / mask.sum())


def sequence_log_ratio(logp: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor, P: int, G: int) -> np.ndarray:
    """log pi(y|x)/alpha(y|x) of every completion, summed over its tokens: float64 array of shape (P, G)."""
    return ((logp - logp_alpha) * mask).sum(1).cpu().double().numpy().reshape(P, G)


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


def chain_tv_estimate(a: TokenDists, b: TokenDists, mask: torch.Tensor, chunk_tokens: int = 0) -> float:
    """Mean over sequences of sum_t TV(a_t, b_t) over completion positions (``mask`` (B, T)): a Monte-Carlo
    estimate of the chain-rule upper bound on the sequence-level TV. The distributions are expanded from hidden
    states ``chunk_tokens`` positions at a time, never for the whole batch."""
    pairs = zip(a.chunks(mask, chunk_tokens), b.chunks(mask, chunk_tokens))
    total = sum(float(tv_rows(pa, pb).sum()) for pa, pb in pairs)
    return total / mask.shape[0]


def group_statistics(group_rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt mean and plug-in (population) standard deviation of the training groups (P, G)."""
    r = np.asarray(group_rewards, dtype=np.float64)
    uniform = np.full(r.shape, 1.0 / r.shape[1])  # the group's empirical distribution
    mean = np.where(np.ptp(r, axis=1) == 0, r[:, 0], gt.expected_reward(uniform, r))  # exact for equal rewards
    return mean, gt.reward_std(uniform, r)


#: Sequence weights above e^709 (a stale or broken engine) overflow float64: the estimates then read inf or nan,
#: which is what they are; numpy's warnings about it are silenced, the values are logged as they are.
_overflow_is_the_answer = np.errstate(over="ignore", invalid="ignore")


@_overflow_is_the_answer
def bound_estimates(rewards: np.ndarray, log_w_k: np.ndarray, log_w_new: np.ndarray, eps: float,
                    reward_range: RewardRange = UNIT_RANGE) -> dict[str, float]:
    """Theorem 1 estimates from groups of completions of P prompts: ``rewards`` and the sequence log-ratios
    log pi_k/alpha and log pi_{k+1}/alpha, each (P, G). Returns means over prompts; callers prefix them with
    ``insample/`` or ``heldout/`` (which one decides the bias: see the module docstring). With a ``reward_range``
    other than [0, 1] the terms are those of the rescaled reward, in units of the reward (module docstring)."""
    r = reward_range.rescale(rewards)
    _, sigma = group_statistics(r)
    w_k, w_new = np.exp(np.asarray(log_w_k, np.float64)), np.exp(np.asarray(log_w_new, np.float64))
    tv_k = 0.5 * np.mean(np.abs(w_k - 1.0), axis=1)
    tv_new = 0.5 * np.mean(np.abs(w_new - 1.0), axis=1)
    s = np.sqrt(sigma**2 + eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        surrogate = np.where(s > 0, np.mean((w_new - 1.0) * r, axis=1) / np.where(s > 0, s, 1.0), 0.0)
    weight = gt.penalty_weight(sigma, eps)
    paper = gt.combine_bound(surrogate, weight, tv_new, tv_k, gt.bound_constant(tight=False))
    tight = gt.combine_bound(surrogate, weight, tv_new, tv_k, gt.bound_constant(tight=True, reward_range=1.0))
    improvement = np.mean((w_new - w_k) * r, axis=1)
    varied = sigma > 0  # the prompts the zero-variance mask keeps
    width = reward_range.width  # back to units of the reward: J(pi) - J(pi_k) = width (J'(pi) - J'(pi_k))
    nz = (lambda x: width * float(x[varied].mean()) if varied.any() else float("nan"))
    mean = (lambda x: width * float(x.mean()))  # noqa: E731
    return {
        "tv/pi_k_alpha": float(tv_k.mean()),
        "tv/pi_new_alpha": float(tv_new.mean()),
        "improvement": mean(improvement),
        "improvement_nonzero_std": nz(improvement),
        "bound/surrogate": mean(paper.surrogate),
        "bound/penalty_tv": mean(paper.penalty_tv),
        "bound/penalty_lag": mean(paper.penalty_lag),
        "bound/lower": mean(paper.lower),
        "bound/penalty_tv_tight": mean(tight.penalty_tv),
        "bound/penalty_lag_tight": mean(tight.penalty_lag),
        "bound/lower_tight": mean(tight.lower),
        "bound/frac_lower_tight_positive": float(np.mean(tight.lower > 0)),
        "bound/lower_nonzero_std": nz(paper.lower),
        "bound/lower_tight_nonzero_std": nz(tight.lower),
    }


@_overflow_is_the_answer
def group_metrics(group_rewards: np.ndarray, log_w_k: np.ndarray, eps: float,
                  reward_range: RewardRange = UNIT_RANGE) -> dict[str, float]:
    """Quantities of the training groups that involve only alpha and pi_k (no bias from the update):
    TV(pi_k, alpha), the largest sequence weight pi_k/alpha, and the per-prompt sigma (of the rewards) and weight
    (1 - s)/s (of the rewards rescaled to ``reward_range``, as in Theorem 1)."""
    _, sigma = group_statistics(group_rewards)
    weight = gt.penalty_weight(sigma / reward_range.width, eps)
    finite = weight[np.isfinite(weight)]
    w_k = np.exp(np.asarray(log_w_k, np.float64))
    return {
        "tv/pi_k_alpha": float((0.5 * np.mean(np.abs(w_k - 1.0), axis=1)).mean()),
        "is_weight_seq/max": float(w_k.max()),
        "sigma/mean": float(sigma.mean()),
        "sigma/min": float(sigma.min()),
        "bound/weight_mean": float(finite.mean()) if finite.size else float("inf"),
        "bound/weight_max": float(weight.max()),
    }


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}

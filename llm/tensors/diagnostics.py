"""Per-step estimates of the TV distances and of every term of Theorem 1 on a language model (docs/theory.md, §8).

Every estimate is computed on completions sampled from alpha: per prompt a group of G completions y_g with rewards
r_g and sequence weights w_g = pi(y_g|x)/alpha(y_g|x) (the product of the token ratios) and w_k,g for pi_k. The
estimators are ``grpo_theory.estimators``'s, per prompt:

- TV(pi, alpha)         ->  mean_g (1 - w_g)^+                                  unbiased; in [0, 1]
- J(pi) - J(pi_k)       ->  mean_g (w_g - w_k,g)(r_g - rbar_{-g})                unbiased (leave-one-out baseline)
- L_alpha(pi)           ->  mean_g (w_g - 1)(r_g - rbar_{-g}) / s~_{-g}           biased through 1/s~
- the TV penalty        ->  c mean_g (1 - w_g)^+ (1/s~_{-g} - 1)                  biased through 1/s~
- the lag penalty       ->  c mean_g (1 - w_k,g)^+                                unbiased

rbar_{-g} is the mean of the group's other G - 1 rewards and s~_{-g} the standard deviation of those rewards
shrunk towards 1/2 by 0.3 pseudo-rewards at 0 and at 1 (never 0, at most 1/2): each response's 1/s~ is independent
of its weight, so the surrogate's, the TV penalty's and the lower bound's expectations are their formulas with
E[1/s~] in place of 1/s, a bias docs/theory.md §8.5 tabulates (E[1/s~]/(1/s) from 0.17 to 1.18 at G = 8). The bound
terms are assembled by ``grpo_theory.combine_bound``. What the average is taken over then decides the rest:

- ``insample/*``: over the training prompts and their completions. pi_{k+1} was fitted to both, so every
  estimate involving pi_{k+1} is biased: the improvement upwards (the update raises J most on the prompts
  and completions it trained on, and may lower it elsewhere), and TV(pi_{k+1}, alpha) upwards too (the
  update moves probability onto exactly the completions it is then evaluated on).
- ``heldout/*``: over extra prompts drawn independently of the training ones (from the same pool, so some are also
  training prompts of the step), whose completions never entered the loss. pi_k and pi_{k+1} do not depend on
  them, so the TV, improvement and lag-penalty estimates are unbiased for the expectation over the prompt
  distribution, and the surrogate, the TV penalty and the lower bound carry only the 1/s~ bias above.
- ``tv/pi_k_alpha`` on the training batch is unbiased: pi_k depends on no sample of its own step (except under
  dynamic sampling, whose kept groups are chosen by their rewards: docs/theory.md, §6.2).

Rewards outside [0, 1]: Theorem 1 holds for rewards in a range [lo, hi] known before the data through
r' = (r - lo)/(hi - lo), which lies in [0, 1]: every term is computed for r' (its sigma, s <= 1 and weight) and the
terms in units of J (improvement, surrogate, penalties, lower bound) are multiplied back by hi - lo. ``RewardRange``
holds the range used: the one declared before step 0 (``llm.config.ranges``; ``llm.step.monitors.DeclaredRange``),
or, with none declared, [0, 1] widened to the rewards seen, flagged as carrying no guarantee. For rewards in [0, 1]
nothing changes. The leave-one-out baseline makes the improvement estimate invariant to the shift
(mean (w_new - w_k)(r - rbar_{-g}) is the same for r and r - lo).

Chain-rule estimate (``*_chain_ub_est``): TV(pi, alpha) <= E_{y~alpha} sum_t TV(pi(.|x, y_<t), alpha(.|x, y_<t));
the batch mean of the inner sum is an unbiased Monte-Carlo estimate of that upper bound, not a bound on each batch,
and the logged value is that mean clipped at 1, which is biased low near 1 (``chain_tv_estimate``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import grpo_theory as gt
import grpo_theory.estimators as ge
from grpo_theory import trm

from llm.config.ranges import UNIT_INTERVAL
from llm.tensors.logprobs import TokenDists


@dataclass(frozen=True)
class RewardRange:
    """The reward range Theorem 1's terms are computed for: declared before step 0, or (none declared) the rewards
    seen so far (``llm.step.monitors.DeclaredRange``)."""

    lo: float = UNIT_INTERVAL[0]
    hi: float = UNIT_INTERVAL[1]

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
    """Sampled rewards (P, G), all-equal-reward groups and completion lengths of a step; ``reward_std`` is the sample
    standard deviation over the step's completions (Bessel's correction, TRL's ``nanstd``)."""
    return {
        "reward": float(rewards.mean()),
        "reward_std": float(rewards.std(ddof=1)) if rewards.size > 1 else float("nan"),  # TRL's nanstd: Bessel's
        "frac_reward_zero_std": float(zero_std.mean()),
        "completions/mean_length": float(np.mean([len(c) for c in completions])),
        "completions/clipped_ratio": float(np.mean([len(c) == 0 or c[-1] != eos for c in completions])),
    }


#: Token log-weights are clamped to +-this before w - 1 - log w (the KL term's clamp, ``llm.tensors.loss.KL_LOG_MAX``).
MISMATCH_LOG_MAX = 40.0


@torch.no_grad()
def weight_metrics(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The token importance weights w = pi_k/alpha over every completion token (``mask`` (B, T)), whatever the loss
    keeps: ``is_weight/mean|min|max`` and ``sampling/mismatch_kl``, the token mean of w - 1 - log w (k3 of
    KL(alpha || pi_k) per token along alpha's prefixes: unbiased for the mean over the completion tokens alpha
    samples; docs/theory.md, §6.1). Over every token, not only the loss's: the zero-variance mask keeps groups by
    their rewards, and a step dropped for staleness keeps none, which is when the mismatch matters most. nan on a
    batch without tokens."""
    on = mask > 0
    if not bool(on.any()):
        nan = float("nan")
        return {"is_weight/mean": nan, "is_weight/min": nan, "is_weight/max": nan, "sampling/mismatch_kl": nan}
    log_w = (logp_k.float() - logp_alpha.float())[on]
    w = torch.exp(log_w)
    lw = log_w.clamp(-MISMATCH_LOG_MAX, MISMATCH_LOG_MAX)
    mismatch = (torch.exp(lw) - 1.0 - lw).clamp(min=0.0)  # >= 0 exactly; rounding can dip below at w = 1
    return {"is_weight/mean": float(w.mean()), "is_weight/min": float(w.min()), "is_weight/max": float(w.max()),
            "sampling/mismatch_kl": float(mismatch.mean())}


def chain_tv_sum(a: TokenDists, b: TokenDists, mask: torch.Tensor, chunk_tokens: int = 0) -> float:
    """Sum over sequences and completion positions (``mask`` (B, T)) of TV(a_t, b_t): divided by the number of
    sequences (``chain_tv_estimate``), a Monte-Carlo estimate of the chain-rule upper bound on the sequence-level TV.
    The distributions are expanded from hidden states ``chunk_tokens`` positions at a time, never for the whole
    batch."""
    pairs = zip(a.chunks(mask, chunk_tokens), b.chunks(mask, chunk_tokens))
    return sum(float(tv_rows(pa, pb).sum()) for pa, pb in pairs)


@torch.no_grad()
def token_divergences(a: TokenDists, b: TokenDists, mask: torch.Tensor, chunk_tokens: int = 0) -> tuple[np.ndarray,
                                                                                                          np.ndarray]:
    """TV(a_t, b_t) and KL(a_t || b_t) at every completion position where ``mask`` (B, T) is 1, exact over the
    vocabulary (the distributions expanded ``chunk_tokens`` positions at a time): two float64 arrays (B, T), 0
    elsewhere. A token ``b``'s filter drops and ``a`` keeps gives KL of order 10^4 x its probability (``OFF_SET_LOGP``):
    the true KL is infinite."""
    on = (mask > 0).cpu()
    tv, kl = np.zeros(tuple(mask.shape)), np.zeros(tuple(mask.shape))
    parts_tv, parts_kl = [], []
    for pa, pb in zip(a.chunks(mask, chunk_tokens), b.chunks(mask, chunk_tokens)):
        pa, pb = pa.float(), pb.float()
        parts_tv.append(tv_rows(pa, pb).double().cpu())
        parts_kl.append((pa.exp() * (pa - pb)).sum(dim=-1).clamp(min=0.0).double().cpu())  # >= 0 but for rounding
    if parts_tv:
        tv[on.numpy()] = torch.cat(parts_tv).numpy()
        kl[on.numpy()] = torch.cat(parts_kl).numpy()
    return tv, kl


def trm_estimates(tv: np.ndarray, kl: np.ndarray, mask: torch.Tensor, logp_k: torch.Tensor, logp_new: torch.Tensor,
                  log_w_k: np.ndarray, rewards: np.ndarray, horizon: int,
                  reward_range: RewardRange = UNIT_RANGE) -> dict[str, float]:
    """Trust Region Masking's quantities (arXiv 2512.23075; ``grpo_theory.trm``) between pi_k and pi_{k+1} from the
    per-token TV and KL(pi_k || pi_{k+1}) at sampled prefixes (``tv``, ``kl`` (B, T): ``token_divergences``), the
    token log-probs of both, the sequence log-weights log pi_k/alpha (``log_w_k`` (P, G)), the rewards (P, G) and
    the horizon T the bounds take (the longest completion allowed). Biases, stated: ``tv/token_max`` and
    ``kl/token_max`` are maxima over the sampled prefixes only, so they underestimate the maxima over every prefix
    the bounds need, and every bound built on them is biased low; ``tv/token_mean`` is the plain mean over the
    sampled tokens (alpha's prefixes). The sequence KL, the per-position mean TV and the surrogate gain
    (``bound_est/trm_surrogate``, with a leave-one-out group baseline) are means weighted by pi_k/alpha, unbiased
    for pi_k's prefixes. ``bound_est/trm_<bound>``: each bound and their minimum (``trm_unified``);
    ``bound_est/trm_lower``: the gain minus the unified bound. J-unit terms in units of the reward."""
    on = (mask > 0).cpu().numpy()
    if not on.any():
        return {}
    w = np.exp(np.asarray(log_w_k, np.float64)).reshape(-1)
    r = reward_range.rescale(rewards)
    baseline = trm.leave_one_out_baseline(r).reshape(-1)
    gain = trm.surrogate_gain_samples(logp_new.double().cpu().numpy(), logp_k.double().cpu().numpy(), r.reshape(-1),
                                      baseline, on)
    div = trm.Divergences(float(tv[on].max()), float(kl[on].max()), float(np.mean(w * kl.sum(axis=1))),
                          (w[:, None] * tv).mean(axis=0))
    bounds = trm.trm_bounds(div, max(horizon, tv.shape[1]))
    width = reward_range.width
    out = {"tv/token_max": div.eps, "tv/token_mean": float(tv[on].mean()), "kl/token_max": div.delta,
           "kl/sequence": div.seq_kl, "bound_est/trm_surrogate": width * float(np.mean(w * gain))}
    out.update({f"bound_est/trm_{name}": width * value for name, value in bounds.items()})
    out["bound_est/trm_lower"] = out["bound_est/trm_surrogate"] - out["bound_est/trm_unified"]
    return out


def chain_tv_estimate(total: float, sequences: int) -> float:
    """min(1, ``total`` / ``sequences``): the batch mean of sum_t TV_t clipped at 1. The mean is unbiased for the
    chain-rule upper bound U = E sum_t TV_t; the clipped value is not: E[min(1, X)] <= min(1, E X), so where the
    mean's spread reaches past 1 the logged value is biased low, and near 1 it is no upper bound on TV in
    expectation. Below, far from 1, the clip never binds and the estimate is U's."""
    return min(1.0, total / max(sequences, 1))


def group_statistics(group_rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt mean and plug-in (population) standard deviation of the training groups (P, G): descriptive
    statistics of the sampled rewards (``sigma/*``), not the bound's estimate of sigma (``grpo_theory.estimators``)."""
    r = np.asarray(group_rewards, dtype=np.float64)
    uniform = np.full(r.shape, 1.0 / r.shape[1])  # the group's empirical distribution
    mean = np.where(np.ptp(r, axis=1) == 0, r[:, 0], gt.expected_reward(uniform, r))  # exact for equal rewards
    return mean, gt.reward_std(uniform, r)


#: Sequence weights above e^709 (a stale or broken engine) overflow float64: the estimates then read inf or nan,
#: which is what they are; numpy's warnings about it are silenced, the values are logged as they are.
_overflow_is_the_answer = np.errstate(over="ignore", invalid="ignore")

#: Per-prompt estimates in units of J (scaled back by the reward range's width); the others (TVs) are not.
J_UNIT_TERMS = ("improvement", "bound_est/surrogate", "bound_est/penalty_tv", "bound_est/penalty_lag",
                "bound_est/lower", "bound_est/penalty_tv_tight", "bound_est/penalty_lag_tight", "bound_est/lower_tight")
#: Terms also averaged over the prompts whose sampled rewards vary (``<term>_nonzero_std``): the prompts the
#: zero-variance mask trains on.
NONZERO_STD_TERMS = ("improvement", "bound_est/lower", "bound_est/lower_tight")


@_overflow_is_the_answer
def per_prompt_estimates(rewards: np.ndarray, log_w_k: np.ndarray, log_w_new: np.ndarray, eps: float,
                         reward_range: RewardRange = UNIT_RANGE) -> dict[str, np.ndarray]:
    """Theorem 1's estimates for each of P prompts (``grpo_theory.estimators``; docs/theory.md, §8) from its group:
    ``rewards`` and the sequence log-ratios log pi_k/alpha and log pi_{k+1}/alpha, each (P, G). With a
    ``reward_range`` other than [0, 1] the terms are those of the rescaled reward, in units of the reward."""
    r = reward_range.rescale(rewards)
    w_k, w_new = np.exp(np.asarray(log_w_k, np.float64)), np.exp(np.asarray(log_w_new, np.float64))
    paper = ge.bound_estimates(r, w_new, w_k, eps, gt.bound_constant(tight=False))
    tight = ge.bound_estimates(r, w_new, w_k, eps, gt.bound_constant(tight=True, reward_range=1.0))
    out = {
        "tv/pi_k_alpha": ge.tv_estimate(w_k),
        "tv/pi_new_alpha": ge.tv_estimate(w_new),
        "tv/pi_new_pi_k": ge.tv_between_estimate(w_new, w_k),
        "improvement": ge.improvement_estimate(r, w_new, w_k),
        "bound_est/surrogate": paper.surrogate,
        "bound_est/penalty_tv": paper.penalty_tv,
        "bound_est/penalty_lag": paper.penalty_lag,
        "bound_est/lower": paper.lower,
        "bound_est/penalty_tv_tight": tight.penalty_tv,
        "bound_est/penalty_lag_tight": tight.penalty_lag,
        "bound_est/lower_tight": tight.lower,
    }
    for key in J_UNIT_TERMS:  # back to units of the reward: J(pi) - J(pi_k) = width (J'(pi) - J'(pi_k))
        out[key] = reward_range.width * out[key]
    return out


@_overflow_is_the_answer
def bound_estimates(rewards: np.ndarray, log_w_k: np.ndarray, log_w_new: np.ndarray, eps: float,
                    reward_range: RewardRange = UNIT_RANGE, standard_errors: bool = False,
                    lcb_level: float | None = None, lcb_method: str = ge.DEFAULT_LCB_METHOD,
                    lcb_cap: float = ge.IMPROVEMENT_WEIGHT_CAP) -> dict[str, float]:
    """The prompt means of ``per_prompt_estimates`` (callers prefix them with ``insample/`` or ``heldout/``, which
    decides the bias: module docstring), the same over the prompts with varied rewards (``*_nonzero_std``), the
    share of those whose estimated tight bound is positive, and the Kish effective sample size of each weight
    (``ess/*``, a fraction of the completions). ``standard_errors``: also ``<key>_se`` for every mean (prompts are
    independent draws, so the standard error of a mean over them is their sample standard deviation over
    sqrt(P)). ``lcb_level``: also ``improvement_lcb``, the one-sided lower confidence bound on the improvement at
    that level by ``lcb_method`` (``grpo_theory.estimators.improvement_certificate``; with betting, on the estimates
    capped at ``lcb_cap``, also ``improvement_e``, its e-value, and ``improvement_capped``, their mean; meaningful on
    held-out prompts only, whose groups are independent of the update)."""
    per = per_prompt_estimates(rewards, log_w_k, log_w_new, eps, reward_range)
    varied = np.ptp(np.asarray(rewards, np.float64), axis=1) > 0  # the prompts the zero-variance mask keeps
    means = {key: v for key, v in per.items()}
    means.update({f"{key}_nonzero_std": per[key][varied] for key in NONZERO_STD_TERMS})
    out = {}
    for key, values in means.items():
        out[key], se = ge.mean_and_standard_error(values)
        if standard_errors:
            out[f"{key}_se"] = se
    if lcb_level is not None:
        w = lambda log_w: np.exp(np.asarray(log_w, np.float64))  # noqa: E731
        cert = ge.improvement_certificate(reward_range.rescale(rewards), w(log_w_new), w(log_w_k), lcb_level,
                                          lcb_method, lcb_cap)
        out["improvement_lcb"] = reward_range.width * cert["lcb"]  # units of the reward, as every J-unit term
        if "e_value" in cert:
            out["improvement_e"] = cert["e_value"]
            out["improvement_capped"] = reward_range.width * cert["capped"]
    tight = per["bound_est/lower_tight"][varied]
    out["bound_est/frac_lower_tight_positive_nonzero_std"] = float(np.mean(tight > 0)) if tight.size else float("nan")
    out["ess/pi_k_alpha"] = float(ge.kish_ess_fraction(np.exp(np.asarray(log_w_k, np.float64))))
    out["ess/pi_new_alpha"] = float(ge.kish_ess_fraction(np.exp(np.asarray(log_w_new, np.float64))))
    return out


@_overflow_is_the_answer
def group_metrics(group_rewards: np.ndarray, log_w_k: np.ndarray, eps: float,
                  reward_range: RewardRange = UNIT_RANGE) -> dict[str, float]:
    """Quantities of the training groups that involve only alpha and pi_k (no bias from the update):
    TV(pi_k, alpha) (unbiased, ``grpo_theory.estimators.tv_estimate``), the largest and the mean sequence weight
    pi_k/alpha (the mean estimates pi_k's mass on what alpha can produce: 1 unless a top-k, top-p or min-p filter
    keeps pi_k on tokens alpha's drops; docs/theory.md, §1.1) and their effective sample size, the groups' sampled reward standard deviation (``sigma/*``, plug-in) and the
    penalty weight (1 - s~)/s~ the bound's estimates use (of the rewards rescaled to ``reward_range``)."""
    _, sigma = group_statistics(group_rewards)
    r = reward_range.rescale(group_rewards)
    weight = gt.penalty_weight(ge.leave_one_out_sigma(r), eps)
    w_k = np.exp(np.asarray(log_w_k, np.float64))
    return {
        "tv/pi_k_alpha": float(ge.tv_estimate(w_k).mean()),
        "is_weight_seq/max": float(w_k.max()),
        "is_weight_seq/mean": float(w_k.mean()),
        "ess/pi_k_alpha": float(ge.kish_ess_fraction(w_k)),
        "sigma/mean": float(sigma.mean()),
        "sigma/min": float(sigma.min()),
        "sigma/weight_mean": float(weight.mean()),
        "sigma/weight_max": float(weight.max()),
    }


#: The certificate's keys (``bound_estimates`` with ``lcb_level``): nan where it abstains.
CERTIFICATE_KEYS = ("improvement_lcb", "improvement_e", "improvement_capped")


def heldout_terms(rewards: np.ndarray, logp_alpha: torch.Tensor, logp_k: torch.Tensor, logp_new: torch.Tensor,
                  mask: torch.Tensor, eps: float, reward_range: RewardRange = UNIT_RANGE, *, lcb_level: float = 0.95,
                  lcb_method: str = ge.DEFAULT_LCB_METHOD, lcb_cap: float = ge.IMPROVEMENT_WEIGHT_CAP,
                  certify: bool = True) -> tuple[dict[str, float], np.ndarray]:
    """The held-out prompts' estimates (unprefixed; callers add ``heldout/``) from their rewards (P, G) and the token
    log-probs (B = P G, T) of alpha, pi_k and pi_{k+1} over the policy's tokens (``mask``): ``bound_estimates`` with
    standard errors and the certificate at ``lcb_level`` (nan unless ``certify``: a declared range and alpha's own
    log-probs), and the reward's mean and standard error over the prompts. Also returns log pi_k/alpha (P, G). One
    function for ``llm.step.diagnose.heldout_estimates`` (this trainer) and ``llm.integrations`` (another's)."""
    P, G = rewards.shape
    log_w = lambda logp: sequence_log_ratio(logp, logp_alpha, mask, P, G)  # noqa: E731
    log_w_k = log_w(logp_k)
    est = bound_estimates(rewards, log_w_k, log_w(logp_new), eps, reward_range, standard_errors=True,
                          lcb_level=lcb_level, lcb_method=lcb_method, lcb_cap=lcb_cap)
    if not certify:  # no level to claim: abstain
        est.update({k: float("nan") for k in CERTIFICATE_KEYS if k in est})
    est["reward"], est["reward_se"] = ge.mean_and_standard_error(np.asarray(rewards, np.float64).mean(axis=1))
    return est, log_w_k


@_overflow_is_the_answer
def clustered_metrics(log_w_k: np.ndarray, prompts: np.ndarray, log_w_gen: np.ndarray | None = None
                      ) -> dict[str, float]:
    """TV(pi_k, alpha) from completions labelled by their prompt, any number per prompt (a host trainer's micro-batches
    split a prompt's group across optimiser steps): per prompt ``grpo_theory.estimators.tv_estimate`` of its
    completions' sequence weights w = pi_k/alpha (``log_w_k`` (n,), ``prompts`` (n,) labels), their mean and standard
    error over the prompts (independent draws: ``tv/pi_k_alpha``, ``tv/pi_k_alpha_se``), the Kish effective sample
    size of every weight (``ess/pi_k_alpha``) and the largest and mean weight (``is_weight_seq/*``). With every
    prompt's G completions present these are ``group_metrics``'s (tested equal). ``log_w_gen``: log pi_gen/alpha,
    pi_gen the trainer's weights the sampler was synced from (where the host computed both beside the engine's
    log-probs; nan where unknown) splits the distance into staleness, TV(pi_k, pi_gen)
    (``grpo_theory.estimators.tv_anchored_estimate``, anchored on pi_gen: ``tv/staleness``), and the engine's own mismatch at equal
    weights, TV(pi_gen, alpha) (``tv_estimate``: ``tv/engine_mismatch``), each with its standard error; by the
    triangle inequality TV(pi_k, alpha) <= their sum."""
    w_k = np.exp(np.asarray(log_w_k, np.float64)).reshape(-1)
    labels = np.asarray(prompts).reshape(-1)
    groups = [np.flatnonzero(labels == u) for u in np.unique(labels)]
    out = {}
    out["tv/pi_k_alpha"], out["tv/pi_k_alpha_se"] = ge.mean_and_standard_error([ge.tv_estimate(w_k[g]) for g in groups])
    out["ess/pi_k_alpha"] = float(ge.kish_ess_fraction(w_k)) if w_k.size else float("nan")
    out["is_weight_seq/max"] = float(w_k.max()) if w_k.size else float("nan")
    out["is_weight_seq/mean"] = float(w_k.mean()) if w_k.size else float("nan")
    if log_w_gen is not None:
        w_gen = np.exp(np.asarray(log_w_gen, np.float64)).reshape(-1)
        known = [g[np.isfinite(w_gen[g])] for g in groups]
        known = [g for g in known if g.size]
        if known:
            out["tv/staleness"], out["tv/staleness_se"] = ge.mean_and_standard_error(
                [ge.tv_anchored_estimate(w_k[g], w_gen[g]) for g in known])
            out["tv/engine_mismatch"], out["tv/engine_mismatch_se"] = ge.mean_and_standard_error(
                [ge.tv_estimate(w_gen[g]) for g in known])
    return out


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}

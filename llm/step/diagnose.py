"""A step's diagnose stage, after the update: TV distances, Theorem 1's estimated terms on the training batch
(``diagnose``, ``insample_estimates``) and on the held-out prompts (``heldout_before_update``, then
``heldout_estimates`` with the improvement certificate)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llm.tensors import agent_metrics, sync_probe
from llm.tensors import diagnostics as dg
from llm.tensors.batch import Batch
from llm.tensors.logprobs import TokenDists
from llm.tensors.passes import Passes
from llm.optim import Optimised
from llm.sampling import Rollout
from llm.step.behaviour import Behaviour, sampler_logprobs
from llm.step.score import Groups, Scored


def diagnose(batch: Batch, scored: Scored, groups: Groups, roll: Rollout, eos: int, log_alpha: torch.Tensor,
             behaviour: Behaviour, optimised: Optimised, eps: float, reward_range: dg.RewardRange) -> dict[str, float]:
    """Metrics of the step on the training batch that need no further pass: rollout statistics, the loss's
    statistics, the unbiased pi_k quantities (TV(pi_k, alpha), weights, sigma) and the sync check."""
    cm = batch.policy_mask
    P, G = scored.rewards.shape
    log_w_k = dg.sequence_log_ratio(optimised.pi_k.logp, log_alpha, cm, P, G)
    row = dg.rollout_metrics(scored.rewards, groups.zero_std, roll.completion_ids, eos)
    row["entropy"] = dg.mean_entropy(optimised.pi_k.entropy, cm)
    row["grad_norm"] = optimised.grad_norm
    row["skipped_updates"] = optimised.skipped
    if optimised.lr_factor is not None:
        row["ess_scaling/lr_factor"] = optimised.lr_factor
    if optimised.baseline_shift is not None:
        row["grad_baselining/advantage_shift"] = optimised.baseline_shift
    row.update(optimised.stats.metrics())
    row.update(dg.weight_metrics(optimised.pi_k.logp, log_alpha, cm))
    row.update(dg.group_metrics(scored.rewards, log_w_k, eps, reward_range))
    if roll.tool_mask is not None:  # an agent's episodes (``llm.agents``)
        row.update(agent_metrics.tool_metrics(roll.tool_mask, roll.tool_calls, roll.tool_failures, roll.malformed, roll.env_failed))
        row.update(agent_metrics.episode_metrics(optimised.pi_k.logp, log_alpha, cm))
    if optimised.chain_tv_k is not None:
        row["tv/pi_k_alpha_chain_ub_est"] = optimised.chain_tv_k
    if behaviour.from_sampler is not None and behaviour.recomputed is not None:
        n = behaviour.checked_rows or cm.shape[0]
        row.update(sync_probe.sampler_gap(behaviour.from_sampler[:n], behaviour.recomputed[:n], cm[:n]))
    return row


def insample_estimates(passes: Passes, policy: torch.nn.Module, batch: Batch, rewards: np.ndarray,
                       log_alpha: torch.Tensor, logp_k: torch.Tensor, alpha_dists: TokenDists | None, eps: float,
                       reward_range: dg.RewardRange) -> dict[str, float]:
    """``insample/*``: the estimates involving pi_{k+1} on the training batch it was fitted to (biased upwards;
    docs/theory.md, §8), from one more forward pass of the updated policy."""
    cm = batch.policy_mask
    P, G = rewards.shape
    new = passes.logprobs(policy, batch, keep_hidden=alpha_dists is not None)
    est = dg.bound_estimates(rewards, dg.sequence_log_ratio(logp_k, log_alpha, cm, P, G),
                             dg.sequence_log_ratio(new.logp, log_alpha, cm, P, G), eps, reward_range)
    for same in ("tv/pi_k_alpha", "ess/pi_k_alpha"):  # the same numbers as the top-level (unbiased) ones
        del est[same]
    if alpha_dists is not None:
        est["tv/pi_new_alpha_chain_ub_est"] = passes.chain_tv(passes.dists(policy, new.hidden), alpha_dists, cm)
    return dg.prefixed("insample", est)


@dataclass
class Heldout:
    """The held-out prompts of a step: their rewards (P_h, G), batch, log alpha and log pi_k (before the update), and
    pi_k's next-token distributions at every completion position (``dists_k``, for the per-token divergences of
    Trust Region Masking's bounds; under several processes each rank holds its own rows')."""

    rewards: np.ndarray
    batch: Batch
    logp_alpha: torch.Tensor
    logp_k: torch.Tensor
    dists_k: TokenDists | None = None
    alpha_from_sampler: bool = True
    """log alpha is the sampler's own (the distribution the tokens were drawn from), not the trainer's recomputation:
    the certificate's level needs it (docs/theory.md, §8.6)."""


def heldout_before_update(passes: Passes, policy: torch.nn.Module, alpha: torch.nn.Module, batch: Batch,
                          rewards: np.ndarray, roll: Rollout, lag: int, recompute: bool) -> Heldout:
    """log pi_k of the held-out completions, and log alpha: the sampler's, or (``recompute``, or a sampler that
    reports none) the trainer's (pi_k's at lag 0, a forward of alpha's weights after)."""
    pi_k = passes.logprobs(policy, batch, keep_hidden=True)  # each rank: its own rows' hidden states
    logp_k = pi_k.logp
    from_sampler = sampler_logprobs(roll, batch)
    own = not (recompute or from_sampler is None)
    if own:
        logp_alpha = from_sampler
    else:
        logp_alpha = logp_k if lag == 0 else passes.logprobs(alpha, batch).logp
    return Heldout(rewards, batch, logp_alpha, logp_k, passes.frozen_dists(policy, pi_k.hidden), own)


def heldout_estimates(passes: Passes, policy: torch.nn.Module, heldout: Heldout, eps: float,
                      reward_range: dg.RewardRange, lcb_level: float = 0.95,
                      lcb_method: str = "betting", lcb_cap: float = 2.0, horizon: int = 0,
                      certify: bool = True) -> dict[str, float]:
    """``heldout/*``: the bound's terms, TV distances and improvement estimated on prompts drawn independently of the
    training prompts, whose completions never entered the loss (docs/theory.md, §8.2), each with its standard error:
    the TV, improvement and lag-penalty estimates are unbiased over the prompt distribution; the surrogate, the TV
    penalty and the lower bound carry the bias of their 1/s~ (docs/theory.md, §8.5). ``improvement_lcb``: the
    improvement's lower confidence bound at ``lcb_level`` by ``lcb_method`` (the certificate, §8.6; betting: on the
    estimates with weights capped at ``lcb_cap``, with its e-value ``improvement_e``). With pi_k's distributions
    kept, Trust Region Masking's per-token divergences and bounds for sequences of ``horizon`` tokens
    (``tv/token_*``, ``bound_est/trm_*``: ``llm.tensors.diagnostics.trm_estimates``). The certificate abstains (nan)
    unless ``certify`` (a declared reward range) and log alpha is the sampler's own."""
    new = passes.logprobs(policy, heldout.batch, keep_hidden=heldout.dists_k is not None)
    cm = heldout.batch.policy_mask
    est, log_w_k = dg.heldout_terms(heldout.rewards, heldout.logp_alpha, heldout.logp_k, new.logp, cm, eps,
                                    reward_range, lcb_level=lcb_level, lcb_method=lcb_method, lcb_cap=lcb_cap,
                                    certify=certify and heldout.alpha_from_sampler)
    if heldout.dists_k is not None:
        tv, kl = passes.token_divergences(heldout.dists_k, passes.dists(policy, new.hidden), cm)
        est.update(dg.trm_estimates(tv, kl, cm, heldout.logp_k, new.logp, log_w_k, heldout.rewards, horizon,
                                    reward_range))
    return dg.prefixed("heldout", est)

"""The phases of a training step between generation and the update, and the diagnostics after it, one function each:
``score``, ``advantages``, ``alpha_logprobs`` (behaviour), ``diagnose``, ``heldout_estimates``. Each takes what it
reads; the loop that calls them is ``llm.run.trainer``, the update ``llm.optim.update``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import grpo_theory as gt
from grpo_theory.estimators import mean_and_standard_error

from llm.core import diagnostics as dg
from llm.core.batch import Batch, make_batch, padded
from llm.core.logprobs import TokenDists
from llm.core.passes import Passes
from llm.models.distributed import Ranks
from llm.optim import Optimised
from llm.sampling import Rollout
from llm.tasks import TokenizedTask


# ---- score and advantages --------------------------------------------------------------------------


@dataclass
class Scored:
    """Rewards of the P x G completions (P, G), their decoded texts, and each reward function's values (nan where it
    gave None; empty for the other rewards)."""

    rewards: np.ndarray
    texts: list[str]
    parts: dict[str, np.ndarray]


def score(task: TokenizedTask, prompt_idx: list[int], roll: Rollout, G: int, ranks: Ranks) -> Scored:
    """The rewards, scored on rank 0 (reward functions run once per completion), the result on every rank."""

    def on_rank0() -> Scored:
        texts = task.tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=True)
        rewards, parts = task.score_parts([i for i in prompt_idx for _ in range(G)], texts, roll.completion_ids)
        return Scored(rewards.reshape(len(prompt_idx), G), texts, parts)

    return ranks.from_main(on_rank0)


@dataclass
class VariedGroups:
    """Dynamic sampling (DAPO; verl's ``filter_groups``): the groups whose rewards vary, gathered over generation
    rounds until there are ``want`` of them. ``take`` adds a round; ``result`` gives the first ``want`` kept groups
    as one rollout and its scores, and ``metrics`` the rounds, the kept share, and the reward and all-equal share of
    the first round's groups. The first round is drawn whatever the rewards, so its reward is unbiased for J(alpha);
    the later rounds are drawn only when the earlier ones fell short, so the reward pooled over every round is a
    ratio with a random denominator, biased (tests/llm/test_rollout.py measures both)."""

    want: int
    G: int
    prompt_idx: list[int] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] | None = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rewards: list[np.ndarray] = field(default_factory=list)
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    drawn: list[np.ndarray] = field(default_factory=list)
    rounds: int = 0

    @property
    def enough(self) -> bool:
        return len(self.prompt_idx) >= self.want

    def take(self, prompt_idx: list[int], roll: Rollout, scored: Scored) -> None:
        G = self.G
        self.rounds += 1
        self.drawn.append(scored.rewards)
        for g, i in enumerate(prompt_idx):
            r = scored.rewards[g]
            if np.ptp(r) == 0 or self.enough:
                continue
            cols = slice(g * G, (g + 1) * G)
            self.prompt_idx.append(i)
            self.completion_ids += roll.completion_ids[cols]
            self.logprobs = None if roll.logprobs is None or self.logprobs is None else self.logprobs + roll.logprobs[cols]
            self.texts += scored.texts[cols]
            self.rewards.append(r)
            for name, values in scored.parts.items():
                self.parts.setdefault(name, []).append(values.reshape(-1, G)[g])

    def result(self) -> tuple[list[int], Rollout, Scored]:
        G = self.G
        rewards = np.array(self.rewards).reshape(-1, G)
        parts = {name: np.concatenate(v) for name, v in self.parts.items()}
        return self.prompt_idx, Rollout(self.completion_ids, self.logprobs), Scored(rewards, self.texts, parts)

    def metrics(self) -> dict[str, float]:
        drawn, first = np.concatenate(self.drawn), self.drawn[0]
        return {"sampling/gen_rounds": float(self.rounds),
                "sampling/kept_group_share": len(self.prompt_idx) / max(len(drawn), 1),
                "sampling/reward_drawn": float(first.mean()),
                "sampling/frac_reward_zero_std_drawn": float(np.mean(np.ptp(first, axis=1) == 0))}


def group_batch(task: TokenizedTask, prompt_idx: list[int], roll: Rollout, G: int, device) -> Batch:
    """The batch of the P x G sequences: each prompt's tokens before each of its G completions."""
    return make_batch([task.prompt_ids[i] for i in prompt_idx for _ in range(G)], roll.completion_ids,
                      task.tokenizer.pad_token_id, device)


def reward_metrics(parts: dict[str, np.ndarray]) -> dict[str, float]:
    """``rewards/<name>/mean|std`` of each reward function over the completions it applied to (TRL's names and
    convention: None is left out; the standard deviation with n - 1)."""
    out = {}
    for name, values in parts.items():
        applied = values[~np.isnan(values)]
        out[f"rewards/{name}/mean"] = float(applied.mean()) if applied.size else float("nan")
        out[f"rewards/{name}/std"] = float(applied.std(ddof=1)) if applied.size > 1 else float("nan")
    return out


@dataclass
class Groups:
    """Per-group quantities of a step: advantages (P, G), all-equal-reward groups and the groups the loss keeps."""

    advantages: np.ndarray
    zero_std: np.ndarray
    keep: np.ndarray


def advantages(rewards: np.ndarray, eps: float, scale: bool | str, mask_zero_std: bool, drop_all: bool = False) -> Groups:
    """Group whitening with ``grpo_theory.group_advantages`` and the zero-variance mask (docs/theory.md, §5);
    ``drop_all``: the loss keeps no group (a step dropped for staleness, ``max_staleness``)."""
    adv = gt.group_advantages(rewards, eps, scale=scale)
    zero_std = np.ptp(rewards, axis=1) == 0
    keep = ~zero_std if mask_zero_std else np.ones(len(rewards), bool)
    if drop_all:
        keep = np.zeros(len(rewards), bool)
    return Groups(adv, zero_std, keep)


# ---- behaviour: log alpha ----------------------------------------------------------------------------


@dataclass
class Behaviour:
    """log alpha of the completion tokens, (B, T) float32: the sampler's report (``from_sampler``), the trainer's
    recomputation with alpha's weights (``recomputed``; over the first ``checked_rows`` rows only when the sync check
    alone needs it, 0: every row) and alpha's next-token distributions (``dists``, the chain-rule TV only). Each is
    None when not computed."""

    from_sampler: torch.Tensor | None
    recomputed: torch.Tensor | None = None
    dists: TokenDists | None = None
    checked_rows: int = 0

    def log_alpha(self, prefer_sampler: bool) -> torch.Tensor | None:
        """The log alpha the loss uses: the sampler's (``prefer_sampler``, when reported) or the recomputation;
        None when neither exists, which at lag 0 means pi_k's own (alpha's weights are pi_k's)."""
        if prefer_sampler and self.from_sampler is not None:
            return self.from_sampler
        return self.recomputed if self.recomputed is not None else None


def sampler_logprobs(roll: Rollout, batch: Batch) -> torch.Tensor | None:
    """The sampler's log alpha of the completion tokens as a (B, T) tensor (None if it reports none)."""
    if roll.logprobs is None:
        return None
    return padded(roll.logprobs, batch.completion_ids.shape[1], batch.input_ids.device)


def alpha_logprobs(passes: Passes, alpha: torch.nn.Module, batch: Batch, from_sampler: torch.Tensor | None, *,
                   recompute: bool, check: bool, keep_hidden: bool) -> Behaviour:
    """log alpha at lag > 0: the sampler's, and a forward of alpha's weights when the loss needs it (``recompute``,
    or a sampler that reports none), when the token-level TV needs alpha's distributions (``keep_hidden``), or for
    the sync check alone (``check``: one group's forward suffices). (At lag 0 alpha's weights are pi_k's, whose
    forward the optimiser runs anyway: no pass here.)"""
    need = recompute or from_sampler is None
    if not (need or check or keep_hidden):
        return Behaviour(from_sampler)
    if not (need or keep_hidden):  # the sync check alone: one group's forward of alpha suffices
        G = passes.group_size
        part = passes.logprobs(alpha, batch.take(torch.arange(G))).logp
        recomputed = torch.zeros_like(from_sampler)
        recomputed[:G, :part.shape[1]] = part
        return Behaviour(from_sampler, recomputed, checked_rows=G)
    fwd = passes.logprobs(alpha, batch, keep_hidden=keep_hidden)
    return Behaviour(from_sampler, fwd.logp, passes.dists(alpha, fwd.hidden))


# ---- diagnostics ------------------------------------------------------------------------------------


def diagnose(batch: Batch, scored: Scored, groups: Groups, roll: Rollout, eos: int, log_alpha: torch.Tensor,
             behaviour: Behaviour, optimised: Optimised, eps: float, reward_range: dg.RewardRange) -> dict[str, float]:
    """Metrics of the step on the training batch that need no further pass: rollout statistics, the loss's
    statistics, the unbiased pi_k quantities (TV(pi_k, alpha), weights, sigma) and the sync check."""
    cm = batch.completion_mask
    P, G = scored.rewards.shape
    log_w_k = dg.sequence_log_ratio(optimised.pi_k.logp, log_alpha, cm, P, G)
    row = dg.rollout_metrics(scored.rewards, groups.zero_std, roll.completion_ids, eos)
    row["entropy"] = dg.mean_entropy(optimised.pi_k.entropy, cm)
    row["grad_norm"] = optimised.grad_norm
    row["skipped_updates"] = optimised.skipped
    row.update(optimised.stats.metrics())
    row.update(dg.weight_metrics(optimised.pi_k.logp, log_alpha, cm))
    row.update(dg.group_metrics(scored.rewards, log_w_k, eps, reward_range))
    if optimised.chain_tv_k is not None:
        row["tv/pi_k_alpha_chain_ub_est"] = optimised.chain_tv_k
    if behaviour.from_sampler is not None and behaviour.recomputed is not None:
        n = behaviour.checked_rows or cm.shape[0]
        row.update(dg.sampler_gap(behaviour.from_sampler[:n], behaviour.recomputed[:n], cm[:n]))
    return row


def insample_estimates(passes: Passes, policy: torch.nn.Module, batch: Batch, rewards: np.ndarray,
                       log_alpha: torch.Tensor, logp_k: torch.Tensor, alpha_dists: TokenDists | None, eps: float,
                       reward_range: dg.RewardRange) -> dict[str, float]:
    """``insample/*``: the estimates involving pi_{k+1} on the training batch it was fitted to (biased upwards;
    docs/theory.md, §8), from one more forward pass of the updated policy."""
    cm = batch.completion_mask
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
    """The held-out prompts of a step: their rewards (P_h, G), batch, log alpha and log pi_k (before the update)."""

    rewards: np.ndarray
    batch: Batch
    logp_alpha: torch.Tensor
    logp_k: torch.Tensor


def heldout_before_update(passes: Passes, policy: torch.nn.Module, alpha: torch.nn.Module, batch: Batch,
                          rewards: np.ndarray, roll: Rollout, lag: int, recompute: bool) -> Heldout:
    """log pi_k of the held-out completions, and log alpha: the sampler's, or (``recompute``, or a sampler that
    reports none) the trainer's (pi_k's at lag 0, a forward of alpha's weights after)."""
    logp_k = passes.logprobs(policy, batch).logp
    from_sampler = sampler_logprobs(roll, batch)
    if not (recompute or from_sampler is None):
        logp_alpha = from_sampler
    else:
        logp_alpha = logp_k if lag == 0 else passes.logprobs(alpha, batch).logp
    return Heldout(rewards, batch, logp_alpha, logp_k)


def heldout_estimates(passes: Passes, policy: torch.nn.Module, heldout: Heldout, eps: float,
                      reward_range: dg.RewardRange, lcb_level: float = 0.95,
                      lcb_method: str = "betting", lcb_cap: float = 2.0) -> dict[str, float]:
    """``heldout/*``: the bound's terms, TV distances and improvement estimated on prompts drawn independently of the
    training prompts, whose completions never entered the loss (docs/theory.md, §8.2), each with its standard error:
    the TV, improvement and lag-penalty estimates are unbiased over the prompt distribution; the surrogate, the TV
    penalty and the lower bound carry the bias of their 1/s~ (docs/theory.md, §8.5). ``improvement_lcb``: the
    improvement's lower confidence bound at ``lcb_level`` by ``lcb_method`` (the certificate, §8.6; betting: on the
    estimates with weights capped at ``lcb_cap``, with its e-value ``improvement_e``)."""
    logp_new = passes.logprobs(policy, heldout.batch).logp
    cm = heldout.batch.completion_mask
    P, G = heldout.rewards.shape
    log_w = lambda logp: dg.sequence_log_ratio(logp, heldout.logp_alpha, cm, P, G)  # noqa: E731
    est = dg.bound_estimates(heldout.rewards, log_w(heldout.logp_k), log_w(logp_new), eps, reward_range,
                             standard_errors=True, lcb_level=lcb_level, lcb_method=lcb_method, lcb_cap=lcb_cap)
    rewards = heldout.rewards.mean(axis=1)
    est["reward"], est["reward_se"] = mean_and_standard_error(rewards)
    return dg.prefixed("heldout", est)

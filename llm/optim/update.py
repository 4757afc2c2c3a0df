"""The optimise phase of Algorithm 1: i = ``num_iterations`` optimiser steps on the clipped off-policy objective
(docs/theory.md, §6), each over the step's micro-batches (``optimise``).

Beside the objective, TRL's token-level knobs act here: ``loss_type="bnpo"`` normalises each micro-batch by its own
loss tokens (TRL's local normaliser: the step's gradient then depends on how it is split, unlike every other loss
type here), ``top_entropy_quantile`` keeps in the policy term only the tokens whose entropy (of the pass's policy)
is in the top share of the pass's completion tokens (TRL's quantile over TRL's tokens: zero-variance groups in the
pool), and ``entropy_coef`` subtracts coef x the mean entropy (``EntropyTerms``: over the whole step's completion
tokens, so it does not depend on the split, where TRL means it per micro-batch; with the quantile mask on, TRL's own
per-pass mean over the tokens the mask keeps) with its gradient."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from runkit.host_memory import micro_batches

from grpo_theory.estimators import kish_ess_fraction
from llm.tensors.batch import Batch
from llm.tensors.diagnostics import sequence_log_ratio
from llm.tensors.logprobs import Forward, TokenDists, idle_passes
from grpo_theory.loss_types import loss_type
from llm.tensors.loss import Clip, LossStats, grpo_loss, loss_weights, step_mask_torch
from llm.tensors.passes import Passes
from llm.models.distributed import Ranks, clip_gradients
from grpo_theory.vcpo import Baselining, baseline_log_weights, ess_step_factor, shift_advantages
from llm.optim.baseline import completion_gradient_norms


@dataclass(frozen=True)
class Objective:
    """The loss and its optimiser steps (``GRPOConfig`` names)."""

    num_iterations: int = 1
    clip: Clip = Clip()
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    loss_type: str = "dapo"
    max_completion_length: int = 1
    max_grad_norm: float = 1.0
    keep_hidden: bool = False  # tv_diagnostics: pi_k's hidden states for the chain-rule TV
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    ess_scaling: str = "none"  # VCPO's ESS-guided step: none, sqrt, linear (``ess_lr_factor``)
    ess_scaling_base_ess_ratio: float = 1.0
    baselining: Baselining | None = None  # VCPO's off-policy optimal baseline (``llm.optim.baseline``); None: off

    @property
    def entropy_every_pass(self) -> bool:
        """Whether every pass needs the entropy (an entropy mask or bonus), not only pi_k's for the log."""
        return self.top_entropy_quantile < 1.0 or self.entropy_coef != 0.0


@dataclass
class Optimised:
    """What the optimise phase leaves: pi_k's pass over the whole batch (log pi_k, its next-token entropy and, for
    the chain-rule TV, its hidden states), the chain-rule TV estimate between pi_k and alpha (taken before the update,
    while the policy's output layer is still pi_k's; 0 at lag 0, where alpha = pi_k; None without the token-level TV
    diagnostics), the last inner step's loss statistics and the gradient norm."""

    pi_k: Forward
    chain_tv_k: float | None
    stats: LossStats
    grad_norm: float
    skipped: int = 0
    """Inner steps whose loss or gradient was not finite: no optimiser step was taken (the rest of the batch's
    inner steps are skipped too, as they would start from the same weights)."""
    lr_factor: float | None = None
    """VCPO's ESS-guided factor on the learning rate of the batch's optimiser steps (None: ``ess_scaling`` none)."""
    baseline_shift: float | None = None
    """VCPO's baseline: the mean |shift| of the loss's advantages (None: ``grad_baselining`` off)."""


def ess_lr_factor(logp_k: torch.Tensor, logp_alpha: torch.Tensor | None, mask: torch.Tensor, rule: str,
                  base: float) -> float:
    """VCPO's ESS-guided factor (arXiv 2602.17616; mit-han-lab/vcpo's actor: ``compute_ess_info`` and the step's
    scaling): rho = (sum w)^2 / (sum w^2) / n over the n completions with a policy token (``mask`` (B, T): the
    step's every completion, as the authors' minibatch holds every trajectory, zero-advantage ones included), w =
    exp(sum_t log pi_k/alpha) each (alpha None: lag 0, every w 1), then sqrt (or, ``rule`` linear, the value) of
    min(1, rho / ``base``). The weights are scaled by their largest first, which leaves rho unchanged and never
    overflows (the authors add 1e-8 to the denominator instead)."""
    rows = mask.sum(dim=1) > 0
    if logp_alpha is None or not bool(rows.any()):
        return 1.0
    log_w = sequence_log_ratio(logp_k, logp_alpha, mask.to(logp_k.dtype), mask.shape[0], 1)[rows.cpu().numpy(), 0]
    return ess_step_factor(kish_ess_fraction(np.exp(log_w - log_w.max())), rule, base)


def optimise(passes: Passes, objective: Objective, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
             batch: Batch, advantages: np.ndarray, keep: np.ndarray, logp_alpha: torch.Tensor | None,
             logp_ref: torch.Tensor | None, alpha_dists: TokenDists | None = None,
             sequence_keep: np.ndarray | None = None,
             before_step: Callable[[int], None] | None = None) -> Optimised:
    """The optimiser steps on ``batch`` (P x G rows) with the group ``advantages`` (P, G) and the groups the loss
    ``keep`` (P,) (and, with ``sequence_keep`` (P x G,), only those completions: ``mask_truncated_completions``).
    Each step accumulates the gradients of the micro-batches before one optimiser step; the loss weights (normaliser
    and masks) come from the whole step, so the gradient is the unsplit step's (but for ``bnpo`` and the entropy
    quantile: module docstring). The first inner step's forward is pi_k's: log pi_k at no extra cost; ``logp_alpha``
    None means alpha = pi_k (lag 0). ``alpha_dists``: alpha's distributions for the chain-rule TV. ``before_step(j)``
    runs before the j-th optimiser step (the learning-rate schedule)."""
    G = passes.group_size
    device = batch.input_ids.device
    seq = np.repeat(keep, G).astype(np.float32)
    if sequence_keep is not None:
        seq = seq * np.asarray(sequence_keep, dtype=np.float32)
    shift = None
    if objective.baselining is not None:
        advantages, shift = baselined(passes, objective, policy, batch, advantages, seq > 0, logp_alpha)
    adv = torch.tensor(advantages.reshape(-1), dtype=torch.float32, device=device)
    seq_mask = torch.tensor(seq, dtype=torch.float32, device=device)
    weights = loss_weights(batch.policy_mask, objective.loss_type, objective.max_completion_length, seq_mask)
    parts = passes.split(batch)
    if loss_type(objective.loss_type).per_pass:  # bnpo: each pass's loss tokens are its own normaliser
        weights = bnpo_weights(batch.policy_mask * seq_mask[:, None], parts, passes.ranks)
    # every completion token but those truncation masking drops, zero-variance groups included: TRL's completion
    # mask, the tokens of its entropy bonus and entropy quantile, and M2PO's N tokens of the batch
    tokens = batch.policy_mask * (1.0 if sequence_keep is None else torch.tensor(
        np.asarray(sequence_keep, dtype=np.float32), device=device)[:, None])
    per_pass = objective.entropy_coef and objective.top_entropy_quantile < 1.0  # TRL: a mean per pass, accumulated
    entropy = EntropyTerms(objective.top_entropy_quantile, objective.entropy_coef, tokens,
                           passes.ranks.sum_float(float(len(parts))) if per_pass else 1.0)
    token_keep = None  # M2PO at lag 0 (alpha = pi_k, every log w = 0) keeps every token: no mask, no extra pass
    if objective.clip.correction.step_mask and logp_alpha is not None:
        logp_k = passes.logprobs(policy, batch).logp  # one pass more: pi_k on every micro-batch before the first loss
        token_keep = step_mask_torch(objective.clip.correction, logp_k - logp_alpha, adv.reshape(-1, 1).expand_as(
            tokens), tokens, objective.clip.step_threshold)
    ranks, first, result = passes.ranks, [], Optimised(None, None, LossStats(), 0.0, baseline_shift=shift)
    for it in range(objective.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        stats = inner_step(passes, objective, policy, batch, parts, first, adv, weights, logp_alpha, logp_ref,
                           entropy, token_keep)
        if it == 0:  # pi_k's pass over the whole batch, before the update (the output layer is still pi_k's)
            result.pi_k = passes.whole_batch(Forward.assemble(batch, parts, first))
            if objective.keep_hidden:  # alpha's distributions None: alpha = pi_k (lag 0), whose chain TV is 0
                result.chain_tv_k = 0.0 if alpha_dists is None else passes.chain_tv(
                    passes.dists(policy, result.pi_k.hidden), alpha_dists, batch.policy_mask)
        result.stats = reduce_stats(ranks, stats)
        ranks.sum_grads(policy.parameters())  # the ranks' shares add up to the whole step's gradient
        if result.stats.tokens == 0:
            break  # every group masked: nothing to learn from this batch
        result.grad_norm = ranks.grad_norm(policy.parameters())
        if not (math.isfinite(result.stats.loss) and math.isfinite(result.grad_norm)):
            optimizer.zero_grad(set_to_none=True)
            result.skipped = objective.num_iterations - it
            break
        if objective.max_grad_norm > 0:
            clip_gradients(policy.parameters(), objective.max_grad_norm, result.grad_norm)
        if before_step is not None:
            before_step(it)
        if objective.ess_scaling != "none":
            if result.lr_factor is None:  # pi_k's weights over the step's completions, the same every inner step
                result.lr_factor = ess_lr_factor(result.pi_k.logp, logp_alpha, batch.policy_mask > 0,
                                                 objective.ess_scaling, objective.ess_scaling_base_ess_ratio)
            base = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * result.lr_factor
            optimizer.step()
            for group, lr in zip(optimizer.param_groups, base):
                group["lr"] = lr
        else:
            optimizer.step()
    return result


def baselined(passes: Passes, objective: Objective, policy: torch.nn.Module, batch: Batch, advantages: np.ndarray,
              in_loss: np.ndarray, logp_alpha: torch.Tensor | None) -> tuple[np.ndarray, float]:
    """The advantages (P, G) shifted by VCPO's off-policy optimal baseline (``llm.optim.baseline``) over the loss's
    completions (``in_loss`` (P x G,)), and the mean |shift|. With scope group, a group whose advantages are all equal
    (zero variance) keeps them, and its completions' gradients are not computed."""
    if passes.ranks.active:
        raise ValueError("grad_baselining: needs every completion's own gradient on one process; run it without "
                         "torchrun")
    settings = objective.baselining
    adv = np.asarray(advantages, dtype=np.float64)
    lengths = batch.policy_mask.sum(dim=1).cpu().numpy()
    live = in_loss.reshape(adv.shape) & (lengths > 0).reshape(adv.shape)
    if settings.scope == "group":
        live &= (np.ptp(adv, axis=1) > 0)[:, None]
    norms, log_w = completion_gradient_norms(passes, objective.clip, policy, batch, logp_alpha, live.reshape(-1))
    log_weights = baseline_log_weights(norms, log_w, lengths, settings).reshape(adv.shape)
    return shift_advantages(adv, log_weights, live, settings.scope)


def bnpo_weights(on: torch.Tensor, parts: list[torch.Tensor], ranks: Ranks) -> torch.Tensor:
    """TRL's ``bnpo`` weights: each pass's loss tokens (``on`` (B, T)) over that pass's count, over the number of
    passes of the step (every rank's)."""
    weights = torch.zeros_like(on)
    for rows in parts:
        r = rows.to(on.device)
        weights[r] = on[r] / on[r].sum().clamp(min=1.0)
    return weights / max(ranks.sum_float(float(len(parts))), 1.0)


def high_entropy_mask(entropy: torch.Tensor, pool: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's ``top_entropy_quantile``: the tokens of ``pool`` (B, T) bool whose entropy is at least the
    (1 - quantile)-quantile of the pool's entropies, as a float mask (B, T)."""
    values = entropy[pool].float()
    if values.numel() == 0:
        return torch.zeros_like(entropy)
    threshold = torch.quantile(values, 1.0 - quantile)
    return ((entropy >= threshold) & pool).to(entropy.dtype)


@dataclass
class EntropyTerms:
    """TRL's entropy knobs over TRL's tokens (``tokens`` (B, T): every completion token but those truncation masking
    drops, zero-variance groups included): the quantile mask of each pass's tokens (``top_entropy_quantile``), and the
    bonus ``coef`` x the mean entropy, over the whole step's tokens when every token is kept (so the gradient does not
    depend on the split; TRL means it per pass), else, as TRL, over each pass's tokens the mask keeps, per pass and
    divided by the step's number of passes (``passes``, over every rank)."""

    quantile: float
    coef: float
    tokens: torch.Tensor
    passes: float = 1.0

    def mask(self, entropy: torch.Tensor, rows, t: int) -> torch.Tensor | None:
        """The pass's quantile mask (B, T) float, or None without one."""
        if self.quantile >= 1.0:
            return None
        return high_entropy_mask(entropy.detach(), self.tokens[rows, :t] > 0, self.quantile)

    def bonus(self, rows, t: int, mask: torch.Tensor | None) -> torch.Tensor | None:
        """The pass's bonus weight per token (its loss term is -sum weight x H), or None without a bonus."""
        if not self.coef:
            return None
        if mask is None:
            return self.coef * self.tokens[rows, :t] / self.tokens.sum().clamp(min=1.0)
        return self.coef * mask / mask.sum().clamp(min=1.0) / max(self.passes, 1.0)


def inner_step(passes: Passes, objective: Objective, policy: torch.nn.Module, batch: Batch,
               parts: list[torch.Tensor], first: list[Forward], adv: torch.Tensor, weights: torch.Tensor,
               logp_alpha: torch.Tensor | None, logp_ref: torch.Tensor | None,
               entropy: EntropyTerms, token_keep: torch.Tensor | None = None) -> LossStats:
    """One inner step's forward and backward passes over this rank's ``parts`` of the batch (the gradients add up
    in the parameters). The first inner step records each pass's pi_k forward in ``first``. ``entropy``: TRL's
    entropy mask and bonus; ``token_keep`` (B, T): M2PO's mask."""
    record = not first
    idle = passes.ranks.idle_passes(len(parts))  # a collective: before any pass's own gathers
    stats = LossStats()
    for j, rows in enumerate(micro_batches(parts)):
        mb = batch.take(rows)
        fwd = passes.forward(policy, mb, entropy=record or objective.entropy_every_pass,
                             keep_hidden=record and objective.keep_hidden, entropy_grad=bool(entropy.coef))
        if record:
            first.append(Forward(fwd.logp.detach(), None if fwd.entropy is None else fwd.entropy.detach(),
                                 fwd.hidden))
        logp_k = first[j].logp
        t = mb.completion_ids.shape[1]
        cols = lambda x: x[rows, :t]  # noqa: E731  (B, T) -> this pass's rows and columns
        w = cols(weights)
        entropy_mask = entropy.mask(fwd.entropy, rows, t)
        bonus = entropy.bonus(rows, t, entropy_mask)
        loss, part = grpo_loss(
            fwd.logp, logp_k, logp_k if logp_alpha is None else cols(logp_alpha), adv[rows], w,
            clip=objective.clip, beta=objective.beta,
            logp_ref=None if logp_ref is None else cols(logp_ref),
            use_bias_correction_kl=objective.use_bias_correction_kl, entropy_mask=entropy_mask,
            token_keep=None if token_keep is None else cols(token_keep))
        if bonus is not None:
            loss = loss - (fwd.entropy * bonus).sum()
        stats = stats.merge(part)
        if part.tokens:
            loss.backward()
        elif passes.ranks.fsdp:  # the sharded blocks' backward needs every rank: a zero gradient from this one
            (fwd.logp.sum() * 0).backward()
    idle_passes(idle, policy, batch, passes.temperature, passes.precision, passes.chunk_tokens, backward=True,
                token_filter=passes.token_filter)
    return stats


def reduce_stats(ranks: Ranks, stats: LossStats) -> LossStats:
    """The step's loss statistics over every rank's tokens (sums added)."""
    if not ranks.active:
        return stats
    names, n = sorted(stats.optional), len(LossStats.SUMS)
    sums = torch.tensor([*(getattr(stats, k) for k in LossStats.SUMS), *(stats.optional[k] for k in names)],
                        dtype=torch.float64)
    ranks.sum(sums)
    v = sums.tolist()
    return LossStats(**dict(zip(LossStats.SUMS, v[:n])), optional=dict(zip(names, v[n:])))

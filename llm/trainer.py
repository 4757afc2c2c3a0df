"""Algorithm 1 (docs/theory.md, §7) on a causal language model: ``train(config)``.

``train`` is a loop over named phases, one function each, in the order a step runs them:

    sync        every v steps the sampler gets the trainer's weights (alpha <- pi_theta)
    rollout     G completions per prompt (training and held-out) from alpha  (``llm.rollout``; with
                ``async_generation`` the next window is generated while this one trains)
    score       verifiable rewards (reward functions: any finite number)   (``score``)
    advantages  group whitening and the zero-variance mask                 (``advantages``)
    behaviour   log alpha (sampler's or recomputed) and log pi_ref         (``behaviour_logprobs``)
    optimise    i steps on the clipped off-policy objective (+ beta KL)    (``optimise``)
    diagnose    TV distances, Theorem 1 terms and the exact improvement    (``diagnose``, ``diagnose_heldout``,
                (estimates in ``llm.diagnostics``, exact J in ``llm.evaluation``)           ``ExactJ``)
    evaluate    every ``eval_steps`` steps, on the test prompts            (``llm.evaluation.evaluate``)
    log         one row of metrics.jsonl                                   (``llm.rundir``)
    checkpoint  every ``save_steps`` steps, at the end and on Ctrl-C       (``save_checkpoint``)

Every knob is read where it acts: ``sync_period`` (v) at the sync, ``num_iterations`` (i) in
``optimise``, ``ref_sync_steps`` at the reference reset. Under torchrun each phase runs on every rank over its
share of the prompts, and rank 0 alone generates, scores and writes (``llm.distributed``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import grpo_theory as gt
from runkit.cli import RunError
from runkit.interrupt import GracefulStop

from . import diagnostics as dg
from .batch import Batch, make_batch, padded
from .evaluation import evaluate, mean_exact_j
from .config import GRPOConfig
from .distributed import (SINGLE, Ranks, clip_gradients, close_ranks, collective_failure, gather_into, init_ranks,
                          load_whole_optimizer_state, load_whole_state_dict, shard_blocks, whole_optimizer_state,
                          whole_state_dict)
from .logprobs import (Forward, LogitHead, TokenDists, check_head, completion_logprobs, forward_completions,
                       idle_pass)
from .loss import LossStats, grpo_loss, loss_weights
from .model import Precision, add_lora, copy_weights, frozen_copy, is_lora, load_policy, resolve_device
from .pretrained import resolve_model_path
from .rollout import RolloutWindow, StepRollout, weights_step, window_start
from .metrics import PHASES
from .rundir import RunDir, read_metrics
from .sampling import Rollout, Sampler, TransformersSampler, make_sampler, max_model_len, probe_sync
from .trackers import Trackers, check_trackers
from .tasks import TokenizedTask, load_task

#: Warn when sampler and trainer log-probs of the same tokens differ by more than this (worst token of
#: the batch) right after a sync. float32 engines agree to ~5e-6 per token at the median and up to
#: ~7e-5 on rare tokens (log-prob < -10) over batches of ~1,500 tokens; bfloat16 ones differ by
#: rounding (~2e-2). A stale engine is off by more than 1 nat.
SYNC_LOGP_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25}

StepCallback = Callable[[int, dict], None]

#: Completions of the last step written to samples.jsonl at each checkpoint (the first of each of as many groups).
SAMPLES_KEPT = 4


# ----------------------------------------------------------------------------------------------
# What a run holds
# ----------------------------------------------------------------------------------------------


@dataclass
class Models:
    """The policy pi_theta and everything around it: optimiser, sampler (alpha), and the trainer-side
    copies of alpha's weights (``alpha``: for recomputed log-probs, TV diagnostics and checkpoints; the
    transformers sampler's own copy serves) and of pi_ref (``ref``, None when beta = 0)."""

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sampler: Sampler
    alpha: torch.nn.Module
    ref: torch.nn.Module | None
    tokenizer: object
    device: torch.device
    precision: Precision
    alpha_next: torch.nn.Module | None = None
    """Asynchronous generation: the weights the sampler holds while it generates the next window (alpha's
    successor at the next sync); None otherwise."""
    ranks: Ranks = SINGLE
    """This process among the trainer's processes (``llm.distributed``; one process: ``SINGLE``)."""
    staging: torch.nn.Module | None = None
    """Under FSDP, rank 0's unsharded copy of the weights (in CPU memory), into which ``unsharded`` gathers the
    policy or alpha for the sampler, evaluation and the saved model; None otherwise."""


class NoSampler:
    """The sampler of a rank other than 0: rank 0 alone generates and syncs (``llm.distributed``)."""

    name = "rank 0's"

    def load_weights(self, model) -> None:
        pass

    def close(self) -> None:
        pass


def setup(config: GRPOConfig, log=print, ranks: Ranks = SINGLE) -> tuple[Models, TokenizedTask, str]:
    """Load the task, the policy and its tokenizer, the optimiser and the sampler (alpha = the policy); with several
    ranks, rank 0 alone holds the sampler."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    if ranks.active and device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    if ranks.active and in_process_vllm(config):
        raise ValueError("sampler: the in-process vLLM engine sets up torch.distributed for itself and cannot share "
                         "torchrun's process group; under torchrun use --sampler server (vLLM in its own process) or "
                         "--sampler transformers")
    task = load_task(config.dataset, config.reward_fn, config.eval_dataset, config.reward_funcs, config.reward_weights,
                     config.answer_check, config.generator)
    if not ranks.main:
        ranks.barrier()  # rank 0 builds the built-in model's files first
    model_path = resolve_model_path(config.model_name_or_path, log=log)
    if ranks.main:
        ranks.barrier()
    policy, tokenizer = load_policy(model_path, device, config.trust_remote_code, config.attn_implementation)
    policy.train()
    if config.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.use_peft:
        policy = add_lora(policy, config.lora_r, config.lora_alpha, config.lora_target_modules)
    bound = task.bind(tokenizer, config.chat_template)  # prompt tokens once; indexed by prompt every step
    check_head(policy, make_batch(bound.prompt_ids[:2], [p[:3] for p in bound.prompt_ids[:2]], tokenizer.pad_token_id,
                                  device), config.temperature)  # the chunked log-probs know this output layer
    if config.exact_j and bound.max_accepted_length > config.max_completion_length:
        raise ValueError(f"max_completion_length: the task's accepted completions need {bound.max_accepted_length} "
                         f"tokens, more than {config.max_completion_length}; raise it or pass --no-exact-j")
    longest = max(map(len, bound.prompt_ids + bound.test_prompt_ids))
    max_model_len(policy, config, longest)  # the longest prompt plus a whole completion fit the model's positions
    sampler = make_sampler(config, policy, tokenizer, model_path, longest) if ranks.main else NoSampler()
    if config.verify_sync and sampler.name in ("vllm", "server"):  # refuse an architecture the sync cannot reach
        probe_sync(sampler, policy, bound.prompt_ids[:2], tokenizer.pad_token_id, config.temperature,
                   Precision.from_config(config), SYNC_LOGP_TOLERANCE[config.dtype])  # ends with the policy's weights
    elif sampler.name == "server":  # a server's weights may be anyone's: send the initial policy
        sampler.load_weights(policy)
    own = isinstance(sampler, TransformersSampler) and not config.async_generation and not ranks.active
    # FSDP: each copy is sharded as soon as it is made (one whole copy besides the policy at a time); rank 0 also
    # keeps one whole copy, in CPU memory, to hand out
    copy = (lambda: shard_blocks(frozen_copy(policy))) if ranks.fsdp else (lambda: frozen_copy(policy))
    alpha = sampler.model if own else copy()  # asynchronous: the sampler runs ahead of alpha
    alpha_next = copy() if config.async_generation else None
    ref = copy() if config.beta > 0 else None
    staging = frozen_copy(policy).to("cpu") if ranks.fsdp and ranks.main else None
    if ranks.fsdp:
        shard_blocks(policy)
    trainable = [p for p in policy.parameters() if p.requires_grad]  # all, or the LoRA adapters (after sharding)
    opt = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    return (Models(policy, opt, sampler, alpha, ref, tokenizer, device, Precision.from_config(config), alpha_next,
                   ranks, staging), bound, model_path)


def in_process_vllm(config: GRPOConfig) -> bool:
    """True when the run's sampler is the in-process vLLM engine (``vllm``, or ``auto`` with vLLM installed)."""
    if config.sampler != "auto":
        return config.sampler == "vllm"
    from .sampling.vllm_engine import vllm_available

    return vllm_available()


# ----------------------------------------------------------------------------------------------
# The phases of a step
# ----------------------------------------------------------------------------------------------


def logprobs(config: GRPOConfig, models: Models, model: torch.nn.Module, batch: Batch, **kw) -> Forward:
    """A pass of ``model`` without gradients over ``batch`` in the config's micro-batches and logit chunks. With
    several ranks each runs its share of the rows and the per-token results are summed into the whole batch's
    (hidden states stay with their rank)."""
    ranks = models.ranks
    out = completion_logprobs(model, batch, config.temperature, models.precision,
                              micro_batch=config.per_device_train_batch_size, chunk_tokens=config.logit_chunk_tokens,
                              by_length=config.group_by_length, rows=ranks.rows(batch.size, config.num_generations),
                              ranks=ranks, share_prompts=config.prompts_shared, **kw)
    return whole_batch(ranks, out)


def whole_batch(ranks: Ranks, fwd: Forward) -> Forward:
    """The ranks' per-token log-probs and entropies (each zero outside its rows) summed into the whole batch's."""
    if ranks.active:
        ranks.sum(fwd.logp)
        if fwd.entropy is not None:
            ranks.sum(fwd.entropy)
    return fwd


def chain_tv(config: GRPOConfig, models: Models, a: TokenDists, b: TokenDists, mask: torch.Tensor) -> float:
    """``llm.diagnostics.chain_tv_estimate`` over the whole batch: each rank sums over its own rows (where its
    hidden states are) and the sums are added up."""
    sequences = mask.shape[0]
    rows = models.ranks.rows(sequences, config.num_generations)
    if rows is not None:
        mine = torch.zeros_like(mask)
        mine[rows.to(mask.device)] = mask[rows.to(mask.device)]
        mask = mine
    return dg.chain_tv_estimate(models.ranks.sum_float(dg.chain_tv_sum(a, b, mask, config.logit_chunk_tokens)),
                                sequences)


def dists(config: GRPOConfig, models: Models, model: torch.nn.Module, hidden: torch.Tensor | None) -> TokenDists | None:
    """``model``'s next-token distributions at the completion positions whose final hidden states are ``hidden``."""
    return None if hidden is None else TokenDists(LogitHead(model, config.temperature), hidden, models.precision)


def sync_weights(models: Models, source: torch.nn.Module | None = None) -> None:
    """alpha <- ``source`` (the policy by default): into the sampler and the trainer-side copy of alpha. With
    asynchronous generation the sampler's new weights serve the next window: alpha <- alpha_next <- ``source``."""
    source = models.policy if source is None else source
    if models.alpha_next is None:
        serve_as_alpha(models, source)
        return
    models.sampler.load_weights(unsharded(models, source))  # a no-op on ranks other than 0
    copy_weights(models.alpha, models.alpha_next)
    copy_weights(models.alpha_next, source)


def serve_as_alpha(models: Models, weights: torch.nn.Module) -> None:
    """alpha <- ``weights``: the sampler's (a no-op on ranks other than 0) and the trainer-side copy's, unless the
    sampler's model is that copy."""
    models.sampler.load_weights(unsharded(models, weights))
    if models.alpha is not getattr(models.sampler, "model", None):
        copy_weights(models.alpha, weights)


def unsharded(models: Models, source: torch.nn.Module) -> torch.nn.Module:
    """``source``'s weights where rank 0 can hand them to the sampler, evaluate or save them: ``source`` itself, or
    under FSDP rank 0's whole copy (``Models.staging``) after every rank has taken part in gathering them into it
    (so every rank calls this; ranks other than 0 get ``source`` back, for calls that do nothing there)."""
    if not models.ranks.fsdp:
        return source
    gather_into(models.staging, source)
    return models.staging if models.ranks.main else source


def sync_metrics(sampler: Sampler, seconds: float) -> dict[str, float]:
    """``sync/mb`` and ``sync/mb_per_s`` of a sync, for samplers that report the bytes they moved."""
    nbytes = getattr(sampler, "last_sync_bytes", 0)
    return {"sync/mb": nbytes / 1e6, "sync/mb_per_s": nbytes / 1e6 / max(seconds, 1e-9)} if nbytes else {}


def score(task: TokenizedTask, prompt_idx: list[int], roll: Rollout, n: int) -> tuple[np.ndarray, list[str]]:
    """Rewards of the P x n completions, shape (P, n), and the decoded completions (with reward functions, each
    one's values are in ``task.last_parts``: ``reward_metrics``)."""
    texts = task.tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=True)
    rows = [i for i in prompt_idx for _ in range(n)]
    return task.score(rows, texts, roll.completion_ids).reshape(len(prompt_idx), n), texts


def score_once(ranks: Ranks, task: TokenizedTask, prompt_idx: list[int], roll: Rollout,
               n: int) -> tuple[np.ndarray, list[str]]:
    """``score`` on rank 0 (reward functions run once per completion), the result on every rank."""
    scored = (*score(task, prompt_idx, roll, n), task.last_parts) if ranks.main else None
    rewards, texts, parts = ranks.broadcast(scored)
    task.last_parts = parts
    return rewards, texts


def reward_metrics(task: TokenizedTask) -> dict[str, float]:
    """``rewards/<name>/mean|std`` of each reward function over the last scored completions it applied to (TRL's
    names and convention: None is left out; the standard deviation with n - 1)."""
    out = {}
    for name, values in task.last_parts.items():
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


def advantages(rewards: np.ndarray, config: GRPOConfig) -> Groups:
    """Group whitening with ``grpo_theory.group_advantages`` and the zero-variance mask (docs/theory.md, §5)."""
    adv = gt.group_advantages(rewards, config.variance_eps, scale=config.scale_rewards == "group")
    zero_std = np.ptp(rewards, axis=1) == 0
    keep = ~zero_std if config.mask_zero_std_groups else np.ones(len(rewards), bool)
    return Groups(adv, zero_std, keep)


@dataclass
class Behaviour:
    """log alpha of the completion tokens, (B, T) float32: the one the loss uses (``logp``), the sampler's
    report and the trainer's recomputation with alpha's weights (each None when not available), and
    alpha's next-token distributions (``dists``, only for the token-level TV diagnostics).

    ``from_pi_k``: right after a sync alpha's weights are pi_k's, so the recomputation is the first inner
    step's forward of the policy; ``logp`` (if it is the recomputation), ``recomputed`` and ``dists`` are
    then filled in from ``optimise``'s pass (``with_pi_k``) instead of costing a forward pass of their own."""

    logp: torch.Tensor | None
    from_sampler: torch.Tensor | None
    recomputed: torch.Tensor | None
    dists: TokenDists | None
    from_pi_k: bool = False
    checked_rows: int = 0
    """When the recomputation served the sync check alone (asynchronous generation): it covers the first
    ``checked_rows`` sequences only (one prompt's group); 0: every sequence."""

    def with_pi_k(self, logp_k: torch.Tensor, dists_k: TokenDists | None) -> "Behaviour":
        """The behaviour log-probs once log pi_k (= log alpha at lag 0) is known; ``dists_k``: pi_k's
        distributions through alpha's own (identical) output layer, which outlives the update."""
        if not self.from_pi_k:
            return self
        return Behaviour(logp_k if self.logp is None else self.logp, self.from_sampler, logp_k, dists_k)


def behaviour_logprobs(config: GRPOConfig, models: Models, batch: Batch, roll: Rollout, lag: int,
                       diagnostics: bool = True, fresh: bool | None = None) -> Behaviour:
    """log alpha from the sampler, recomputed by the trainer when the config needs it, and at the first step
    served by newly synced weights (``fresh``; by default lag 0, right after a sync) when ``verify_sync`` is on,
    so a stale sampler is always caught. At lag 0 the recomputation is pi_k's forward, which the caller has or
    will have anyway: no extra pass (``from_pi_k``; resolved with ``Behaviour.with_pi_k``); with asynchronous
    generation (lag >= v) it is a forward of alpha's weights. ``diagnostics=False`` (held-out completions):
    recompute only if the loss's convention needs it."""
    fresh = lag == 0 if fresh is None else fresh
    T = batch.completion_ids.shape[1]
    from_sampler = padded(roll.logprobs, T, models.device) if roll.logprobs is not None else None
    need = config.behaviour_logprobs == "recompute" or from_sampler is None
    check = diagnostics and (config.tv_diagnostics or (fresh and config.verify_sync))
    use_sampler = config.behaviour_logprobs == "sampler" and from_sampler is not None
    if lag == 0 and (need or check):
        return Behaviour(from_sampler if use_sampler else None, from_sampler, None, None, from_pi_k=True)
    if not (need or check):
        return Behaviour(from_sampler, from_sampler, None, None)
    if not need and not config.tv_diagnostics:  # the sync check alone: one group's forward of alpha suffices
        G = config.num_generations
        part = logprobs(config, models, models.alpha, batch.take(torch.arange(G))).logp
        recomputed = torch.zeros_like(from_sampler)
        recomputed[:G, :part.shape[1]] = part
        return Behaviour(from_sampler, from_sampler, recomputed, None, checked_rows=G)
    alpha = logprobs(config, models, models.alpha, batch, keep_hidden=diagnostics and config.tv_diagnostics)
    return Behaviour(from_sampler if use_sampler else alpha.logp, from_sampler, alpha.logp,
                     dists(config, models, models.alpha, alpha.hidden))


def reference_logprobs(config: GRPOConfig, models: Models, batch: Batch) -> torch.Tensor | None:
    """log pi_ref of the completion tokens (None when beta = 0)."""
    if models.ref is None:
        return None
    return logprobs(config, models, models.ref, batch).logp


@dataclass
class Optimised:
    """What the optimise phase leaves: log pi_k and pi_k's next-token entropy (B, T), its final hidden states at
    the completion positions (token-level TV diagnostics only), the chain-rule TV estimate between pi_k and alpha
    (taken before the update, while the policy's output layer is still pi_k's; 0 at lag 0, where alpha = pi_k),
    the last inner step's loss statistics and the gradient norm."""

    logp_k: torch.Tensor
    entropy_k: torch.Tensor
    hidden_k: torch.Tensor | None
    chain_tv_k: float | None
    stats: LossStats
    grad_norm: float
    skipped: int = 0
    """Inner steps whose loss or gradient was not finite: no optimiser step was taken (the rest of the batch's
    inner steps are skipped too, as they would start from the same weights)."""


def optimise(config: GRPOConfig, models: Models, batch: Batch, groups: Groups, logp_alpha: torch.Tensor | None,
             logp_ref: torch.Tensor | None, alpha_dists: TokenDists | None = None) -> Optimised:
    """i = ``num_iterations`` optimiser steps on the clipped off-policy objective (docs/theory.md, §6).

    Each step accumulates the gradients of the micro-batches (``per_device_train_batch_size`` completions each)
    before one optimiser step. The loss weights (normaliser and zero-variance mask) are computed once from the
    whole step, so the accumulated gradient is the unsplit step's. The policy before any update is pi_k, so the
    first inner step's forward gives log pi_k at no extra cost; ``logp_alpha`` None means alpha = pi_k (right after
    a sync, log alpha is that forward's). ``alpha_dists``: alpha's distributions for the chain-rule TV (None at
    lag 0 or without the token-level TV diagnostics).
    """
    G, tv = config.num_generations, config.tv_diagnostics
    adv = torch.tensor(groups.advantages.reshape(-1), dtype=torch.float32, device=models.device)
    seq_mask = torch.tensor(np.repeat(groups.keep, G), dtype=torch.float32, device=models.device)
    weights = loss_weights(batch.completion_mask, config.loss_type, config.max_completion_length, seq_mask)
    ranks = models.ranks
    parts = batch.passes(config.per_device_train_batch_size, config.group_by_length, ranks.rows(batch.size, G))
    passes = [batch.take(rows) for rows in parts]
    idle = ranks.idle_passes(len(parts))  # FSDP: every rank runs as many passes as the one with the most
    stats, grad_norm, chain_tv_k, first, skipped = LossStats(), 0.0, None, [], 0
    for it in range(config.num_iterations):
        models.optimizer.zero_grad(set_to_none=True)
        stats = LossStats()
        for j, (rows, mb) in enumerate(zip(parts, passes)):
            fwd = forward_completions(models.policy, mb, config.temperature, models.precision,
                                      config.logit_chunk_tokens, entropy=it == 0, keep_hidden=it == 0 and tv,
                                      share_prompts=config.prompts_shared)
            if it == 0:
                first.append(Forward(fwd.logp.detach(), fwd.entropy, fwd.hidden))
            logp_k = first[j].logp
            t = mb.completion_ids.shape[1]
            cols = lambda x: x[rows, :t]  # noqa: E731  (B, T) -> this pass's rows and columns
            loss, part = grpo_loss(
                fwd.logp, logp_k, logp_k if logp_alpha is None else cols(logp_alpha), adv[rows], cols(weights),
                clip=config.epsilon, ratio_level=config.ratio_level, beta=config.beta,
                logp_ref=None if logp_ref is None else cols(logp_ref),
                use_bias_correction_kl=config.use_bias_correction_kl)
            stats = stats.merge(part)
            if part.tokens:
                loss.backward()
            elif ranks.fsdp:  # the sharded blocks' backward needs every rank: a zero gradient from this one
                (fwd.logp.sum() * 0).backward()
        for _ in range(idle):
            idle_pass(models.policy, batch, config.temperature, models.precision, config.logit_chunk_tokens).backward()
        if it == 0:  # pi_k's pass over the whole batch: log pi_k, its entropy and hidden states
            k = whole_batch(ranks, Forward.assemble(batch, parts, first))
            if tv:  # before the update: the policy's output layer is still pi_k's
                chain_tv_k = 0.0 if alpha_dists is None else chain_tv(
                    config, models, dists(config, models, models.policy, k.hidden), alpha_dists,
                    batch.completion_mask)
        stats = reduce_stats(ranks, stats)
        ranks.sum_grads(models.policy.parameters())  # the ranks' shares add up to the whole step's gradient
        if stats.tokens == 0:
            break  # every group masked: nothing to learn from this batch
        grad_norm = ranks.grad_norm(models.policy.parameters())
        if not (math.isfinite(stats.loss) and math.isfinite(grad_norm)):
            models.optimizer.zero_grad(set_to_none=True)
            skipped = config.num_iterations - it
            break
        if config.max_grad_norm > 0:
            clip_gradients(models.policy.parameters(), config.max_grad_norm, grad_norm)
        models.optimizer.step()
    return Optimised(k.logp, k.entropy, k.hidden, chain_tv_k, stats, grad_norm, skipped)


def reduce_stats(ranks: Ranks, stats: LossStats) -> LossStats:
    """The step's loss statistics over every rank's tokens (sums added, minima and maxima taken)."""
    if not ranks.active:
        return stats
    kl_names = sorted(stats.kl)
    sums = torch.tensor([stats.loss, stats.tokens, stats.clip_low, stats.clip_high, stats.is_weight_sum,
                         *(stats.kl[k] for k in kl_names)], dtype=torch.float64)
    ranks.sum(sums)
    lo, hi = -ranks.max_float(-stats.is_weight_min), ranks.max_float(stats.is_weight_max)
    v = sums.tolist()
    return LossStats(v[0], v[1], v[2], v[3], v[4], lo, hi, dict(zip(kl_names, v[5:])))


def diagnose(config: GRPOConfig, models: Models, batch: Batch, rewards: np.ndarray, groups: Groups,
             roll: Rollout, behaviour: Behaviour, optimised: Optimised, step: int,
             reward_range: dg.RewardRange = dg.UNIT_RANGE) -> dict[str, float]:
    """Metrics of the step on the training batch: rollout statistics, the loss's statistics, the unbiased
    pi_k quantities and (``insample_diagnostics``, every ``insample_diagnostics_steps`` steps) the in-sample
    estimates of the terms involving pi_{k+1} (one forward pass of it). Theorem 1's terms are those of the
    rewards rescaled from ``reward_range`` (``llm.diagnostics``)."""
    cm = batch.completion_mask
    P, G = rewards.shape
    log_w_k = dg.sequence_log_ratio(optimised.logp_k, behaviour.logp, cm, P, G)
    row = dg.rollout_metrics(rewards, groups.zero_std, roll.completion_ids, models.tokenizer.eos_token_id)
    row["entropy"] = dg.mean_entropy(optimised.entropy_k, cm)
    row["grad_norm"] = optimised.grad_norm
    row["skipped_updates"] = optimised.skipped
    row.update(optimised.stats.metrics())
    row.update(dg.group_metrics(rewards, log_w_k, config.variance_eps, reward_range))
    if optimised.chain_tv_k is not None:
        row["tv/pi_k_alpha_chain_ub_est"] = optimised.chain_tv_k
    if config.insample_diagnostics and step % config.insample_diagnostics_steps == 0:
        new = logprobs(config, models, models.policy, batch, keep_hidden=behaviour.dists is not None)
        insample = dg.bound_estimates(rewards, log_w_k, dg.sequence_log_ratio(new.logp, behaviour.logp, cm, P, G),
                                      config.variance_eps, reward_range)
        for same in ("tv/pi_k_alpha", "ess/pi_k_alpha"):  # the same numbers as the top-level (unbiased) ones
            del insample[same]
        row.update(dg.prefixed("insample", insample))
        if behaviour.dists is not None:
            row["insample/tv/pi_new_alpha_chain_ub_est"] = chain_tv(
                config, models, dists(config, models, models.policy, new.hidden), behaviour.dists, cm)
    if behaviour.from_sampler is not None and behaviour.recomputed is not None:
        n = behaviour.checked_rows or cm.shape[0]
        row.update(dg.sampler_gap(behaviour.from_sampler[:n], behaviour.recomputed[:n], cm[:n]))
    return row


@dataclass
class Heldout:
    """The held-out prompts of a step: their rewards (P_h, G), batch, log alpha and log pi_k (before the update)."""

    rewards: np.ndarray
    batch: Batch
    logp_alpha: torch.Tensor
    logp_k: torch.Tensor


def prepare_heldout(config: GRPOConfig, models: Models, task: TokenizedTask, prompt_idx: list[int],
                    roll: Rollout, lag: int) -> Heldout:
    """Score the held-out prompts' completions and take log alpha and log pi_k of them (before the update)."""
    G = config.num_generations
    rewards, _ = score_once(models.ranks, task, prompt_idx, roll, G)
    batch = make_batch([task.prompt_ids[i] for i in prompt_idx for _ in range(G)], roll.completion_ids,
                       models.tokenizer.pad_token_id, models.device)
    logp_k = logprobs(config, models, models.policy, batch).logp
    logp_alpha = behaviour_logprobs(config, models, batch, roll, lag, diagnostics=False).with_pi_k(logp_k, None).logp
    return Heldout(rewards, batch, logp_alpha, logp_k)


def diagnose_heldout(config: GRPOConfig, models: Models, heldout: Heldout,
                     reward_range: dg.RewardRange = dg.UNIT_RANGE) -> dict[str, float]:
    """``heldout/*``: the bound's terms, TV distances and improvement estimated on prompts and completions
    that never entered the loss (unbiased over the prompt distribution; docs/theory.md, §8.2)."""
    logp_new = logprobs(config, models, models.policy, heldout.batch).logp
    cm = heldout.batch.completion_mask
    P, G = heldout.rewards.shape
    log_w = lambda logp: dg.sequence_log_ratio(logp, heldout.logp_alpha, cm, P, G)  # noqa: E731
    est = dg.bound_estimates(heldout.rewards, log_w(heldout.logp_k), log_w(logp_new), config.variance_eps,
                             reward_range, standard_errors=True)
    rewards = heldout.rewards.mean(axis=1)
    est["reward"], est["reward_se"] = float(rewards.mean()), float(rewards.std(ddof=1) / np.sqrt(P)) if P > 1 else \
        float("nan")
    return dg.prefixed("heldout", est)


def async_rollout(config: GRPOConfig, models: Models, rollouts: RolloutWindow, step: int, start: int, fresh: bool,
                  timer: PhaseTimer, row: dict) -> StepRollout:
    """A step's completions under asynchronous generation (``llm.rollout``). At a window's first step: wait for
    the window (generated in the background from alpha_next's weights), sync (alpha <- alpha_next <- pi_k, the
    sampler <- pi_k) and start generating the next window. The first step of a process generates its window now:
    from the initial weights, or on resume from the weights that generated it (alpha inside a window, alpha_next
    at its start), then hands the sampler alpha_next for the next window. ``fresh``: ``step`` starts a window."""
    ranks = models.ranks
    with timer("generate"):
        if step == start and start > 0 and fresh:
            models.sampler.load_weights(unsharded(models, models.alpha_next))  # this window's (restore sent alpha's)
        step_rollout = ranks.broadcast(rollouts.get(step) if ranks.main else None)
    if fresh and step > 0:
        with timer("sync"):
            sync_weights(models)
        row.update(sync_metrics(models.sampler, timer.seconds["time/sync"]))
    elif step == start and start > 0:  # resumed inside a window: the sampler goes on with the next window's weights
        models.sampler.load_weights(unsharded(models, models.alpha_next))
    if (fresh or step == start) and ranks.main:
        rollouts.prefetch(window_start(config, step) + config.sync_period)
    return step_rollout


class RangeTracker:
    """The reward range of Theorem 1's terms for a task scored by reward functions (any finite rewards): [0, 1]
    widened to every training and held-out reward seen, logged as ``bound/reward_lo|hi``; the first widening is
    announced. A resumed run starts from the range of the steps it keeps. Other tasks' rewards lie in [0, 1]."""

    def __init__(self, task: TokenizedTask, run: RunDir, start: int, log):
        self.active = bool(task.task.reward_funcs)
        self.range = dg.UNIT_RANGE
        if self.active and start:
            kept = [r for r in read_metrics(run.path) if "bound/reward_lo" in r]
            if kept:
                self.range = dg.RewardRange(min(r["bound/reward_lo"] for r in kept),
                                            max(r["bound/reward_hi"] for r in kept))
            if self.range != dg.UNIT_RANGE:
                log(f"rewards outside [0, 1] in the steps kept: Theorem 1's terms continue with their range "
                    f"[{self.range.lo:.4g}, {self.range.hi:.4g}], widened as new rewards are seen")

    def see(self, step: int, rewards: np.ndarray, heldout_rewards: np.ndarray, row: dict, write) -> dg.RewardRange:
        if not self.active:
            return self.range
        wider = self.range.widened(rewards).widened(heldout_rewards)
        if self.range == dg.UNIT_RANGE and wider != self.range:
            write(f"step {step}: rewards outside [0, 1] (seen so far: [{wider.lo:.4g}, {wider.hi:.4g}]): Theorem 1's "
                  "terms are from now on computed for the rewards rescaled from [0, 1] widened to every reward seen "
                  "(bound/reward_lo|hi), in units of the reward; they hold only if no reward lies outside that range")
        self.range = wider
        row["bound/reward_lo"], row["bound/reward_hi"] = wider.lo, wider.hi
        return wider


#: Warn when the importance weights' effective sample size falls below this fraction of the completions.
ESS_WARN_FRACTION = 0.1


class EssWatch:
    """Say when the Kish effective sample size of the sequence weights (``ess/*`` and ``heldout/ess/*``) falls
    below ``ESS_WARN_FRACTION`` of the completions: the estimates then rest on a handful of completions. Said once
    when it happens, again only after it has recovered."""

    def __init__(self):
        self.low = False

    def see(self, row: dict, write) -> None:
        low = {k: v for k, v in row.items() if "ess/" in k and not k.endswith("_se") and v < ESS_WARN_FRACTION}
        if low and not self.low:
            worst = min(low, key=low.get)
            write(f"WARNING step {row['step']}: the importance weights' effective sample size is {low[worst]:.1%} of "
                  f"the completions ({worst}): TV, improvement and bound estimates rest on a few completions "
                  "(their *_se say how much); a lower learning rate or v keeps the policies closer")
        self.low = bool(low)


class ExactJ:
    """Exact J(pi) over the training prompts (tasks with a finite set of accepted completions): J(pi_k) at the
    start of a step is J(pi_{k+1}) of the previous one (the same weights), so each step costs one forward pass.
    Under torchrun rank 0 alone measures it (every rank holds the same policy; rank 0 writes the row), except
    under FSDP, where every rank takes part in its passes."""

    def __init__(self, config: GRPOConfig, models: Models, task: TokenizedTask):
        self.enabled = config.exact_j and task.task.has_exact_j and models.ranks.joins_rank0
        self.config, self.models, self.task = config, models, task
        self._current: float | None = None

    def _measure(self) -> float:
        m = self.models
        return mean_exact_j(m.policy, self.task, self.config.temperature, m.tokenizer.pad_token_id, m.precision)

    def before_update(self) -> None:
        if self.enabled and self._current is None:
            self._current = self._measure()

    def after_update(self) -> dict[str, float]:
        """``j/pi_k``, ``j/pi_new`` and the exact ``improvement`` J(pi_{k+1}) - J(pi_k)."""
        if not self.enabled:
            return {}
        j_k, self._current = self._current, self._measure()
        return {"j/pi_k": j_k, "j/pi_new": self._current, "improvement": self._current - j_k}


def save_checkpoint(run: RunDir, models: Models, next_step: int) -> None:
    """Everything a resumed run needs: policy, optimiser, the lagged alpha and pi_ref, in the one-process layout
    (under FSDP gathered whole by every rank, kept by rank 0, which writes)."""
    keep = models.ranks.main

    def whole(model: torch.nn.Module | None) -> dict | None:
        return None if model is None else whole_state_dict(model, keep)

    run.save_checkpoint({
        "step": next_step,
        "policy": whole(models.policy),
        "optimizer": whole_optimizer_state(models.optimizer, keep),
        "alpha": whole(models.alpha),
        "alpha_next": whole(models.alpha_next),
        "ref": whole(models.ref),
        "world_size": models.ranks.world,
        "fsdp": models.ranks.fsdp,
    })


def restore_checkpoint(models: Models, ckpt: dict) -> int:
    """Load a checkpoint into ``models`` (alpha's weights re-sent to the sampler); returns the next step. Any
    checkpoint of the run loads, with or without FSDP (each rank keeps its shards)."""
    load_whole_state_dict(models.policy, ckpt["policy"])
    load_whole_optimizer_state(models.optimizer, ckpt["optimizer"])
    load_whole_state_dict(models.alpha, ckpt["alpha"])  # the transformers sampler's own model, when alpha is it
    serve_as_alpha(models, models.alpha)
    if models.alpha_next is not None:  # asynchronous generation: the weights of the window after this one
        load_whole_state_dict(models.alpha_next, ckpt["alpha_next"])
    if models.ref is not None:
        load_whole_state_dict(models.ref, ckpt["ref"])
    return ckpt["step"]


class PhaseTimer:
    """Wall-clock seconds of each phase of a step, as ``time/<phase>`` metrics."""

    def __init__(self, phases: Sequence[str] = PHASES):
        self.seconds: dict[str, float] = {f"time/{p}": 0.0 for p in phases}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{phase}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------


def train(config: GRPOConfig, log=print, callbacks: Sequence[StepCallback] = ()) -> Path:
    """Run Algorithm 1 with ``config``; returns the run directory. Resumes if it holds a checkpoint.

    ``callbacks`` are called as ``cb(step, row)`` after each step's metrics row is written (``row``: that row),
    after the trackers of ``config.report_to``.
    """
    ranks = init_ranks(resolve_device(config.device), config.fsdp)  # torchrun: this process's rank; else one process
    finished = False
    try:
        path = train_main(config, ranks, log, callbacks) if ranks.main else train_rank(config, ranks)
        finished = True
        return path
    except RuntimeError as exc:  # FSDP's gathers and reduce-scatters are not wrapped in Ranks.collective()
        if not (ranks.active and collective_failure(exc)):
            raise
        raise ranks.fault(exc) from None
    finally:
        close_ranks(ranks, finished)


def train_main(config: GRPOConfig, ranks: Ranks, log, callbacks: Sequence[StepCallback]) -> Path:
    """The one process, or rank 0 of several: it owns the run directory, the sampler and the trackers."""
    with RunDir(config) as run:  # locked: a second trainer on the same output_dir is refused
        ckpt = run.open()  # writes config.json before step 0
        ranks.barrier()  # the other ranks read the checkpoint once the run directory is ready
        if ckpt is not None and ckpt["step"] >= config.max_steps:
            log(f"{run.path} already holds a finished run of {ckpt['step']} steps (raise --max-steps to continue "
                "it)")
            return run.path
        check_trackers(config)  # a tracker whose package is missing stops the run before the model loads
        models, task, model_path = setup(config, log, ranks)
        try:
            trackers = Trackers(config, run.path)
            try:
                run_loop(config, run, models, task, model_path, ckpt, log, (trackers, *callbacks))
            finally:
                trackers.close()
        finally:
            models.sampler.close()  # also on an error: a server's weight-transfer group, an engine's memory
    return run.path


def train_rank(config: GRPOConfig, ranks: Ranks) -> Path:
    """A rank other than 0: the same steps on its share of each step's prompts; it writes nothing."""
    path = Path(config.output_dir)
    ranks.barrier()
    ckpt_path = path / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True) if ckpt_path.is_file() else None
    if ckpt is not None and ckpt["step"] >= config.max_steps:
        return path
    quiet = lambda *a: None  # noqa: E731 - rank 0 speaks for the run
    models, task, model_path = setup(config, quiet, ranks)
    run_loop(config, NullRun(path), models, task, model_path, ckpt, quiet, ())
    return path


class NullRun:
    """The run directory as ranks other than 0 see it: readable (``path``), never written."""

    def __init__(self, path: Path):
        self.path, self.metrics_path = path, path / "metrics.jsonl"

    def append_metrics(self, row: dict) -> None:
        pass

    def append_samples(self, rows: list[dict]) -> None:
        pass

    def save_checkpoint(self, state: dict) -> None:
        pass

    def save_final_model(self, model, tokenizer) -> None:
        pass


def run_loop(config: GRPOConfig, run: RunDir, models: Models, task: TokenizedTask, model_path: str,
             ckpt: dict | None, log, callbacks: Sequence[StepCallback]) -> None:
    """The steps of ``train`` from the checkpoint ``ckpt`` (None: from step 0) to ``max_steps``, then the final
    checkpoint and model."""
    from tqdm.auto import tqdm

    ranks = models.ranks
    start = restore_checkpoint(models, ckpt) if ckpt is not None else 0
    if start:
        log(f"resuming {run.path} at step {start}")
        written_by = ckpt.get("world_size", 1)
        if written_by != ranks.world:
            log(f"  the checkpoint was written by {written_by} trainer process(es), this run has {ranks.world}: it "
                "continues with the same global batch and gradient (each rank's share differs), so it matches an "
                "uninterrupted run up to float rounding, not bit for bit")
    log_arithmetic(config, models, task, model_path, log)
    rollouts = RolloutWindow(config, task.task, task.prompt_ids, models.sampler)
    exact = ExactJ(config, models, task)
    ranges = RangeTracker(task, run, start, log)
    ess = EssWatch()
    G = config.num_generations
    stop = GracefulStop(log)
    bar = tqdm(total=config.max_steps, initial=start, disable=not (config.progress and ranks.main), dynamic_ncols=True,
               unit="step")
    write = bar.write if ranks.main else (lambda *a: None)  # rank 0 speaks for the run
    step, skips_in_a_row, samples = start, 0, []
    try:
        for step in range(start, config.max_steps):
            if ranks.max_float(float(stop.requested)):  # every rank stops at the same step
                break
            timer, lag = PhaseTimer(), step - weights_step(config, step)
            fresh = step == window_start(config, step)  # the first step served by newly synced weights
            row = {"step": step, "lag": lag}
            if config.eval_steps and step == 0 and ranks.joins_rank0:  # the policy before any update
                with timer("eval"):
                    row.update({k.replace("eval/", "eval_initial/"): v for k, v in
                                run_evaluation(config, models, task, step, rollouts).items()})
            if config.async_generation:
                step_rollout = async_rollout(config, models, rollouts, step, start, fresh, timer, row)
            else:
                if lag == 0 and step > 0:  # at step 0 the sampler already holds the initial weights
                    with timer("sync"):
                        sync_weights(models)
                    row.update(sync_metrics(models.sampler, timer.seconds["time/sync"]))
                    rollouts.clear()
                with timer("generate"):
                    step_rollout = ranks.broadcast(rollouts.get(step) if ranks.main else None)
            row.update(rollouts.call_metrics())
            prompt_idx, roll = step_rollout.prompt_idx, step_rollout.rollout
            with timer("score"):
                rewards, texts = score_once(models.ranks, task, prompt_idx, roll, G)
                row.update(reward_metrics(task))
                groups = advantages(rewards, config)
                batch = make_batch([task.prompt_ids[i] for i in prompt_idx for _ in range(G)], roll.completion_ids,
                                   models.tokenizer.pad_token_id, models.device)
            with timer("behaviour"):
                behaviour = behaviour_logprobs(config, models, batch, roll, lag, fresh=fresh)
            with timer("reference"):
                logp_ref = reference_logprobs(config, models, batch)
            with timer("diagnostics"):
                exact.before_update()
                heldout = (prepare_heldout(config, models, task, step_rollout.heldout_idx, step_rollout.heldout, lag)
                           if config.heldout_prompts else None)
                reward_range = ranges.see(step, rewards, heldout.rewards if heldout is not None else rewards, row,
                                          write)
            with timer("optimise"):
                optimised = optimise(config, models, batch, groups, behaviour.logp, logp_ref, behaviour.dists)
                alpha_k = dists(config, models, models.alpha, optimised.hidden_k)  # alpha's layer = pi_k's at lag 0
                behaviour = behaviour.with_pi_k(optimised.logp_k, alpha_k)
            with timer("diagnostics"):
                row.update(diagnose(config, models, batch, rewards, groups, roll, behaviour, optimised, step,
                                    reward_range))
                if heldout is not None:
                    row.update(diagnose_heldout(config, models, heldout, reward_range))
                row.update(exact.after_update())
            evaluate_now = config.eval_steps and ((step + 1) % config.eval_steps == 0 or step + 1 == config.max_steps)
            if evaluate_now and ranks.joins_rank0:
                with timer("eval"):  # the updated policy pi_{k+1}
                    row.update(run_evaluation(config, models, task, step + 1, rollouts))
            warn_if_stale(config, row, fresh, write)
            ess.see(row, write)
            row.update(timer.seconds)
            run.append_metrics(row)
            skips_in_a_row = skips_in_a_row + 1 if row["skipped_updates"] else 0
            if skips_in_a_row >= config.max_consecutive_skipped_updates:
                raise RunError(
                    f"{skips_in_a_row} steps in a row ended without an update (non-finite loss {row['loss']} or "
                    f"gradient norm {row['grad_norm']}, step {step}): the policy's or the sampler's log-probs have "
                    f"diverged (see is_weight/max and sampling/logp_diff_max in {run.metrics_path}); the last "
                    "checkpoint holds weights from before it")
            if models.ref is not None and config.ref_sync_steps and (step + 1) % config.ref_sync_steps == 0:
                copy_weights(models.ref, models.policy)  # pi_ref <- pi_theta
            samples = [{"step": step, "prompt": task.task.prompts[prompt_idx[j // G]], "completion": texts[j],
                        "reward": float(rewards.reshape(-1)[j])} for j in range(0, rewards.size, G)][:SAMPLES_KEPT]
            if config.save_steps and (step + 1) % config.save_steps == 0 and step + 1 < config.max_steps:
                save_checkpoint(run, models, step + 1)
                run.append_samples(samples)
            for cb in callbacks:
                cb(step, row)
            report_progress(config, bar, row, log)
        else:
            step = config.max_steps
    except KeyboardInterrupt:  # a second Ctrl-C: the step in progress is inconsistent, keep the last checkpoint
        bar.close()
        stop.restore()
        log(f"aborted during step {step}; the last checkpoint in {run.path} is kept (run the same command to resume)")
        raise
    finally:
        bar.close()  # also before an error's one line, which then starts on a line of its own
        stop.restore()
        rollouts.close()  # a window in flight finishes before the sampler may close
    if stop.requested:
        save_checkpoint(run, models, step)
        run.append_samples(samples)
        log(f"interrupted: checkpoint saved after step {step - 1} in {run.path}; run the same command to resume")
        raise KeyboardInterrupt
    save_checkpoint(run, models, config.max_steps)
    run.append_samples(samples)
    run.save_final_model(unsharded(models, models.policy), models.tokenizer)


# ----------------------------------------------------------------------------------------------
# Output around the loop
# ----------------------------------------------------------------------------------------------


def run_evaluation(config: GRPOConfig, models: Models, task: TokenizedTask, policy_step: int,
                   rollouts: RolloutWindow | None = None) -> dict[str, float]:
    """``eval/*`` of the current policy (after ``policy_step`` updates) on the test prompts. In a step's row
    ``eval/*`` is the policy after that step's update; row 0 also holds ``eval_initial/*``, the policy before any.
    The run's sampler generates: a vLLM engine or server gets the policy's weights for the evaluation and alpha's
    back afterwards (before the first update it already holds the policy); a generation in flight (asynchronous
    generation) finishes first. Under FSDP every rank calls it (to gather the weights into rank 0's whole copy) and
    rank 0 evaluates."""
    m = models
    policy = unsharded(m, m.policy)
    engine = uses_engine(config)
    swap = engine and policy_step > 0
    if swap:
        if rollouts is not None:
            rollouts.wait()  # the background generation uses the sampler's weights until it is done
        m.sampler.load_weights(policy)
    out = {}
    if m.ranks.main:
        out = evaluate(policy, task, temperature=config.temperature, max_tokens=config.max_completion_length,
                       generations=config.eval_generations, seed=config.seed + policy_step,
                       pad=m.tokenizer.pad_token_id, precision=m.precision, exact=config.exact_j,
                       sampler=m.sampler if engine else None)
    if swap:
        m.sampler.load_weights(unsharded(m, sampler_weights(m)))
    return out


def uses_engine(config: GRPOConfig) -> bool:
    """True when a vLLM engine or server generates (weights reach it only through a sync)."""
    return config.sampler == "server" or in_process_vllm(config)


def sampler_weights(models: Models) -> torch.nn.Module:
    """The weights the sampler holds between syncs: alpha's, or with asynchronous generation alpha's successor's
    (the next window is generated from them)."""
    return models.alpha if models.alpha_next is None else models.alpha_next


def log_arithmetic(config: GRPOConfig, models: Models, task: TokenizedTask, model_path: str, log) -> None:
    """Print the derived arithmetic of the run once at start-up."""
    P, G, v = config.prompts_per_step, config.num_generations, config.sync_period
    n_params = sum(p.numel() for p in models.policy.parameters())
    n_train = sum(p.numel() for p in models.policy.parameters() if p.requires_grad)
    lora = (f", LoRA r={config.lora_r} on {' '.join(config.lora_target_modules)}: {n_train / 1e6:.3f}M trained"
            if is_lora(models.policy) else "")
    t = task.task
    log(f"off-policy GRPO: model {model_path} ({n_params / 1e6:.2f}M params{lora}, {config.dtype}, {models.device}), "
        f"sampler {models.sampler.name}, task {t.name} ({len(t.prompts)} training prompts, {len(t.test_prompts)} test"
        f"{', exact J' if t.has_exact_j and config.exact_j else ''})")
    if config.heldout_prompts:
        log(f"  held-out: {config.heldout_prompts} extra prompts x G={G} per step, never in the loss, for unbiased "
            "estimates (heldout/*)")
    log(f"  per step: {P} prompts x G={G} = {config.completions_per_step} completions, "
        f"<= {config.completions_per_step * config.max_completion_length} generated tokens, "
        f"i={config.num_iterations} optimiser steps of {config.gradient_accumulation_steps} micro-batch(es) "
        f"(per_device_train_batch_size {config.per_device_train_batch_size or config.completions_per_step}"
        f"{'; more, shorter passes where sequences of similar length save padding' if config.group_by_length else ''}"
        f"{', gradient checkpointing' if config.gradient_checkpointing else ''}); v={v}: {config.num_syncs} weight syncs over "
        f"{config.max_steps} steps (saves {config.max_steps - config.num_syncs})")
    if config.async_generation:
        log(f"  asynchronous generation: each window is generated while the previous one trains, from the weights "
            f"synced one window earlier (alpha lags {v} to {2 * v - 1} steps after the first window)")


def warn_if_stale(config: GRPOConfig, row: dict, fresh: bool, write) -> None:
    """At the first step served by newly synced weights the sampler and the trainer must agree on log alpha;
    say so loudly if not."""
    gap = row.get("sampling/logp_diff_max")
    tol = SYNC_LOGP_TOLERANCE[config.dtype]
    if fresh and gap is not None and gap > tol:
        write(f"WARNING step {row['step']}: sampler and trainer log-probs differ by up to {gap:.2e} right after "
              f"a weight sync (> {tol:g}): the sampler may hold stale weights")


def report_progress(config: GRPOConfig, bar, row: dict, log) -> None:
    bar.update(1)
    exact = {"J": f"{row['j/pi_new']:.3f}", "dJ": f"{row['improvement']:+.4f}"} if "j/pi_new" in row else {}
    bar.set_postfix(reward=f"{row['reward']:.3f}", **exact, tv=f"{row['tv/pi_k_alpha']:.3f}", lag=row["lag"])
    step = row["step"]
    if not config.progress and (step % config.logging_steps == 0 or step + 1 == config.max_steps):
        parts = [f"step {step}: reward {row['reward']:.3f}", f"tv(pi_k,alpha) {row['tv/pi_k_alpha']:.4f}"]
        for key in ("insample/bound_est/lower_tight", "heldout/bound_est/lower_tight", "improvement", "eval/j"):
            if key in row:
                parts.append(f"{key} {row[key]:+.4f}")
        log("  ".join(parts))

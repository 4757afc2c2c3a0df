"""Algorithm 1's knobs: when alpha is synced, what the loss is, how the optimiser steps."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from grpo_theory.core import ScaleRewards
from grpo_theory.corrections import ROLLOUT_RS_THRESHOLD, ImportanceSamplingMode, correction, require_correction_settings
from grpo_theory.loss_types import LossTypeName, ObjectiveSettings, require_loss_type_settings
from grpo_theory.vcpo import VcpoSettings, require_vcpo_settings
from grpo_theory.validation import EPS_MAX
from pydantic import Field, model_validator

from llm.config.fields import WAS_MINUS_ONE, ConfigGroup, group_of, none_reads, require, resumable


class SyncConfig(ConfigGroup):
    """Alpha and pi_ref: when the sampler's and the reference model's weights follow the trainer's."""

    sync_period: int = 1
    """v: copy the trainer's weights into the sampler every v steps (alpha = pi_{k - lag}, lag < v; with
    --async-generation v <= lag < 2v after the first window)."""
    sync_policy: Literal["fixed", "divergence"] = "fixed"
    """fixed: sync every v = sync_period steps (Algorithm 1). divergence: sync at a step whose estimated
    TV(pi_k, alpha), measured on the held-out prompts before the step (the previous step's
    ``heldout/tv/pi_new_alpha``), exceeds ``tv_budget``, or whose lag would exceed ``max_lag``; it needs
    --heldout-prompts and generates step by step. With --async-generation the sampler runs one step ahead and a
    sync serves the next step, decided on the projected TV(pi_{k+1}, alpha): this one's plus the last step's drift
    ``heldout/tv/pi_new_pi_k`` (``grpo_theory.sync_policy``; ``sync/reason`` says why each sync happened,
    ``sync/tv_estimate`` what it was decided on)."""
    tv_budget: float = 0.05
    """divergence policy: the TV(pi_k, alpha) estimate above which the step syncs (Theorem 1's lag penalty is
    c times it)."""
    max_lag: int = 8
    """divergence policy: sync whenever the lag would exceed this many steps, whatever the estimate."""
    max_staleness: int = -1
    """Drop a step whose completions are older than this many steps (lag > max_staleness): no update, logged as
    ``dropped_stale`` (TRL AsyncGRPO's max_staleness; with asynchronous generation the lag is v .. 2v - 1). It
    changes alpha's distribution over the steps that update (docs/theory.md, §7.1). -1: keep every step."""
    ref_sync_steps: int = 0
    """Reset pi_ref <- pi_theta every this many steps (0: pi_ref stays the initial model; TRL's ref_model_sync_steps
    with sync_ref_model)."""
    ref_model_mixup_alpha: float = 1.0
    """At each pi_ref reset, pi_ref <- a pi_theta + (1 - a) pi_ref, weight by weight (TRL's name; TRL's default is 0.6,
    this project's 1: a copy)."""
    window_generation: bool = True
    """Generate the prompts of the whole sync window in one sampler call (alpha is frozen for v steps)."""
    async_generation: bool = False
    """Generate the next window while the trainer trains this one (a background thread; with --sampler server the
    server's own cores do the work): the window starting at step k is generated from the weights synced at k - v
    (the initial ones for the first two windows), so alpha lags v to 2v - 1 steps; ``lag``, the TV estimates
    and the bound's terms report that real staleness. Needs window generation; keeps one more copy of the
    weights (alpha's successor). Off: the sampler generates each window after its sync (lag < v)."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.window_generation or not self.async_generation, "async_generation",
                "generates whole windows ahead: it needs --window-generation")
        require(self, self.sync_period >= 1, "sync_period", "v must be >= 1")
        require(self, self.tv_budget >= 0, "tv_budget", "must be >= 0 (a TV distance lies in [0, 1])")
        require(self, self.max_lag >= 0, "max_lag", "must be >= 0")
        require(self, self.max_staleness >= -1, "max_staleness", "must be >= 0, or -1 to keep every step")
        if self.sync_policy == "divergence":
            require(self, not (self.async_generation and self.max_lag < 1), "max_lag",
                    "must be >= 1 with --async-generation (the sampler runs a step ahead: every step's completions "
                    "are at least one step old)")
        require(self, self.ref_sync_steps >= 0, "ref_sync_steps", "must be >= 0")
        require(self, 0 < self.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha", "must lie in (0, 1]")
        return self

    @property
    def generates_windows(self) -> bool:
        """One sampler call per sync window (``window_generation``), unless the divergence policy decides the
        windows step by step."""
        return self.window_generation and self.sync_policy == "fixed"

    @property
    def steps_per_call(self) -> int:
        """Steps whose completions one sampler call generates: v with window generation, else 1."""
        return self.sync_period if self.generates_windows else 1


class ObjectiveConfig(group_of(ObjectiveSettings)):
    """The loss: the clipped surrogate, its importance weights, advantages, normaliser and KL term.

    The settings of TRL's other objectives come first, declared once with the bandit simulator's
    (``grpo_theory.loss_types.ObjectiveSettings``)."""

    epsilon: float = 0.2
    """Clip width of f_eps: pi/alpha may move at most epsilon away from pi_k/alpha."""
    epsilon_high: Annotated[float | None, WAS_MINUS_ONE] = None
    """Upper clip width (TRL's name, DAPO's clip-higher): the window is [r' - epsilon, r' + epsilon_high] with the
    paper's clip, [1 - epsilon, 1 + epsilon_high] for pi/pi_k with a TRL importance-sampling mode. None: epsilon (TRL's;
    ``-1``, the spelling before 2026-12-07, reads as None)."""
    delta: Annotated[float, none_reads(0.0)] = 0.0
    """Two-sided clip (TRL's name): for negative advantages the unclipped ratio is capped too, pi/pi_k <= delta
    (paper clip: pi/alpha <= r' + delta - 1). 0: off; else must exceed 1 + epsilon_high."""
    importance_sampling_mode: ImportanceSamplingMode = "paper"
    """How the loss corrects for alpha != pi_k (docs/theory.md, §6.1). paper: the clipped objective
    f_eps(pi/alpha, pi_k/alpha, A), whose clip window sits around pi_k/alpha; the weight is exact. The TRL modes
    (vllm_importance_sampling_mode): PPO's clip of pi/pi_k in [1 - epsilon, 1 + epsilon_high] times the weight
    w = pi_k/alpha per token (token_*) or per completion (sequence_*: exp of the summed log-weights), truncated at
    importance_sampling_cap (*_truncate: min(w, cap)) or zeroed above it (*_mask). m2po: M2PO as its paper's
    Algorithm 1 states it (arXiv 2510.01161): the unclipped ratio pi/alpha, with only the trust-region tokens (A > 0
    and pi_k/alpha > 1, or A < 0 and pi_k/alpha < 1) in the mean of (log pi_k/alpha)^2 and dropped, largest first,
    while that mean is above m2_threshold; the paper averages the loss over all N tokens of the batch, which here is
    loss_type dapo with --no-mask-zero-std-groups (the default zero-variance mask and the grpo and dr_grpo
    normalisers divide by other counts). m2po_areal: AReaL's implementation, every token (A = 0 ones included) a
    candidate until the mean is strictly below the threshold (§6.1). seq_max_k2: Trust Region Masking (arXiv
    2512.23075) with verl's gate (rollout_rs="seq_max_k2"): a completion whose largest token k2 = (log pi_k/alpha)^2/2
    exceeds rollout_rs_threshold leaves the loss whole, the others take the unclipped pi/alpha (§6.1). none: TRL's
    vllm_importance_sampling_correction=False, PPO's clip of pi/pi_k with no weight (uncorrected: alpha's gradient)."""
    m2_threshold: float = 0.04
    """M2PO's threshold tau on the mean of (log pi_k/alpha)^2 over the step's tokens it considers (the trust-region
    tokens with m2po, every token with m2po_areal; AReaL's name, the paper's default)."""
    rollout_rs_threshold: float = ROLLOUT_RS_THRESHOLD
    """Trust Region Masking's gate (mode seq_max_k2; verl's name): a completion is masked when any token's
    (log pi_k/alpha)^2 / 2 exceeds this; the default 0.5 (ln 2)^2 = 0.24 masks a token ratio outside [1/2, 2]."""
    importance_sampling_cap: Annotated[Annotated[float, Field(allow_inf_nan=True)] | None, none_reads(math.inf)] = 3.0
    """The cap C of the TRL importance-sampling modes (TRL's vllm_importance_sampling_clip_max, formerly
    vllm_importance_sampling_cap). None (TRL's): no upper cap, held as inf (*_mask then drops only weights below
    importance_sampling_cap_min, *_truncate only raises them to it)."""
    importance_sampling_cap_min: Annotated[float, none_reads(0.0)] = 0.0
    """The lower cap c of the TRL modes (TRL's vllm_importance_sampling_clip_min): *_truncate clamps the weight to
    [c, C], *_mask zeroes it outside [c, C] (token_mask with [0.5, 5] is IcePop's two-sided mask). 0: none."""
    beta: float = 0.04
    """KL(pi || pi_ref) weight (k3 estimator, per token). 0 skips the reference model (and the kl metrics)."""
    use_bias_correction_kl: bool = True
    """Multiply the per-token k3 by pi/alpha (TRL's name): the tokens are sampled from alpha, and only with the
    correction is each token's term an estimate of KL(pi || pi_ref) at its position (per-token, along alpha's
    prefixes; docs/theory.md, §8.4)."""
    loss_type: LossTypeName = "dapo"
    """Normaliser: grpo = mean over each sequence's tokens then over sequences; dapo = over all
    tokens of the step; dr_grpo = over (sequences x max_completion_length); bnpo = over each micro-batch's own
    tokens (TRL's local normaliser: the step's gradient then depends on per_device_train_batch_size; dapo for a step
    in one pass); luspo = each sequence's sum, then the mean over sequences (LUSPO; TRL pairs it with
    importance_sampling_level sequence; with any importance_sampling_mode). TRL 1.16's other objectives, each with a
    TRL importance_sampling_mode
    (the weight w = pi_k/alpha as TRL's vLLM ratio; rho = pi/pi_k as TRL's pi/pi_old; docs/theory.md, §6.1):
    cispo = min(rho, epsilon_high) (detached) A log pi times w, normalised as dapo (epsilon_high is then a cap on the
    ratio, e.g. 5: the default, epsilon, caps rho at 0.2); sapo = 4 sigmoid(tau (rho - 1))
    / tau A times w, as grpo; vespo = a gamma weight of the sequence's ratio (w folded in; token_truncate or
    token_mask only) times A log pi, as dapo. DPPO (arXiv 2602.04879, verl's loss_mode names), its own correction
    of alpha != pi, with the default importance_sampling_mode: dppo_tv = min(pi/alpha, clip_ratio_c) (detached) A
    log pi on the tokens whose probability moved from alpha's by at most epsilon_high up (A > 0) or epsilon down
    (A <= 0), normalised as dapo (verl's DPPO example: 0.15); dppo_kl = the same, the region the binary
    KL(alpha || pi) of the sampled token (verl's example: 0.05)."""
    scale_rewards: ScaleRewards = "group"
    """group: A = (r - mean)/sqrt(var + variance_eps) per group (the paper's whitening); batch: (r - group mean) over
    the standard deviation of the step's rewards (TRL's batch); none: r - mean."""
    mask_truncated_completions: bool = False
    """Completions that reach max_completion_length without EOS leave the loss (TRL's name, DAPO's truncation
    masking); their rewards still count in the group statistics. The loss then averages over the completions alpha
    finishes (docs/theory.md, §6.2)."""
    top_entropy_quantile: float = 1.0
    """Keep in the policy term only the tokens whose entropy is in this top share of each micro-batch's completion
    tokens (TRL's name and pool: zero-variance groups included; 1: all)."""
    entropy_coef: float = 0.0
    """Subtract this times the mean next-token entropy of the completion tokens from the loss (an entropy bonus,
    TRL's name, verl's entropy_coeff; with top_entropy_quantile < 1, of the tokens its mask keeps, as TRL). The
    entropy is that of the (filtered) policy the trainer optimises."""
    variance_eps: float = 1e-4
    """eps of sigma_{alpha,eps} = sqrt(var + eps) in the advantage and the bound (Theorem 1 needs <= 3/4)."""
    mask_zero_std_groups: bool = True
    """Drop groups whose rewards are all equal (sigma_alpha = 0) from the loss and its normaliser."""
    ratio_level: Literal["token", "sequence", "sequence_normalised"] = "token"
    """Importance ratios per token (default) or per sequence: sequence = exp of the summed log-ratios (the
    paper's sequence-level ratio; high variance), sequence_normalised = exp of their mean over the completion's
    tokens (GSPO; TRL's importance_sampling_level="sequence"; a geometric mean, not an importance weight: biased).
    Both need loss_type grpo (under which every sequence counts once: the paper's E_alpha f), sapo or luspo."""
    behaviour_logprobs: Literal["sampler", "recompute"] = "sampler"
    """log alpha from the sampler (cheap) or recomputed by the trainer with the lagged weights (exact).
    The gap between the two is logged as sampling/logp_diff_* whenever both are computed."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, 0 < self.top_entropy_quantile <= 1, "top_entropy_quantile", "must lie in (0, 1] (1: every token)")
        require(self, self.ratio_level == "token" or self.loss_type in ("grpo", "sapo", "luspo"), "ratio_level",
                f"sequence-level ratios (TRL's importance_sampling_level sequence) need loss_type grpo, sapo or luspo; "
                f"{self.loss_type} would weight each sequence's one objective value by its length")
        require_loss_type_settings(self)
        require(self, self.delta == 0 or self.delta > 1 + self.clip_high, "delta",
                f"must exceed 1 + epsilon_high = {1 + self.clip_high} (or be 0: off)")
        require_correction_settings(self)
        require(self, not correction(self.importance_sampling_mode).step_mask or self.ratio_level == "token",
                "importance_sampling_mode", f"{self.importance_sampling_mode} masks tokens: it needs ratio_level token")
        require(self, 0 <= self.epsilon < 10, "epsilon", "the clip width must lie in [0, 10)")
        require(self, self.beta >= 0, "beta", "must be >= 0")
        require(self, 0 <= self.variance_eps <= EPS_MAX, "variance_eps", "must lie in [0, 3/4] (Theorem 1)")
        return self

    @property
    def clip_high(self) -> float:
        """The upper clip width: ``epsilon_high``, or ``epsilon`` when it is None."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


class OptimConfig(group_of(VcpoSettings)):
    """The optimiser: i steps of AdamW per batch on a learning-rate schedule.

    VCPO's settings (its ESS-guided step and its baseline) come first, declared once with the bandit simulator's
    (``grpo_theory.vcpo.VcpoSettings``)."""

    num_iterations: int = 1
    """i: optimiser steps on each batch (TRL's num_iterations; i > 1 is sample reuse)."""
    learning_rate: float = 3e-4
    """AdamW learning rate (the default suits the tiny built-in model; use ~1e-6 for 0.5B+ models); the peak of the
    schedule."""
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    """The learning-rate schedule over the run's max_steps x num_iterations optimiser steps (transformers' schedules,
    TRL's name; TRL's default is linear, this project's constant). Logged per step as ``learning_rate``."""
    warmup_ratio: float = 0.0
    """Share of the optimiser steps over which the rate warms up linearly from 0 (linear, cosine and
    constant_with_warmup; transformers' name)."""
    warmup_steps: int = 0
    """Warm-up length in optimiser steps; overrides warmup_ratio when > 0 (transformers' name)."""
    adam_beta1: float = 0.9
    """AdamW's beta1 (transformers' name)."""
    adam_beta2: float = 0.999
    """AdamW's beta2 (transformers' name)."""
    adam_epsilon: float = 1e-8
    """AdamW's epsilon (transformers' name)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 disables)."""
    max_consecutive_skipped_updates: int = resumable(3)
    """An inner step whose loss or gradient is not finite takes no optimiser step (counted in ``skipped_updates``);
    the run stops with an error after this many steps in a row had such a skip."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.num_iterations >= 1, "num_iterations", "must be >= 1")
        require(self, self.learning_rate > 0, "learning_rate", "must be > 0")
        require(self, 0 <= self.warmup_ratio <= 1, "warmup_ratio", "must lie in [0, 1]")
        require(self, self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        require(self, 0 <= self.adam_beta1 < 1, "adam_beta1", "must lie in [0, 1)")
        require(self, 0 <= self.adam_beta2 < 1, "adam_beta2", "must lie in [0, 1)")
        require(self, self.adam_epsilon > 0, "adam_epsilon", "must be > 0")
        require(self, self.weight_decay >= 0, "weight_decay", "must be >= 0")
        require(self, self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        require(self, self.max_consecutive_skipped_updates >= 1, "max_consecutive_skipped_updates", "must be >= 1")
        require_vcpo_settings(self)
        return self

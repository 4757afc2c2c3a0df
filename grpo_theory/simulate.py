"""Algorithm 1 (docs/theory.md, §7) on a tabular contextual bandit, with Theorem 1 evaluated exactly per step.

``python -m grpo_theory.simulate --help``. A softmax-tabular policy over ``n_actions`` responses for
each of ``n_prompts`` prompts; the server policy alpha is the trainer policy at the last sync
(every ``sync_period`` = v steps, or when the exact TV(pi_k, alpha) exceeds ``tv_budget`` with the divergence
``sync_policy``). Each step: a batch of prompts, G responses each from alpha,
rewards, group-whitened advantages (``group_advantages``, the function the LLM trainer uses),
optional zero-variance mask, ``num_iterations`` = i gradient-ascent steps on the clipped objective
with r = pi/alpha and r' = pi_k/alpha, minus beta KL(pi || pi_ref) (exact on the table).
``population=True`` replaces the sampled groups by their G -> infinity limit: every prompt with its
weight, exact advantages A_alpha and the exact expected gradient of L^c_alpha.

After each step the exact J(pi_{k+1}) - J(pi_k) and every term of Theorem 1 (prompt-weighted) are
logged with the metric names the LLM trainer uses. All maths comes from ``grpo_theory.core``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from runkit.cli import parse, run_main
from runkit.runio import MetricsWriter, write_config
from runkit.validation import require, require_finite

from . import core
from . import estimators as ge
from .corrections import (M2_THRESHOLD, MODES, ROLLOUT_RS_THRESHOLD, ImportanceSamplingMode, correction,
                          require_correction_settings)
from .loss_types import LOSS_TYPES, LossTypeName, ObjectiveSettings, loss_type, require_loss_type_settings
from .numerics import rounding_tolerance
from .objectives import log_slope, off_policy_keep
from .sync_policy import SyncPolicy, projected_tv
from .validation import EPS_MAX
from .vcpo import (Baselining, VcpoSettings, baseline_log_weights, ess_step_factor, require_vcpo_settings,
                   shift_advantages)


@dataclasses.dataclass(frozen=True)
class SimConfig(VcpoSettings, ObjectiveSettings):
    """Off-policy GRPO (Algorithm 1) on a tabular bandit, with exact Theorem 1 logging (TRL's objectives' settings and
    VCPO's, as the LLM trainer's: ``grpo_theory.loss_types.ObjectiveSettings``, ``grpo_theory.vcpo.VcpoSettings``)."""

    n_prompts: int = 16
    """Number of prompts x (uniformly weighted)."""
    n_actions: int = 8
    """Number of responses y per prompt."""
    rewards: Literal["binary", "continuous"] = "binary"
    """Reward table: binary (one or two correct responses per prompt, verifiable) or continuous in [0, 1]."""
    stochastic_rewards: bool = False
    """Observe r ~ Bernoulli(table) instead of the table value (J is always the table's expectation)."""
    init_scale: float = 2.0
    """Initial logits: N(0, init_scale^2), with the best response pushed down by init_scale (J starts low)."""
    prompts_per_step: int = 4
    """Prompts per step (ignored in population mode, which uses every prompt with its weight)."""
    num_generations: int = 8
    """G: responses sampled per prompt."""
    population: bool = False
    """G -> infinity: exact advantages and exact expected gradients (no sampling noise)."""
    num_iterations: int = 1
    """i: gradient steps per batch."""
    sync_period: int = 1
    """v: alpha <- pi_theta every v steps (``sync_policy`` fixed)."""
    sync_policy: Literal["fixed", "divergence"] = "fixed"
    """fixed: sync every v steps; divergence: sync when the exact TV(pi_k, alpha) before the step exceeds
    ``tv_budget`` or the lag would exceed ``max_lag`` (``grpo_theory.sync_policy``)."""
    tv_budget: float = 0.05
    """divergence policy: sync when TV(pi_k, alpha) exceeds this."""
    max_lag: int = 8
    """divergence policy: sync when the lag would exceed this many steps."""
    async_generation: bool = False
    """The server generates the next window while the trainer trains this one: the samples of the window starting
    at step k come from the weights synced at step k - v (the initial weights in the first two windows), so alpha
    lags by v to 2v - 1 steps instead of 0 to v - 1 (``lag`` logs the true age). With the divergence policy the
    server runs one step ahead: step k + 1's samples come from the weights it holds after step k's decision, which
    syncs when TV(pi_k, alpha) + TV(pi_k, pi_{k-1}) (``grpo_theory.sync_policy.projected_tv``) exceeds the budget."""
    epsilon: float = 0.2
    """Clip width of f_eps (and of PPO's clip in the TRL modes)."""
    epsilon_high: float | None = None
    """The clip's upper width (None: epsilon; TRL's name): f_eps's window [r' - epsilon, r' + epsilon_high], PPO's
    [1 - epsilon, 1 + epsilon_high]; CISPO's cap on pi/pi_k; DPPO's trust region where A > 0."""
    loss_type: LossTypeName = "grpo"
    """The LLM trainer's loss type (TRL's name; ``grpo_theory.objectives``). On a table a response is one token, so
    every normaliser is the mean over the samples: grpo, dapo, dr_grpo, bnpo and luspo are the clipped objective of
    ``importance_sampling_mode``; cispo, sapo and vespo are TRL 1.16's objectives of pi/pi_k times the TRL mode's
    weight; dppo_tv and dppo_kl DPPO's trust regions around alpha (mode paper)."""
    importance_sampling_mode: ImportanceSamplingMode = "paper"
    """The off-policy correction, as the LLM trainer's option of this name (``grpo_theory.corrections``): paper:
    f_eps(pi/alpha, pi_k/alpha, A); token_* / sequence_* (TRL's modes; on a table a response is one action, so the
    two levels coincide): PPO's clip of pi/pi_k times w = pi_k/alpha truncated at importance_sampling_cap (or zeroed
    outside [importance_sampling_cap_min, importance_sampling_cap]); m2po: M2PO as published, keep x (pi/alpha) x A
    with the second-moment mask of all the step's samples (population mode: of every prompt's actions, weighted by
    rho alpha), no clip."""
    importance_sampling_cap: float = 3.0
    """The cap C of the TRL modes."""
    importance_sampling_cap_min: float = 0.0
    """The lower cap c of the TRL modes (0: none; token_mask with [0.5, 5] is IcePop's mask)."""
    m2_threshold: float = M2_THRESHOLD
    """M2PO's threshold on the mean (log pi_k/alpha)^2 of the kept samples."""
    rollout_rs_threshold: float = ROLLOUT_RS_THRESHOLD
    """Trust Region Masking's gate (mode seq_max_k2): a sample kept when (log pi_k/alpha)^2 / 2 is at most this."""
    beta: float = 0.0
    """KL(pi || pi_ref) weight."""
    ref_sync_steps: int = 0
    """pi_ref <- pi_theta every this many steps (0: never)."""
    variance_eps: float = 1e-4
    """eps in sigma_{alpha,eps} = sqrt(var + eps) (advantages and bound), in [0, 3/4]."""
    mask_zero_std_groups: bool = False
    """Drop prompts whose sampled group has zero reward variance."""
    learning_rate: float = 1.0
    """Step size of gradient ascent on the logits."""
    max_steps: int = 200
    """Number of steps k."""
    heldout_prompts: int = 0
    """Per step, this many extra prompts (drawn from the prompt distribution, G responses each from alpha, never
    trained on) on which the improvement is estimated as the LLM trainer does (``heldout/improvement``, its standard
    error and its lower confidence bound ``heldout/improvement_lcb``), beside the exact improvement. 0: off."""
    improvement_lcb_level: float = 0.95
    """Confidence level of ``heldout/improvement_lcb``."""
    improvement_lcb_method: ge.LcbMethod = ge.DEFAULT_LCB_METHOD
    """The certificate's bound (``estimators.improvement_certificate``): betting on the capped estimates (a theorem's
    level), or an unguaranteed one on the unbiased estimates."""
    improvement_lcb_weight_cap: float = ge.IMPROVEMENT_WEIGHT_CAP
    """W: the certificate's importance weights are capped at W (its values then lie in [-1, W - 1])."""
    seed: int = 0
    """Seed of the bandit and of sampling."""
    output_dir: str = ""
    """Run directory for config.json and metrics.jsonl ('' : do not write)."""

    def __post_init__(self):
        require_finite(self)
        require(self, self.n_prompts >= 1, "n_prompts", "must be >= 1")
        require(self, self.n_actions >= 2, "n_actions", "must be >= 2")
        require(self, self.init_scale >= 0, "init_scale", "must be >= 0")
        require(self, 1 <= self.prompts_per_step, "prompts_per_step", "must be >= 1")
        require(self, self.num_generations >= 2, "num_generations", "a group needs G >= 2")
        require(self, self.num_iterations >= 1, "num_iterations", "must be >= 1")
        require(self, self.sync_period >= 1, "sync_period", "v must be >= 1")
        require(self, self.tv_budget >= 0, "tv_budget", "must be >= 0")
        require(self, self.max_lag >= 0, "max_lag", "must be >= 0")
        require(self, not (self.async_generation and self.sync_policy == "divergence" and self.max_lag < 1),
                "max_lag", "must be >= 1 with asynchronous generation (a step's samples are at least one step old)")
        require(self, self.epsilon >= 0, "epsilon", "must be >= 0")
        require(self, self.importance_sampling_mode in MODES, "importance_sampling_mode",
                f"expected one of {', '.join(MODES)}")
        require(self, self.loss_type in LOSS_TYPES, "loss_type", f"expected one of {', '.join(LOSS_TYPES)}")
        require_correction_settings(self)
        require_loss_type_settings(self)  # epsilon_high's range too
        require_vcpo_settings(self)
        require(self, self.beta >= 0, "beta", "must be >= 0")
        require(self, self.ref_sync_steps >= 0, "ref_sync_steps", "must be >= 0")
        require(self, 0 <= self.variance_eps <= EPS_MAX, "variance_eps", "must lie in [0, 3/4] (Theorem 1)")
        require(self, self.learning_rate > 0, "learning_rate", "must be > 0")
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")
        require(self, self.heldout_prompts >= 0, "heldout_prompts", "must be >= 0")
        require(self, 0.5 <= self.improvement_lcb_level < 1, "improvement_lcb_level", "must be in [0.5, 1)")
        require(self, self.improvement_lcb_weight_cap > 1, "improvement_lcb_weight_cap",
                "must be > 1 (the capped estimates lie in [-1, W - 1]: W <= 1 could never certify)")
        object.__setattr__(self, "improvement_lcb_method", ge.lcb_method(self.improvement_lcb_method))
        require(self, self.seed >= 0, "seed", "must be >= 0 (numpy's generators take non-negative seeds)")


@dataclasses.dataclass
class Bandit:
    rho: np.ndarray  # (n_prompts,) prompt distribution
    table: np.ndarray  # (n_prompts, n_actions) expected rewards in [0, 1]
    logits0: np.ndarray  # initial logits


def make_bandit(config: SimConfig) -> Bandit:
    rng = np.random.default_rng([config.seed, 0])
    P, n = config.n_prompts, config.n_actions
    if config.rewards == "binary":
        table = np.zeros((P, n))
        for x in range(P):
            table[x, rng.choice(n, size=1 + rng.integers(0, 2), replace=False)] = 1.0
    else:
        table = rng.random((P, n))
    logits = config.init_scale * rng.standard_normal((P, n))
    best = table.argmax(axis=1)
    logits[np.arange(P), best] -= config.init_scale
    return Bandit(np.full(P, 1.0 / P), table, logits)


@dataclasses.dataclass
class Rollout:
    """One step's data under alpha: the prompts, and either sampled groups or the exact tables."""

    xs: np.ndarray                 # (B,) prompt indices (all prompts in population mode)
    keep: np.ndarray               # (B,) bool: prompts the zero-variance mask keeps
    reward: float                  # mean sampled reward (population: exact E_x J(alpha))
    frac_zero_std: float           # fraction of groups with all-equal rewards (population: prompt mass)
    ys: np.ndarray | None = None   # (B, G) sampled responses; None in population mode
    adv: np.ndarray | None = None  # (B, G) group advantages, or (P, n) exact A_alpha in population mode


def sample_groups(config: SimConfig, bandit: Bandit, alpha: np.ndarray, rng: np.random.Generator,
                  prompts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``prompts`` prompts drawn from the prompt distribution, G responses each from alpha (inverse CDF) and their
    rewards (the table's value, or a Bernoulli draw of it): ``(xs, ys, r)``, shapes (B,), (B, G), (B, G)."""
    xs = rng.choice(len(bandit.rho), size=prompts, p=bandit.rho)
    cum = np.cumsum(alpha[xs], axis=1)
    ys = np.minimum((rng.random((prompts, config.num_generations, 1)) > cum[:, None, :]).sum(-1),
                    config.n_actions - 1)
    r_exp = bandit.table[xs[:, None], ys]
    r = (rng.random(r_exp.shape) < r_exp).astype(float) if config.stochastic_rewards else r_exp
    return xs, ys, r


def sample_rollout(config: SimConfig, bandit: Bandit, alpha: np.ndarray, rng: np.random.Generator) -> Rollout:
    """Rollout, score and advantages (Algorithm 1): G responses per prompt from alpha, or the G -> inf limit."""
    R, rho, eps = bandit.table, bandit.rho, config.variance_eps
    P = R.shape[0]
    if config.population:
        sigma = core.reward_std(alpha, R)
        keep = sigma > 0 if config.mask_zero_std_groups else np.ones(P, bool)
        return Rollout(np.arange(P), keep, float(np.sum(rho * core.expected_reward(alpha, R))),
                       float(np.sum(rho * (sigma == 0))), adv=core.whitened_advantage(alpha, R, eps))
    xs, ys, r = sample_groups(config, bandit, alpha, rng, config.prompts_per_step)
    zero = np.ptp(r, axis=1) == 0
    keep = ~zero if config.mask_zero_std_groups else np.ones(len(xs), bool)
    return Rollout(xs, keep, float(r.mean()), float(zero.mean()), ys=ys, adv=core.group_advantages(r, eps))


def heldout_improvement(config: SimConfig, bandit: Bandit, pi_new, pi_k, alpha,
                        rng: np.random.Generator) -> dict[str, float]:
    """The LLM trainer's held-out improvement estimate on ``heldout_prompts`` fresh prompts (G responses each from
    alpha, rewards observed as in training): the mean of ``estimators.improvement_estimate`` over the prompts, its
    standard error and its lower confidence bound (``estimators.lower_confidence_bound``)."""
    xs, ys, r = sample_groups(config, bandit, alpha, rng, config.heldout_prompts)
    a = alpha[xs[:, None], ys]
    w_new, w_k = pi_new[xs[:, None], ys] / a, pi_k[xs[:, None], ys] / a
    mean, se = ge.mean_and_standard_error(ge.improvement_estimate(r, w_new, w_k))
    cert = ge.improvement_certificate(r, w_new, w_k, config.improvement_lcb_level, config.improvement_lcb_method,
                                      config.improvement_lcb_weight_cap)
    out = {"heldout/improvement": mean, "heldout/improvement_se": se, "heldout/improvement_lcb": cert["lcb"]}
    if "e_value" in cert:
        out["heldout/improvement_e"] = cert["e_value"]
        out["heldout/improvement_capped"] = cert["capped"]
    return out


def kl_gradient(pi, ref):
    """d/d logits of KL(pi || ref) for pi = softmax(logits): pi (log pi - log ref - KL)."""
    kl = np.sum(pi * (np.log(pi) - np.log(ref)), axis=-1, keepdims=True)
    return pi * (np.log(pi) - np.log(ref) - kl)


def sample_coefficients(config: SimConfig, p, p_k, a, adv, m2=None):
    """d objective / d log pi(y) of each sample (pi(y) = ``p``, pi_k(y), alpha(y), its advantage, M2PO's keep), with
    the clip flags: the importance-sampling mode's clipped objective or the loss type's own, TRL's off-policy mask
    applied."""
    mode, objective = correction(config.importance_sampling_mode), loss_type(config.loss_type).objective
    ratio, ratio_k = p / a, p_k / a
    if objective == "clip":
        slope, low, high = mode.slope(ratio, ratio_k, adv, keep=m2, clip=config.epsilon, clip_high=config.epsilon_high,
                                      cap=config.importance_sampling_cap, cap_min=config.importance_sampling_cap_min)
        coef = slope * ratio
    else:
        weight = mode.weight(ratio_k, config.importance_sampling_cap, config.importance_sampling_cap_min)
        coef, low, high = log_slope(objective, np.log(p), np.log(p_k), np.log(a), adv, weight, config)
    if config.off_policy_mask_threshold is not None:
        coef = coef * off_policy_keep(np.log(p), np.log(a), adv, config.off_policy_mask_threshold)
    return coef, low, high


def baselined_advantages(config: SimConfig, bandit: Bandit, roll: Rollout, pi_k, alpha) -> tuple[np.ndarray, float]:
    """VCPO's off-policy optimal baseline on the table (``grpo_theory.vcpo``): the step's advantages shifted, and the
    mean |shift|. A response is one token, so sample i's gradient at unit advantage, at pi = pi_k, is
    c_i (e_{y_i} - pi_k(.|x_i)) in its prompt's logits, c_i its coefficient in log pi at A = 1 (``sample_coefficients``,
    the objective's, as the trainer's ``completion_gradient_norms``): ||g_i||^2 = c_i^2 (1 - 2 pi_k(y_i) +
    ||pi_k(.|x_i)||^2), log w_i = log pi_k(y_i)/alpha(y_i), length 1. Sampled: over the samples in the objective (the
    zero-variance mask's groups; with scope group those whose advantages vary), as the trainer. Population mode:
    each prompt's G -> infinity limit, every action weighted by alpha (and rho over prompts with scope minibatch)."""
    settings = Baselining(config.grad_baselining_scope, config.grad_baselining_use_is_weights,
                          config.grad_baselining_normalize_by_length)
    if config.population:
        p_k, a, adv, rows = pi_k, alpha, roll.adv, pi_k
        mass = np.log(bandit.rho)[:, None] + np.log(alpha)  # the limit's sample weights
    else:
        ys = (roll.xs[:, None], roll.ys)
        p_k, a, adv, rows = pi_k[ys], alpha[ys], roll.adv, pi_k[roll.xs]
        mass = np.zeros(adv.shape)
    coef, _, _ = sample_coefficients(config, p_k, p_k, a, np.ones(adv.shape))
    norm = np.abs(coef) * np.sqrt(np.maximum(1 - 2 * p_k + np.sum(rows**2, axis=1, keepdims=True), 0.0))
    log_weights = baseline_log_weights(norm, np.log(p_k / a), np.ones(adv.shape), settings) + mass
    live = np.broadcast_to((roll.keep > 0)[:, None], adv.shape).copy()
    if settings.scope == "group":
        live &= (np.ptp(adv, axis=1) > 0)[:, None]
    return shift_advantages(adv, log_weights, live, settings.scope)


def objective_gradient(config: SimConfig, bandit: Bandit, roll: Rollout, theta, pi_k, alpha, ref):
    """Gradient w.r.t. the logits ``theta`` of the step's objective, and the clip fractions.

    The objective (docs/theory.md, §5-§7) is the mean over kept groups of f_eps(pi/alpha, pi_k/alpha, A), or of the
    ``importance_sampling_mode``'s objective (``corrections.corrected_objective``; its slope in pi/alpha from
    ``corrections.corrected_slope``), or of the ``loss_type``'s own (``objectives.log_slope``), with TRL's
    off-policy mask (``objectives.off_policy_keep``)
    (sampled mode: over the G samples of each group; population mode: exact, rho-weighted, E_alpha),
    minus beta KL(pi || pi_ref) (exact) on the same kept prompts: the zero-variance mask applies to the
    whole objective, as in the LLM trainer. Returns ``(grad, clip_low, clip_high)``.
    """
    pi = core.softmax(theta)
    grad = np.zeros_like(theta)
    mode = correction(config.importance_sampling_mode)

    if config.population:
        rho, adv = bandit.rho, roll.adv
        m2 = None
        if mode.step_mask:  # the batch's mask in the limit: every prompt's actions, weighted rho alpha
            weight = rho[:, None] * alpha
            m2 = mode.keep(np.log(pi_k / alpha).ravel(), np.broadcast_to(adv, alpha.shape).ravel(), weight.ravel(),
                           mode.threshold(config.m2_threshold, config.rollout_rs_threshold)).reshape(alpha.shape)
        coef, low, high = sample_coefficients(config, pi, pi_k, alpha, adv, m2)
        g_y = alpha * coef  # E_{y ~ alpha} of the sample's coefficient, per action
        g = g_y - pi * g_y.sum(axis=1, keepdims=True)  # chain rule through softmax
        grad += (rho * roll.keep)[:, None] * g
        clip_low = float(np.sum(rho[:, None] * alpha * low))
        clip_high = float(np.sum(rho[:, None] * alpha * high))
    else:
        xs, ys, adv, keep = roll.xs, roll.ys, roll.adv, roll.keep
        B, G = ys.shape
        p_y, a_y, k_y = pi[xs[:, None], ys], alpha[xs[:, None], ys], pi_k[xs[:, None], ys]
        m2 = None
        if mode.step_mask:  # the plain mean over every sample of the step (the paper's batch; AReaL's loss mask
            # keeps zero-advantage groups), whatever the zero-variance mask then keeps in the objective
            m2 = mode.keep(np.log(k_y / a_y).ravel(), np.broadcast_to(adv, (B, G)).ravel(), None,
                           mode.threshold(config.m2_threshold, config.rollout_rs_threshold)).reshape(B, G)
        coef, low, high = sample_coefficients(config, p_y, k_y, a_y, adv, m2)
        coef = coef * keep[:, None] / max(int(keep.sum()) * G, 1)  # (B, G)
        onehot_sum = np.zeros((B, theta.shape[1]))
        np.add.at(onehot_sum, (np.repeat(np.arange(B)[:, None], G, axis=1), ys), coef)
        g = onehot_sum - pi[xs] * coef.sum(axis=1, keepdims=True)
        np.add.at(grad, xs, g)
        clip_low, clip_high = float(np.mean(low)), float(np.mean(high))
    if config.beta > 0:  # exact KL on the kept prompts: the mask applies to the whole objective (§5)
        kg = kl_gradient(pi[roll.xs], ref[roll.xs]) * roll.keep[:, None]
        if config.population:
            grad -= config.beta * bandit.rho[:, None] * kg
        else:
            np.add.at(grad, roll.xs, -config.beta * kg / max(int(roll.keep.sum()), 1))
    return grad, clip_low, clip_high


def off_policy_masked(config: SimConfig, bandit: Bandit, roll: Rollout, pi, alpha) -> float:
    """The share of the step's samples in the objective (the zero-variance mask's kept prompts) that TRL's off-policy
    mask drops at ``pi``: ``off_policy_mask/frac_masked``, as the LLM trainer logs it over its loss tokens (population
    mode: exact, weighted rho alpha; nan where no prompt is kept)."""
    threshold, kept = config.off_policy_mask_threshold, roll.keep > 0
    if config.population:
        dropped = 1.0 - off_policy_keep(np.log(pi), np.log(alpha), roll.adv, threshold)
        weight = (bandit.rho * kept)[:, None] * alpha
    else:
        ys = (roll.xs[:, None], roll.ys)
        dropped = 1.0 - off_policy_keep(np.log(pi[ys]), np.log(alpha[ys]), roll.adv, threshold)
        weight = np.broadcast_to(kept[:, None], dropped.shape).astype(float)
    total = float(np.sum(weight))
    return float(np.sum(weight * dropped) / total) if total > 0 else float("nan")


def step_ess_fraction(config: SimConfig, bandit: Bandit, roll: Rollout, pi_k, alpha) -> float:
    """The Kish ESS fraction of the step's weights pi_k/alpha that VCPO's step reads: over the step's B x G samples
    (every group, zero-variance ones included, as the LLM trainer's ``ess_lr_factor``), or in population mode its
    limit 1 / E_{x ~ rho, y ~ alpha} (pi_k/alpha)^2 (``ess/pi_k_alpha``)."""
    if config.population:
        return exact_ess_fraction(bandit, pi_k, alpha)
    ys = (roll.xs[:, None], roll.ys)
    return float(ge.kish_ess_fraction(pi_k[ys] / alpha[ys]))


def exact_ess_fraction(bandit: Bandit, pi_k, alpha) -> float:
    """The ESS fraction of pi_k/alpha in the limit of a large batch: (E w)^2 / E w^2 = 1 / E_{x, y ~ alpha}[w^2]
    (the LLM trainer's ess/pi_k_alpha estimates it)."""
    return float(1.0 / np.sum(bandit.rho * np.sum(pi_k**2 / alpha, axis=1)))


def exact_diagnostics(bandit: Bandit, pi_new, pi_k, alpha, ref, eps: float) -> dict[str, float]:
    """J(pi_k), the realised improvement J(pi_{k+1}) - J(pi_k) and every Theorem 1 term, exact and
    rho-weighted, with the float64 allowance of each bound (docs/theory.md, §3 and §10)."""
    R, rho = bandit.table, bandit.rho
    improvement_x = core.expected_reward(pi_new, R) - core.expected_reward(pi_k, R)
    row = {"j/pi_k": float(np.sum(rho * core.expected_reward(pi_k, R))),
           "improvement": float(np.sum(rho * improvement_x)),
           "kl": float(np.sum(rho * core.kl_divergence(pi_new, ref))),
           "tv/pi_new_alpha": float(np.sum(rho * core.tv_distance(pi_new, alpha))),
           "tv/pi_k_alpha": float(np.sum(rho * core.tv_distance(pi_k, alpha))),
           "tv/pi_new_pi_k": float(np.sum(rho * core.tv_distance(pi_new, pi_k))),  # the step's drift
           # Kish's ESS fraction of the weights pi_k/alpha pooled over prompts and responses, in the limit of a large
           # batch (``exact_ess_fraction``)
           "ess/pi_k_alpha": exact_ess_fraction(bandit, pi_k, alpha)}
    for suffix, tight in (("", False), ("_tight", True)):
        t = core.bound_terms(pi_new, pi_k, alpha, R, eps, tight=tight)
        tol = rounding_tolerance(alpha, R, eps, t, tight)
        lower = float(np.sum(rho * t.lower)) if np.all(np.isfinite(t.lower)) else float("-inf")
        row[f"bound/lower{suffix}"] = lower
        row[f"bound/slack{suffix}"] = row["improvement"] - lower
        row[f"bound/tolerance{suffix}"] = float(np.sum(rho * tol))
        if not tight:
            row["bound/surrogate"] = float(np.sum(rho * t.surrogate))
            row["bound/penalty_tv"] = float(np.sum(rho * t.penalty_tv))
            row["bound/penalty_lag"] = float(np.sum(rho * t.penalty_lag))
    return row


def simulate(config: SimConfig, progress: bool = False) -> list[dict]:
    """Run Algorithm 1; returns the metric rows (also written to ``output_dir`` if set)."""
    bandit = make_bandit(config)
    rng = np.random.default_rng([config.seed, 1])
    heldout_rng = np.random.default_rng([config.seed, 2])  # its own stream: the run is the same with or without
    writer = None
    if config.output_dir:
        write_config(config.output_dir, config)
        writer = MetricsWriter(config.output_dir)
    theta = bandit.logits0.copy()
    theta_alpha = theta.copy()
    theta_ref = theta.copy()
    rows = []
    last_sync = 0  # the step whose weights alpha holds
    pending = (theta.copy(), 0)  # async: the weights synced at the start of this window, served from the next one
    theta_prev = None  # async divergence: the last step's weights (its drift TV(pi_k, pi_{k-1}))
    policy = SyncPolicy(config.sync_policy, config.sync_period, config.tv_budget, config.max_lag)
    bar = tqdm(total=config.max_steps, unit="step", disable=not progress)
    t_start = time.perf_counter()
    for step in range(config.max_steps):
        # ---- sync: the policy decides from the exact TV(pi_k, alpha) before the step (fixed: every v steps)
        tv_before = float(np.sum(bandit.rho * core.tv_distance(core.softmax(theta), core.softmax(theta_alpha))))
        if config.async_generation and policy.adaptive:
            # one step ahead: this step's samples came from the weights the server held after the last decision;
            # the decision now serves the next step, whose TV it bounds by this one's plus the last step's drift
            (theta_alpha, last_sync) = pending
            tv_served = float(np.sum(bandit.rho * core.tv_distance(core.softmax(theta), core.softmax(theta_alpha))))
            drift = (math.nan if theta_prev is None else
                     float(np.sum(bandit.rho * core.tv_distance(core.softmax(theta), core.softmax(theta_prev)))))
            tv_before = projected_tv(tv_served, drift)
            reason = policy.decide_ahead(step, last_sync, tv_before)
            if reason:
                pending = (theta.copy(), step)
            theta_prev = theta.copy()
        elif config.async_generation and step % config.sync_period == 0:
            reason = policy.decide(step, last_sync, tv_before)
            # this window's samples were generated from the previous sync's weights
            (theta_alpha, last_sync), pending = pending, (theta.copy(), step)
        else:
            reason = policy.decide(step, last_sync, tv_before)
            if reason:
                theta_alpha, last_sync = theta.copy(), step
        pi_k, alpha, ref = core.softmax(theta), core.softmax(theta_alpha), core.softmax(theta_ref)
        # ---- rollout + score + advantages
        roll = sample_rollout(config, bandit, alpha, rng)
        # ---- optimise: i gradient-ascent steps on L^c - beta KL (VCPO's step: the rate times the ESS factor)
        lr_factor = 1.0 if config.ess_scaling == "none" else ess_step_factor(
            step_ess_fraction(config, bandit, roll, pi_k, alpha), config.ess_scaling, config.ess_scaling_base_ess_ratio)
        lr = config.learning_rate * lr_factor
        if config.grad_baselining:  # VCPO's baseline, at pi_k before the step's first inner step (as the trainer)
            adv, shift = baselined_advantages(config, bandit, roll, pi_k, alpha)
            roll = dataclasses.replace(roll, adv=adv)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a divergence is reported below
            for _ in range(config.num_iterations):
                grad, clip_low, clip_high = objective_gradient(config, bandit, roll, theta, pi_k, alpha, ref)
                if config.off_policy_mask_threshold is not None:  # at the last inner step's pi, as the clip's flags
                    masked = off_policy_masked(config, bandit, roll, core.softmax(theta), alpha)
                theta = theta + lr * grad
        if not np.all(np.isfinite(theta)):
            bar.close()  # the error line starts on a line of its own
            raise ValueError(f"learning_rate: the logits diverged at step {step} (non-finite after the update with "
                             f"learning_rate={config.learning_rate!r}, loss_type={config.loss_type!r}, "
                             f"beta={config.beta!r}): lower the learning rate, or the objective's own scale (VESPO's "
                             "k and lambda, SAPO's temperatures)")
        # ---- exact diagnostics (Theorem 1 per prompt, prompt-weighted)
        row = {"step": step, "lag": step - last_sync, "sync": float(bool(reason)), "sync/reason": reason,
               "sync/tv_estimate": tv_before, "reward": roll.reward, "frac_reward_zero_std": roll.frac_zero_std,
               "clip_ratio/low_mean": clip_low, "clip_ratio/high_mean": clip_high}
        if config.off_policy_mask_threshold is not None:
            row["off_policy_mask/frac_masked"] = masked
        if config.ess_scaling != "none":
            row["ess_scaling/lr_factor"] = lr_factor
        if config.grad_baselining:
            row["grad_baselining/advantage_shift"] = shift
        row.update(exact_diagnostics(bandit, core.softmax(theta), pi_k, alpha, ref, config.variance_eps))
        if config.heldout_prompts:
            row.update(heldout_improvement(config, bandit, core.softmax(theta), pi_k, alpha, heldout_rng))
        row["time/elapsed"] = time.perf_counter() - t_start
        rows.append(row)
        if writer is not None:
            writer.write(row)
        # ---- reference reset
        if config.ref_sync_steps and (step + 1) % config.ref_sync_steps == 0:
            theta_ref = theta.copy()
        bar.update(1)
        bar.set_postfix(J=f"{row['j/pi_k']:.3f}", tv=f"{row['tv/pi_k_alpha']:.3f}")
    bar.close()
    return rows


# ----------------------------------------------------------------------------------------------
# Reading a run's rows (used by the command below, the experiments, the figures and the notebook)
# ----------------------------------------------------------------------------------------------


def final_j(rows: list[dict]) -> float:
    """J of the final policy: J(pi_k) at the last step plus its exact improvement."""
    return j_after(rows[-1])


def j_after(row: dict) -> float:
    """J(pi_{k+1}) of one step's row: J(pi_k) plus the exact improvement."""
    return row["j/pi_k"] + row["improvement"]


def steps_to_target(rows: list[dict], target: float) -> float:
    """Number of steps until J(pi_{k+1}) first reaches ``target`` (NaN if never)."""
    for r in rows:
        if j_after(r) >= target:
            return r["step"] + 1
    return float("nan")


def bound_violations(rows: list[dict], tight: bool = False) -> int:
    """Steps where the exact bound exceeds the realised improvement by more than its float64 allowance."""
    suffix = "_tight" if tight else ""
    return sum(r[f"bound/slack{suffix}"] < -r[f"bound/tolerance{suffix}"] for r in rows)


def main(args: list[str] | None = None) -> int:
    config = parse(SimConfig, args, prog="python -m grpo_theory.simulate", description=__doc__.splitlines()[0])
    rows = simulate(config, progress=True)
    viol, viol_t = bound_violations(rows), bound_violations(rows, tight=True)
    print(f"J: {rows[0]['j/pi_k']:.4f} -> {final_j(rows):.4f} in {config.max_steps} steps "
          f"({config.max_steps / rows[-1]['time/elapsed']:.0f} steps/s)")
    print(f"mean TV(pi_k, alpha) {np.mean([r['tv/pi_k_alpha'] for r in rows]):.4f}; "
          f"bound > 0 on {np.mean([r['bound/lower'] > 0 for r in rows]):.1%} (paper) / "
          f"{np.mean([r['bound/lower_tight'] > 0 for r in rows]):.1%} (tight) of steps; "
          f"steps with bound > improvement: {viol} (paper), {viol_t} (tight)")
    if config.heldout_prompts:
        if (why := ge.certificate_abstains(config.heldout_prompts, method=config.improvement_lcb_method)) is not None:
            print(f"certificate: {why}")
        lcb = np.array([r["heldout/improvement_lcb"] for r in rows])
        exact = np.array([r["improvement"] for r in rows])
        print(f"improvement certificate ({config.heldout_prompts} held-out prompts, level "
              f"{config.improvement_lcb_level:g}): positive on {np.mean(lcb > 0):.1%} of steps, above the exact "
              f"improvement on {np.mean(lcb > exact):.1%}; exact improvement positive on {np.mean(exact > 0):.1%}")
    if config.output_dir:
        print(f"wrote {config.output_dir}/metrics.jsonl")
    return 1 if viol or viol_t else 0


if __name__ == "__main__":
    run_main(main, prog="python -m grpo_theory.simulate")

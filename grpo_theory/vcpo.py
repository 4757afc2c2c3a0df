"""VCPO (Huang et al., arXiv 2602.17616; its code mit-han-lab/vcpo, its actor config's names), declared once for the
LLM trainer and the bandit simulator: its ESS-guided step (``ess_step_factor``) and its off-policy optimal baseline
(``shift_advantages``; the trainer's gradients per completion are ``llm.optim.baseline``'s, the simulator's exact on
its table), and their settings (``VcpoSettings``: the simulator's config inherits them, the trainer's optimiser group
is built on them).

The baseline minimises the second moment of the step's gradient estimate sum_i (R_i - b) g_i, where g_i is
completion i's own gradient at unit advantage and w_i = pi_k/alpha its sequence weight:

    b* = sum_i W_i R_i / sum_i W_i,   W_i = ||g_i||^2 w_i^2   (/ L_i^2 with ``normalize_by_length``)

over each group of G completions of one prompt (scope group) or over the step's completions (scope minibatch). With
the group's advantages A_i = (R_i - mean) / s, the W-weighted mean of the A_i is (b* - mean) / s, so A_i minus it is
(R_i - b*) / s, the authors' coefficient: the baseline moves the advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from runkit.validation import require

EssScalingRule = Literal["none", "sqrt", "linear"]


@dataclass(frozen=True)
class VcpoSettings:
    """VCPO's settings, under its authors' names: the ESS-guided step and the off-policy optimal baseline."""

    ess_scaling: EssScalingRule = "none"
    """VCPO's ESS-guided step (Huang et al., arXiv 2602.17616; its code mit-han-lab/vcpo, its actor config's names):
    each optimiser step's rate times sqrt (or linear) of min(1, rho / ess_scaling_base_ess_ratio), rho the Kish ESS
    fraction of the step's sequence weights pi_k/alpha (zero-variance groups included, as the authors' minibatch);
    the schedule is untouched. Logged as ``ess_scaling/lr_factor``. none: off."""
    ess_scaling_base_ess_ratio: float = 1.0
    """VCPO's base ESS fraction: the step is scaled only below it (the authors' default 1: any ESS below n)."""
    grad_baselining: bool = False
    """VCPO's off-policy optimal baseline (its authors' grad_baselining.*): advantages about b* = sum W R / sum W,
    W_i = ||g_i||^2 w_i^2 (g_i completion i's gradient at unit advantage, w_i = pi_k/alpha), not the group's mean;
    in the LLM trainer one more backward pass per completion, one process (``grad_baselining/advantage_shift``;
    docs/theory.md, 6.1)."""
    grad_baselining_scope: Literal["group", "minibatch"] = "group"
    """VCPO's baseline over each prompt's group (the authors' default) or over the step's completions."""
    grad_baselining_use_is_weights: bool = True
    """VCPO's baseline: W_i includes w_i^2 (the authors' code); off: W_i = ||g_i||^2, the paper's (g_i carries w_i)."""
    grad_baselining_normalize_by_length: bool = False
    """VCPO's baseline: W_i divided by the completion's squared length (the authors' option; off)."""


def require_vcpo_settings(config) -> None:
    """VCPO's step rule (one of three), its base ESS fraction's range and the baseline's scope (the trainer's and
    the simulator's configs)."""
    require(config, config.ess_scaling in get_args(EssScalingRule), "ess_scaling",
            f"expected one of {', '.join(get_args(EssScalingRule))}")
    require(config, 0 < config.ess_scaling_base_ess_ratio <= 1, "ess_scaling_base_ess_ratio", "must lie in (0, 1]")
    require(config, config.grad_baselining_scope in ("group", "minibatch"), "grad_baselining_scope",
            "expected one of group, minibatch")


def ess_step_factor(ess_fraction: float, rule: str, base: float = 1.0) -> float:
    """VCPO's ESS-guided factor on the learning rate (its actor's step scaling): sqrt (``rule`` sqrt) or the value
    (linear) of min(1, ``ess_fraction`` / ``base``), the Kish ESS fraction of the step's sequence weights
    pi_k/alpha; 1 with rule none. The trainer (``llm.optim.update.ess_lr_factor``) and the bandit simulator both take
    their factor from here."""
    if rule == "none":
        return 1.0
    scale = min(1.0, float(ess_fraction) / base)
    return math.sqrt(scale) if rule == "sqrt" else scale


@dataclass(frozen=True)
class Baselining:
    """The baseline's settings (the authors' names under ``grad_baselining``), as its functions read them."""

    scope: str = "group"
    use_is_weights: bool = True
    normalize_by_length: bool = False


def baseline_log_weights(grad_norm: np.ndarray, log_w: np.ndarray, lengths: np.ndarray,
                         settings: Baselining) -> np.ndarray:
    """log W_i = 2 log ||g_i|| (+ 2 log w_i with ``use_is_weights``) (- 2 log L_i with ``normalize_by_length``):
    in logs, so that a sequence weight e^500 neither overflows nor turns the baseline into nan. -inf where
    ||g_i|| = 0 or L_i = 0 (no weight)."""
    with np.errstate(divide="ignore"):
        out = 2.0 * np.log(np.asarray(grad_norm, dtype=np.float64))
        if settings.use_is_weights:
            out = out + 2.0 * np.asarray(log_w, dtype=np.float64)
        if settings.normalize_by_length:
            out = out - 2.0 * np.log(np.asarray(lengths, dtype=np.float64))
    return np.where(np.isfinite(out), out, -np.inf)


def weighted_mean(values: np.ndarray, log_weights: np.ndarray) -> float | None:
    """sum W v / sum W with W = exp(``log_weights``), computed after scaling by the largest W; None when every W
    is 0 (no completion with a gradient)."""
    top = np.max(log_weights) if log_weights.size else -np.inf
    if not np.isfinite(top):
        return None
    w = np.exp(log_weights - top)
    return float(np.sum(w * values) / np.sum(w))


def shift_advantages(advantages: np.ndarray, log_weights: np.ndarray, live: np.ndarray,
                     scope: str) -> tuple[np.ndarray, float]:
    """``advantages`` (P, G) minus their W-weighted mean over each group (scope group) or over the step (minibatch),
    the mean over ``live`` (P, G) completions only (the loss's; the others keep their advantage). A group (or step)
    whose live completions all have W = 0 keeps its advantages. Returns the shifted advantages and the mean |shift|
    over the live completions (0 with none)."""
    adv = np.asarray(advantages, dtype=np.float64)
    live = np.asarray(live, dtype=bool)
    shift = np.zeros_like(adv)
    blocks = [(slice(None),)] if scope == "minibatch" else [(p,) for p in range(adv.shape[0])]
    for block in blocks:
        on = np.zeros_like(live)
        on[block] = live[block]
        b = weighted_mean(adv[on], log_weights[on])
        if b is not None:
            shift[on] = b
    return adv - shift, float(np.abs(shift[live]).mean()) if live.any() else 0.0

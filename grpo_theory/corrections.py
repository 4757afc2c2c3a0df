"""Other frameworks' off-policy corrections, exact on a table (docs/theory.md, §6.1).

The paper's clipped objective f_eps(r, r', A) (``core.clip_objective``) uses r = pi/alpha and clips it to a
window around r' = pi_k/alpha: the importance weight pi_k/alpha is exact and never capped. TRL's
``vllm_importance_sampling_mode`` instead splits the ratio in two: PPO's clip of rho = pi/pi_k = r/r' to
[1 - eps, 1 + eps_high], multiplied by a weight w = pi_k/alpha = r' that is truncated or masked at a cap C:

    g(rho, A) = min(rho A, clip(rho, 1 - eps, 1 + eps_high) A)                (``delta``: rho <= delta in the first)
    truncate:  min(r', C) g(r/r', A)        mask:  1[r' <= C] r' g(r/r', A)

A lower cap c (TRL's ``vllm_importance_sampling_clip_min``; with token_mask and [c, C] = [0.5, 5] it is IcePop's
two-sided mask) truncates to clip(r', c, C) or masks to 1[c <= r' <= C] r'; c = 0 is none.

Mode ``none`` is TRL's ``vllm_importance_sampling_correction=False``: PPO's clip of rho alone, weight 1, as if the
samples were pi_k's. Its surrogate sum_y alpha(y) g(pi(y)/pi_k(y), A(y)) has at pi = pi_k the gradient
E_alpha[grad log pi A]: alpha's policy gradient, not pi_k's, the bias the weight pi_k/alpha exists to remove.

M2PO (Zheng et al., arXiv 2510.01161, the objective J_M2PO of its method section) keeps the importance ratio against
the behaviour policy, r = pi/alpha, unclipped, and masks samples: it maximises keep(y) r(y) A(y). Mode ``m2po`` is the
paper's Algorithm 1 (``trust_region_second_moment_keep``): only trust-region samples (A > 0 with r > 1, A < 0 with
r < 1, r = pi_k/alpha when the mask is taken) enter the mean of M_2 = (log r)^2 and can be dropped, largest first,
while that mean is above tau (the paper's 0.04); the loss averages over all N tokens. Mode ``m2po_areal`` is AReaL's
implementation (areal/trainer/ppo/actor.py: ``_apply_m2po_masking`` and ``_get_m2po_loss_mask``;
``second_moment_keep``): every sample, A = 0 ones included, enters the mean and can be dropped, until the mean is
strictly below tau, and when even the smallest M_2 is not, the one sample with the smallest M_2 is kept. Its surrogate
on a table is sum_y alpha(y) keep(y) (pi(y)/alpha(y)) A(y), and at pi = pi_k its gradient is
E_alpha[keep (pi_k/alpha) grad log pi A]: the policy gradient under pi_k over the kept responses, the importance
weight exact where the mask keeps. The mask bounds the second moment of the log-weights (so the weights' variance);
what it drops is a bias.

The references differ, and this module follows the paper's objective with AReaL's mask: AReaL applies the mask to its
decoupled PPO loss (the behaviour weight pi_k/alpha times PPO's clip of pi/pi_k; ``actor.use_decoupled_loss``), and
the authors' own verl-based code (Infini-AI-Lab/M2PO, verl/trainer/ppo/core_algos.py: ``compute_m2po_policy_loss``)
does not mask at all: it turns the M_2 budget into a PPO clip range on the tokens the clip would act on. AReaL
computes the mask per micro-batch; here it is the step's (the paper's batch of N tokens).

Trust Region Masking (Li et al., arXiv 2512.23075) masks every sequence with any token outside the trust region and
ascends M r A on the rest, r = pi/alpha unclipped, normalised over the whole batch: mode ``seq_max_k2``, after verl's
sample estimate of the per-token divergence (``rollout_rs="seq_max_k2"``: k2 = (log pi_k/alpha)^2 / 2 at the sampled
token, a sequence kept when its largest k2 is at most ``rollout_rs_threshold``; ``max_k2_keep``). The paper's gate is
the exact per-token KL over the vocabulary; k2 is its sample estimate at the token drawn, so the mask is the paper's
only where the sampled token's k2 and the KL agree on the side of the threshold.

On a table (one response per sample, so token and sequence levels coincide) the expected objective over y ~ alpha
is ``corrected_surrogate``. Three facts the tests pin:

- C -> inf: r' g(r/r', A) = min(r A, clip(r, r'(1 - eps), r'(1 + eps_high)) A): the paper's objective with a window
  proportional to r' instead of of width eps; the two agree in value and gradient at pi = pi_k.
- truncate, no clip binding: sum_y min(pi_k(y), C alpha(y)) (pi(y)/pi_k(y)) A(y): at pi = pi_k it is
  sum_y min(pi_k, C alpha) A, not E_{pi_k} A; the truncation biases the surrogate's value and its gradient.
- mask, no clip binding: sum_{y: pi_k(y) <= C alpha(y)} pi(y) A(y): an expectation over the responses where
  pi_k/alpha <= C only; the mask changes the distribution the expectation is over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from runkit.validation import require

from .core import as_policy, check_same_actions, clip_flags, clip_objective, whitened_advantage

#: The importance-sampling modes, declared once: the LLM trainer's config, the loss and the bandit simulator take their
#: type from here, and ``REGISTRY`` (below) holds one object per name.
ImportanceSamplingMode = Literal["paper", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "m2po",
                                 "m2po_areal", "seq_max_k2", "none"]
MODES: tuple[str, ...] = get_args(ImportanceSamplingMode)
#: M2PO's threshold on the mean of (log w)^2 over the kept samples (the paper's default).
M2_THRESHOLD = 0.04
#: Trust Region Masking's gate (mode ``seq_max_k2``, verl's rollout_rs name): a sequence is masked when any of its
#: tokens has k2 = (log pi_k/alpha)^2 / 2 above this; 0.5 (log 2)^2 masks a sequence with a token ratio outside
#: [1/2, 2].
ROLLOUT_RS_THRESHOLD = 0.5 * float(np.log(2.0)) ** 2
#: IcePop's two-sided mask as a preset of the TRL modes: a token kept when 0.5 <= pi_k/alpha <= 5. The bandit's and the
#: language model's frontier tables both take it from here, under this label.
ICEPOP_LABEL = "icepop (token_mask [0.5, 5])"
ICEPOP = {"importance_sampling_mode": "token_mask", "importance_sampling_cap": 5.0, "importance_sampling_cap_min": 0.5}


def require_correction_settings(config) -> None:
    """The checks a config holding a correction's settings must pass (the LLM trainer's and the bandit simulator's
    configs name them alike): a cap C > 0, a lower cap in [0, C), an M2PO threshold > 0; one-line errors."""
    require(config, config.importance_sampling_cap > 0, "importance_sampling_cap", "must be > 0")
    require(config, config.m2_threshold > 0, "m2_threshold", "must be > 0")
    require(config, config.rollout_rs_threshold > 0, "rollout_rs_threshold", "must be > 0")
    require(config, 0 <= config.importance_sampling_cap_min < config.importance_sampling_cap,
            "importance_sampling_cap_min", f"must lie in [0, importance_sampling_cap = {config.importance_sampling_cap})")


def second_moment_keep(log_w, weight=None, threshold: float = M2_THRESHOLD) -> np.ndarray:
    """M2PO's mask over samples with log-weights ``log_w`` = log pi_k/alpha (1-D; ``weight`` each sample's weight in
    the mean, 1 by default: the plain token mean of a batch; alpha's probabilities on a table, the batch's limit): the
    samples are dropped in decreasing order of (log w)^2 (ties: the earlier index first) until the ``weight``-mean of
    (log w)^2 over the kept ones is strictly below ``threshold``: the fewest drops that achieve it. When even the last
    sample alone is not below it, that one sample (the smallest (log w)^2) is kept (AReaL's rule). True where kept;
    samples of weight 0 are never kept."""
    m = np.asarray(log_w, dtype=np.float64) ** 2
    wt = np.ones_like(m) if weight is None else np.asarray(weight, dtype=np.float64)
    if m.ndim != 1 or wt.shape != m.shape:
        raise ValueError("log_w and weight: one 1-D array of samples each, of one length")
    on = np.flatnonzero(wt > 0)
    keep = np.zeros(m.size, dtype=bool)
    if on.size == 0:
        return keep
    order = on[np.argsort(-m[on], kind="stable")]
    # suffix sums: what remains after dropping the first j of the order
    mass = np.cumsum((wt * m)[order][::-1])[::-1]
    total = np.cumsum(wt[order][::-1])[::-1]
    below = mass < threshold * total
    first = int(np.argmax(below)) if below.any() else order.size - 1
    keep[order[first:]] = True
    return keep


def max_k2_keep(log_w, threshold: float = ROLLOUT_RS_THRESHOLD, weight=None) -> np.ndarray:
    """Trust Region Masking's gate (arXiv 2512.23075, with verl's sample estimate ``rollout_rs="seq_max_k2"``): a
    sample is kept when k2 = (log w)^2 / 2 <= ``threshold`` for ``log_w`` = log pi_k/alpha (1-D; on a table a response
    is one token, so the sequence's max is its own k2; the LLM loss takes the max over each sequence's tokens).
    Samples of ``weight`` 0 are never kept."""
    log_w = np.asarray(log_w, dtype=np.float64)
    keep = 0.5 * log_w**2 <= threshold
    return keep if weight is None else keep & (np.asarray(weight, dtype=np.float64) > 0)


def trust_region_second_moment_keep(log_w, adv, weight=None, threshold: float = M2_THRESHOLD) -> np.ndarray:
    """M2PO's mask as its paper states it (Zheng et al., arXiv 2510.01161, Algorithm 1 and "only constrain
    trust-region tokens"): the candidates are the trust-region samples, A > 0 with log w > 0 or A < 0 with log w < 0
    (``log_w`` = log pi_k/alpha, ``adv`` = A, 1-D); while the ``weight``-mean of (log w)^2 over the candidates still in
    is above ``threshold``, the candidate with the largest (log w)^2 is dropped (ties: the earlier index first), so
    an empty trust region drops nothing and a region whose every candidate is above the threshold is dropped whole.
    Every other sample (A = 0, or log w on the other side) is kept. True where kept; samples of weight 0 are never
    kept (they are not in the batch)."""
    log_w = np.asarray(log_w, dtype=np.float64)
    adv = np.broadcast_to(np.asarray(adv, dtype=np.float64), log_w.shape)
    wt = np.ones_like(log_w) if weight is None else np.asarray(weight, dtype=np.float64)
    if log_w.ndim != 1 or wt.shape != log_w.shape:
        raise ValueError("log_w, adv and weight: one 1-D array of samples each, of one length")
    on = wt > 0
    keep = on.copy()
    candidates = np.flatnonzero(on & (((adv > 0) & (log_w > 0)) | ((adv < 0) & (log_w < 0))))
    if candidates.size == 0:
        return keep
    m = log_w**2
    order = candidates[np.argsort(-m[candidates], kind="stable")]
    mass = np.cumsum((wt * m)[order][::-1])[::-1]  # after dropping the first j of the order
    total = np.cumsum(wt[order][::-1])[::-1]
    within = mass / total <= threshold  # the mean, as Algorithm 1 computes it
    dropped = int(np.argmax(within)) if within.any() else order.size
    keep[order[:dropped]] = False
    return keep


@dataclass(frozen=True)
class Correction:
    """One importance-sampling mode, everything that varies between modes in one object (docs/theory.md, §6.1):
    its weight on the clipped ratio, its objective and that objective's slope in r = pi/alpha, whether PPO's clip of
    rho = pi/pi_k acts (``trl``) or the paper's window around pi_k/alpha, and whether the step masks samples by
    their second moment (``step_mask``, M2PO). ``REGISTRY`` holds one per name; the torch loss registers its twin
    under the same name (``llm.tensors.loss``)."""

    name: str
    trl: bool = False
    truncate: bool = False
    level: Literal["token", "sequence"] = "token"
    step_mask: Literal["", "trust_region", "all", "seq_max_k2"] = ""
    """The step's mask on the unclipped ratio: M2PO's "trust_region" (the paper's: only trust-region tokens are
    candidates) or "all" (AReaL's: every token), Trust Region Masking's "seq_max_k2" (whole sequences), "" (none)."""
    weighted: bool = True
    """Whether a TRL mode multiplies by the weight pi_k/alpha at all: False is TRL's
    ``vllm_importance_sampling_correction=False``, PPO's clip of pi/pi_k alone, as if alpha were pi_k (mode none)."""

    @property
    def mask_level(self) -> Literal["token", "sequence"]:
        """What the step mask keeps or drops on a language model: each token (M2PO), or each whole sequence by its
        largest |log w| (Trust Region Masking); on a table a response is one token and the two agree."""
        return "sequence" if self.step_mask == "seq_max_k2" else "token"

    def threshold(self, m2_threshold: float, rollout_rs_threshold: float) -> float:
        """The threshold the mode's step mask reads: ``rollout_rs_threshold`` (seq_max_k2), else ``m2_threshold``."""
        return rollout_rs_threshold if self.step_mask == "seq_max_k2" else m2_threshold

    def keep(self, log_w, adv, weight=None, threshold: float = M2_THRESHOLD) -> np.ndarray | None:
        """The mode's step mask over 1-D samples (None for a mode without one): ``trust_region_second_moment_keep``,
        ``second_moment_keep`` or ``max_k2_keep``."""
        if self.step_mask == "seq_max_k2":
            return max_k2_keep(log_w, threshold, weight)
        if self.step_mask == "trust_region":
            return trust_region_second_moment_keep(log_w, adv, weight, threshold)
        if self.step_mask == "all":
            return second_moment_keep(log_w, weight, threshold)
        return None

    def weight(self, ratio_k, cap: float, cap_min: float = 0.0) -> np.ndarray:
        """The weight on the clipped ratio: clip(w, c, C) (truncate) or w 1[c <= w <= C] (mask) for w = ``ratio_k`` =
        pi_k/alpha at the mode's level, C = ``cap``, c = ``cap_min`` (0: no lower cap); 1 for the others and
        for mode none."""
        w = np.asarray(ratio_k, dtype=np.float64)
        if not (self.trl and self.weighted):
            return np.ones_like(w)
        if self.truncate:
            return np.clip(w, cap_min, cap)
        return np.where((w <= cap) & (w >= cap_min), w, 0.0)

    def objective(self, ratio, ratio_k, adv, clip, cap: float = 3.0, clip_high=None, delta: float = 0.0,
                  cap_min: float = 0.0, keep=None) -> np.ndarray:
        """The per-sample objective, elementwise: paper: f_eps(r, r', A) (``core.clip_objective``); the TRL modes:
        the weight times PPO's clip of rho = r/r' to [1 - clip, 1 + clip_high] (``delta``: rho <= delta in the
        unclipped branch); m2po: keep x r x A (``keep``: M2PO's mask, all kept when None). ``ratio`` = r = pi/alpha,
        ``ratio_k`` = r' = pi_k/alpha > 0."""
        if self.step_mask:  # no clip: keep x r x A, r = pi/alpha (``keep``: ``second_moment_keep``'s mask)
            ratio = np.asarray(ratio, dtype=np.float64)
            kept = np.ones(ratio.shape, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
            return np.where(kept, ratio * np.asarray(adv, dtype=np.float64), 0.0)
        if not self.trl:
            return clip_objective(ratio, ratio_k, adv, clip, clip_high, delta)
        ratio, ratio_k = np.asarray(ratio, dtype=np.float64), np.asarray(ratio_k, dtype=np.float64)
        g = clip_objective(ratio / ratio_k, np.ones_like(ratio_k), adv, clip, clip_high, delta)
        return self.weight(ratio_k, cap, cap_min) * g

    def slope(self, ratio, ratio_k, adv, clip, cap: float = 3.0, cap_min: float = 0.0,
              keep=None, clip_high=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The derivative of ``objective`` in r (no ``delta``; ``clip_high``: the window's upper width, None:
        ``clip``), elementwise, and where a clip stops it: ``(slope, low, high)``. paper: A off the clipped branches
        of f_eps; the TRL modes: weight x A / r' off PPO's clipped branches of rho = r/r'; m2po: keep A (no clip). The gradient of a sample's objective in the
        logits of a softmax policy is slope x r x (e_y - pi), since dr/dtheta = r (e_y - pi): the bandit simulator
        ascends it (``grpo_theory.simulate``)."""
        ratio, ratio_k, adv = (np.asarray(x, dtype=np.float64) for x in (ratio, ratio_k, adv))
        if self.step_mask:
            kept = np.ones(ratio.shape, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
            none = np.zeros(ratio.shape, dtype=bool)
            return np.where(kept, adv, 0.0), none, none
        if not self.trl:
            low, high = clip_flags(ratio, ratio_k, adv, clip, clip_high)
            return np.where(low | high, 0.0, adv), low, high
        low, high = clip_flags(ratio / ratio_k, np.ones_like(ratio_k), adv, clip, clip_high)
        return np.where(low | high, 0.0, self.weight(ratio_k, cap, cap_min) * adv / ratio_k), low, high


#: One object per importance-sampling mode, by name.
REGISTRY: dict[str, Correction] = {c.name: c for c in (
    Correction("paper"),
    Correction("token_truncate", trl=True, truncate=True, level="token"),
    Correction("token_mask", trl=True, level="token"),
    Correction("sequence_truncate", trl=True, truncate=True, level="sequence"),
    Correction("sequence_mask", trl=True, level="sequence"),
    Correction("m2po", step_mask="trust_region"),
    Correction("m2po_areal", step_mask="all"),
    Correction("seq_max_k2", step_mask="seq_max_k2"),
    Correction("none", trl=True, weighted=False),
)}
assert tuple(REGISTRY) == MODES
#: TRL's vllm_importance_sampling_mode values: a weight pi_k/alpha truncated or masked, times PPO's clip.
TRL_MODES = tuple(name for name, c in REGISTRY.items() if c.trl and c.weighted)


def correction(mode: str) -> Correction:
    """The registered mode ``mode``; ValueError naming the modes otherwise."""
    if mode not in REGISTRY:
        raise ValueError(f"importance_sampling_mode: expected one of {', '.join(MODES)}, got {mode!r}")
    return REGISTRY[mode]


def corrected_weight(ratio_k, mode: ImportanceSamplingMode, cap: float, cap_min: float = 0.0) -> np.ndarray:
    """``correction(mode).weight``: the weight a mode multiplies the clipped ratio by."""
    return correction(mode).weight(ratio_k, cap, cap_min)


def corrected_objective(ratio, ratio_k, adv, clip, mode: ImportanceSamplingMode = "paper", cap: float = 3.0,
                        clip_high=None, delta: float = 0.0, cap_min: float = 0.0, keep=None) -> np.ndarray:
    """``correction(mode).objective``: the per-sample objective of a mode, elementwise."""
    return correction(mode).objective(ratio, ratio_k, adv, clip, cap, clip_high, delta, cap_min, keep)


def corrected_slope(ratio, ratio_k, adv, clip, mode: ImportanceSamplingMode = "paper", cap: float = 3.0,
                    cap_min: float = 0.0, keep=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``correction(mode).slope``: the objective's derivative in r and where a clip stops it."""
    return correction(mode).slope(ratio, ratio_k, adv, clip, cap, cap_min, keep)


def corrected_surrogate(pi, pi_k, alpha, r, eps, clip, mode: ImportanceSamplingMode = "paper", cap: float = 3.0,
                        clip_high=None, delta: float = 0.0, cap_min: float = 0.0,
                        m2_threshold: float = M2_THRESHOLD,
                        rollout_rs_threshold: float = ROLLOUT_RS_THRESHOLD) -> np.ndarray:
    """E_{y ~ alpha} of ``corrected_objective`` with A = A_alpha (whitened with ``eps``): the objective each mode
    ascends, exact on a table. Shapes (..., n) -> (...). alpha and pi_k must be positive wherever pi or pi_k is.
    With mode paper it is ``core.clipped_surrogate``; with m2po the mask is ``second_moment_keep`` of the table's
    log pi_k/alpha weighted by alpha (the limit of a batch's mask as the batch grows)."""
    pi, pi_k, alpha = as_policy(pi, "pi"), as_policy(pi_k, "pi_k"), as_policy(alpha, "alpha")
    check_same_actions(pi=pi, pi_k=pi_k, alpha=alpha)
    if np.any((alpha == 0) & ((pi > 0) | (pi_k > 0))) or np.any((pi_k == 0) & (pi > 0)):
        raise ValueError("alpha and pi_k: must be positive wherever pi (or pi_k) is (ratios undefined)")
    a = whitened_advantage(alpha, r, eps)
    live = (alpha > 0) & (pi_k > 0)
    safe_a, safe_k = np.where(live, alpha, 1.0), np.where(live, pi_k, 1.0)
    keep, corr = None, correction(mode)
    if corr.step_mask:
        log_w = np.log(safe_k / safe_a)
        keep = np.zeros(log_w.shape, dtype=bool)
        threshold = corr.threshold(m2_threshold, rollout_rs_threshold)
        for idx in np.ndindex(log_w.shape[:-1]):
            live_i = live[idx]
            keep[idx][live_i] = corr.keep(log_w[idx][live_i], a[idx][live_i], alpha[idx][live_i], threshold)
    f = corrected_objective(pi / safe_a, safe_k / safe_a, a, clip, mode, cap, clip_high, delta, cap_min, keep)
    return np.sum(np.where(live, alpha * f, 0.0), axis=-1)

"""TRL 1.16's other objectives and DPPO's trust regions on a table, exact (docs/theory.md, §6.1).

On a tabular bandit a response is one token, so each loss type's objective is a function of one sample's pi(y),
pi_k(y) and alpha(y), and its normaliser is the mean over the samples whatever the loss type (grpo, dapo, dr_grpo,
bnpo and luspo are then the clipped objective of the importance-sampling mode). What a softmax policy's gradient
needs from the others is the derivative of a sample's objective in log pi(y): the logits' gradient is that
coefficient times (e_y - pi). ``log_slope`` returns it for each objective, with rho = pi/pi_k, r = pi/alpha and w the
TRL mode's weight pi_k/alpha truncated or masked (``Correction.weight``):

- cispo: min(rho, epsilon_high) A w log pi, the factor detached: coefficient min(rho, epsilon_high) A w;
- sapo: 4 sigmoid(tau (rho - 1)) / tau A w, tau by the sign of A: coefficient 4 s (1 - s) rho A w, s the sigmoid;
- vespo: phi(W) A log pi, phi(W) = e^lambda W^k e^(-lambda W) detached, W = rho w (each factor's log held as
  the torch loss holds it): coefficient phi(W) A;
- dppo_tv, dppo_kl: min(pi/alpha, clip_ratio_c) A log pi on the samples inside the trust region around alpha
  (|pi - alpha| of the sampled token, or its binary KL(alpha || pi), within epsilon_high for A > 0, epsilon for
  A <= 0, taken in the direction the advantage pushes): coefficient min(r, C) A inside, 0 outside.

TRL's off-policy mask (``off_policy_mask_threshold``) drops a sample of negative advantage whose log alpha - log pi
exceeds the threshold, with every objective. ``llm.tensors.loss.trl_objective``, ``dppo_objective`` and
``off_policy_mask`` are the torch twins; tests hold each coefficient equal to the twin's autograd gradient.
"""

from __future__ import annotations

import math

import numpy as np

#: Largest log-ratio exponentiated (here and in the torch loss, ``llm.tensors.loss``): float32 overflows above e^88.7,
#: and a margin of e^8 keeps a ratio times an advantage, summed over a step's tokens with the loss weights (which add
#: up to at most 1), finite.
LOG_RATIO_MAX = 80.0
#: VESPO's floor on W and on each weight it folds in (the torch loss's log 1e-8), and its ceiling on log W.
VESPO_LOG_FLOOR = math.log(1e-8)
VESPO_LOG_CEIL = 20.0
#: DPPO's ceiling on log pi/alpha before it is exponentiated (the authors' code), and the binary KL's guard.
DPPO_LOG_CEIL = 20.0
DPPO_KL_GUARD = 1e-8


def _f64(*xs):
    return tuple(np.asarray(x, dtype=np.float64) for x in xs)


def upper_width(config) -> float:
    """epsilon_high, or epsilon where it is None (TRL's convention)."""
    high = getattr(config, "epsilon_high", None)
    return config.epsilon if high is None else high


def log_slope(objective: str, logp, logp_k, logp_alpha, adv, weight, config) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
    """The derivative of each sample's ``objective`` (cispo, sapo, vespo, dppo_tv, dppo_kl) in log pi(y),
    elementwise over samples, and where a clip or trust region stops it: ``(coefficient, low, high)``.

    ``logp``, ``logp_k``, ``logp_alpha``: log pi(y), log pi_k(y), log alpha(y) of the sampled responses; ``adv``:
    their advantages; ``weight``: the TRL mode's weight pi_k/alpha (``Correction.weight``; 1 with mode none, unused
    by DPPO, which weighs by pi/alpha itself). ``config`` carries the loss's settings under TRL's and verl's names:
    epsilon, epsilon_high, sapo_temperature_pos/_neg, vespo_k_pos/_neg, vespo_lambda_pos/_neg, clip_ratio_c."""
    logp, logp_k, logp_alpha, adv, weight = _f64(logp, logp_k, logp_alpha, adv, weight)
    none = np.zeros(np.broadcast(logp, adv).shape, dtype=bool)
    high_width = upper_width(config)
    if objective == "cispo":
        rho = np.exp(np.minimum(logp - logp_k, LOG_RATIO_MAX))
        return np.minimum(rho, high_width) * adv * weight, none, (rho > high_width) & (adv > 0)
    if objective == "sapo":
        rho = np.exp(np.minimum(logp - logp_k, LOG_RATIO_MAX))
        tau = np.where(adv > 0, config.sapo_temperature_pos, config.sapo_temperature_neg)
        s = 1.0 / (1.0 + np.exp(-tau * (rho - 1.0)))
        return 4.0 * s * (1.0 - s) * rho * adv * weight, none, none
    if objective == "vespo":
        with np.errstate(divide="ignore"):
            log_w = np.log(weight)
        log_big_w = np.clip(np.clip(logp - logp_k, -20.0, 20.0) + np.clip(log_w, VESPO_LOG_FLOOR, VESPO_LOG_CEIL),
                            VESPO_LOG_FLOOR, VESPO_LOG_CEIL)
        pos = adv >= 0
        k = np.where(pos, config.vespo_k_pos, config.vespo_k_neg)
        lam = np.maximum(np.where(pos, config.vespo_lambda_pos, config.vespo_lambda_neg), 1e-4)
        phi = np.exp(lam + k * log_big_w - lam * np.exp(log_big_w))
        return phi * adv, none, none
    if objective in ("dppo_tv", "dppo_kl"):
        ratio = np.minimum(np.exp(np.minimum(logp - logp_alpha, DPPO_LOG_CEIL)), config.clip_ratio_c)
        p, q = np.exp(logp), np.exp(logp_alpha)
        if objective == "dppo_tv":
            out_pos, out_neg = (p - q) > high_width, (p - q) < -config.epsilon
        else:
            kl = q * (logp_alpha - logp) + (1.0 - q) * np.log((1.0 - q + DPPO_KL_GUARD) / (1.0 - p + DPPO_KL_GUARD))
            out_pos, out_neg = (kl > high_width) & (p > q), (kl > config.epsilon) & (p < q)
        positive = adv > 0
        out = np.where(positive, out_pos, out_neg)
        return np.where(out, 0.0, ratio * adv), out & ~positive, out & positive
    raise ValueError(f"objective: expected cispo, sapo, vespo, dppo_tv or dppo_kl, got {objective!r}")


def off_policy_keep(logp, logp_alpha, adv, threshold: float | None) -> np.ndarray:
    """TRL's off-policy sequence mask on a table (a response is one token): a sample stays unless its advantage is
    negative and log alpha(y) - log pi(y) (pi_theta, the sample estimate of KL(alpha || pi)) exceeds ``threshold``.
    None: every sample stays."""
    logp, logp_alpha, adv = _f64(logp, logp_alpha, adv)
    if threshold is None:
        return np.ones(np.broadcast(logp, adv).shape, dtype=bool)
    return (adv >= 0) | (logp_alpha - logp <= threshold)

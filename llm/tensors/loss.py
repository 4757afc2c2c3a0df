"""The off-policy clipped GRPO loss: a pure function of tensors (docs/theory.md, §6).

Per completion token (or per sequence with ``ratio_level="sequence"``):

    r  = pi_theta / alpha        (the ratio being optimised)
    r' = pi_k / alpha            (the importance weight of the trainer policy at the step start)
    f  = min(r A, clip(r, max(r' - eps, 0), r' + eps) A)          -- grpo_theory.clip_objective
    loss_token = -f + beta * kl_token

With alpha = pi_k (v = 1) r' = 1 and this is on-policy GRPO/PPO clipping. r' is computed from the
log-probabilities; it is never assumed to be 1. ``epsilon_high`` widens the window's top, ``delta`` caps the unclipped
ratio of negative advantages, and ``importance_sampling_mode`` swaps in TRL's corrections (PPO's clip of pi/pi_k
times a truncated or masked pi_k/alpha, or M2PO's unclipped pi/alpha on the tokens its second-moment mask keeps);
each is ``grpo_theory.corrected_objective`` on a table (docs/theory.md, §6.1).

The KL term (docs/theory.md, §8.4): k3 = e^d - d - 1 with d = log pi_ref - log pi has expectation
KL(pi(.|x, y_<t) || pi_ref(.|x, y_<t)) over a token y_t drawn from pi given its prefix. The tokens here come from
alpha, so by default (``use_bias_correction_kl``, TRL's name) k3 is multiplied by the token ratio pi/alpha: each
term's expectation given its prefix is then that per-token KL, with the prefix drawn from alpha. Summed over a
completion it estimates E_{y ~ alpha} sum_t KL(pi || pi_ref | y_<t), the per-token KL along alpha's prefixes, not
the sequence-level KL(pi || pi_ref) = E_{y ~ pi} sum_t KL(... | y_<t), whose prefixes come from pi (the two agree
at alpha = pi). Without the correction the terms estimate E_alpha[k3], which is neither once pi != alpha.

No ratio overflows (``bounded_ratios``): for A >= 0 the objective depends on r only through min(r, r' + eps), so
r is capped there in log space, which changes neither f nor its gradient for any r; otherwise r and r' are capped
at e^LOG_RATIO_MAX, below which nothing changes. The KL term's log-ratios are clamped to +-KL_LOG_MAX (40 nats).
A loss that is still not finite (a NaN log-prob) is the trainer's to skip (``llm.run.trainer.optimise``).

The step's loss is sum(per_token * weights): ``loss_weights`` turns the normalisation of each loss type
(and the zero-variance mask) into one weight per token, computed once from the whole step's masks, so a
step split into micro-batches sums to exactly the loss (and gradient) of the unsplit step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from grpo_theory.corrections import MODES, REGISTRY, ROLLOUT_RS_THRESHOLD, Correction, ImportanceSamplingMode

from grpo_theory.loss_types import LossTypeName, Objective
from grpo_theory.objectives import (  # the conventions the torch twins share with the tabular forms
    DPPO_KL_GUARD, DPPO_LOG_CEIL, LOG_RATIO_MAX, VESPO_LOG_CEIL, VESPO_LOG_FLOOR)
from grpo_theory.loss_types import loss_type as registered_loss_type

LossType = LossTypeName  # declared once, in grpo_theory.loss_types
RatioLevel = Literal["token", "sequence", "sequence_normalised"]


def clip_window_torch(ratio_k: torch.Tensor, clip: float,
                      clip_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[max(r' - clip, 0), r' + clip_high]; the torch twin of ``grpo_theory.clip_window`` (tested equal)."""
    return torch.clamp(ratio_k - clip, min=0.0), ratio_k + (clip if clip_high is None else clip_high)


def clip_flags_torch(ratio: torch.Tensor, ratio_k: torch.Tensor, adv: torch.Tensor, clip: float,
                     clip_high: float | None = None):
    """Where the clip stops the gradient, ``(low, high)``; the torch twin of ``grpo_theory.clip_flags``."""
    low, high = clip_window_torch(ratio_k, clip, clip_high)
    return (ratio < low) & (adv < 0), (ratio > high) & (adv > 0)


def clip_objective_torch(ratio: torch.Tensor, ratio_k: torch.Tensor, adv: torch.Tensor, clip: float,
                         clip_high: float | None = None, delta: float = 0.0) -> torch.Tensor:
    """f_eps(r, r', a) elementwise (``delta`` > 0: r <= r' + delta - 1 in the unclipped branch); the torch twin of
    ``grpo_theory.clip_objective`` (tested equal)."""
    low, high = clip_window_torch(ratio_k, clip, clip_high)
    clipped = torch.minimum(torch.maximum(ratio, low), high)
    free = torch.minimum(ratio, ratio_k + (delta - 1.0)) if delta > 0 else ratio
    return torch.minimum(free * adv, clipped * adv)


#: Cap of each of the KL term's exponents (log pi_ref/pi in k3 and log pi/alpha in its correction), so that
#: their product stays below e^LOG_RATIO_MAX.
KL_LOG_MAX = LOG_RATIO_MAX / 2


def bounded_ratios(log_ratio: torch.Tensor, log_ratio_k: torch.Tensor, adv: torch.Tensor,
                   clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """r = exp(log_ratio) and r' = exp(log_ratio_k) bounded so that f_eps(r, r', A) never meets inf or NaN, and
    equals the unbounded f_eps, with the same gradient, wherever that is finite.

    ``clip`` is the window's upper width (epsilon_high where it differs from epsilon). r' is capped at
    e^LOG_RATIO_MAX. Where A >= 0, f_eps = A min(r, r' + eps) (the lower clip never binds then), so
    r is capped at r' + eps in log space: f and its gradient are unchanged for every r, however large. Where
    A < 0, f_eps = A max(r, max(r' - eps, 0)) grows without bound in r, so r is capped at e^LOG_RATIO_MAX:
    unchanged below, held there (zero gradient) above, where the unbounded f overflows.
    """
    log_ratio_k = log_ratio_k.clamp(max=LOG_RATIO_MAX)
    top = torch.logaddexp(log_ratio_k, torch.tensor(math.log(clip), dtype=log_ratio_k.dtype,
                                                    device=log_ratio_k.device)) if clip > 0 else log_ratio_k
    cap = torch.where(adv >= 0, top, torch.full_like(top, LOG_RATIO_MAX))
    # where, not minimum: at a tie the gradient flows through log_ratio in full, as without the cap
    return torch.exp(torch.where(log_ratio > cap, cap, log_ratio)), torch.exp(log_ratio_k)


def step_mask_torch(correction: Correction, log_w: torch.Tensor, adv: torch.Tensor, weight: torch.Tensor,
                    threshold: float) -> torch.Tensor | None:
    """The mode's step mask over the step's tokens (B, T) (``Correction.step_mask``; None for a mode without one),
    computed by its one definition, ``Correction.keep`` over 1-D samples in numpy (float64): the samples are the tokens
    of weight > 0 in row-major order (M2PO's masks: the paper's ``m2po``, AReaL's ``m2po_areal``), or, for a
    sequence-level mask (Trust Region Masking's ``seq_max_k2``), each row's largest |log w| over its tokens, the row's
    tokens all kept or all dropped. ``log_w`` = log pi_k/alpha, ``adv`` (B, T) or (B,), ``weight`` (B, T): 1 on the
    step's tokens (or alpha's probabilities on a table's rows), 0 off them (never kept). Computed once over the whole
    step (``llm.optim.update.optimise``), never per micro-batch."""
    if not correction.step_mask:
        return None
    on = weight.detach() > 0
    lw = log_w.detach().double()
    to_numpy = lambda t: t.cpu().numpy()  # noqa: E731
    if correction.mask_level == "sequence":
        rows = torch.where(on, lw.abs(), torch.zeros_like(lw)).amax(dim=1)
        kept = correction.keep(to_numpy(rows), None, to_numpy(on.any(dim=1).double()), threshold)
        return on & torch.from_numpy(kept).to(on.device)[:, None]
    a = (adv if adv.dim() == log_w.dim() else adv[:, None].expand_as(log_w)).detach().double()
    kept = correction.keep(to_numpy(lw[on]), to_numpy(a[on]), to_numpy(weight.detach().double()[on]), threshold)
    out = torch.zeros_like(on)
    out[on] = torch.from_numpy(kept).to(on.device)
    return out


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) on tokens sampled from pi: e^d - d - 1, d = ref - logp, with d
    clamped to [-KL_LOG_MAX, KL_LOG_MAX] (the term is held at its value there: at most 2.4e17, or 39 nats when
    pi_ref gives the token e^-40 of pi's probability or none at all)."""
    d = (logp_ref - logp).clamp(-KL_LOG_MAX, KL_LOG_MAX)
    return torch.exp(d) - d - 1.0


def loss_weights(completion_mask: torch.Tensor, loss_type: LossType, max_completion_length: int,
                 sequence_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Weight of every token in the step's loss, (B, T): the loss is sum(per_token * weights).

    grpo: mean over each sequence's tokens, then mean over the sequences that have any token;
    dapo: sum over tokens / number of tokens; dr_grpo: sum / (sequences x max_completion_length); bnpo: as dapo for
    the step as one pass (TRL's bnpo normalises each micro-batch by its own tokens: ``llm.optim.update.bnpo_weights``).
    Sequences with ``sequence_mask`` 0 (masked groups) weigh 0 and count in no normaliser.
    Compute it once from the masks of the whole step (never per micro-batch).
    """
    normaliser = registered_loss_type(loss_type).normaliser
    mask = completion_mask.float()
    if sequence_mask is not None:
        mask = mask * sequence_mask.float()[:, None]
    seq_tokens = mask.sum(dim=1, keepdim=True)
    n_seq = (seq_tokens > 0).sum().clamp(min=1)
    return NORMALISERS[normaliser](mask, seq_tokens, n_seq, max_completion_length)


#: Each ``LossType.normaliser``'s token weights: (mask, per-sequence token counts, sequences, length budget) -> (B, T).
NORMALISERS = {
    "tokens": lambda mask, seq_tokens, n_seq, budget: mask / mask.sum().clamp(min=1.0),
    "budget": lambda mask, seq_tokens, n_seq, budget: mask / (n_seq * budget),
    "sequence": lambda mask, seq_tokens, n_seq, budget: mask / seq_tokens.clamp(min=1.0) / n_seq,
    "sequence_sum": lambda mask, seq_tokens, n_seq, budget: mask / n_seq,
}


def level_log_ratio(token_log_ratio: torch.Tensor, real: torch.Tensor, level: str) -> torch.Tensor:
    """A log-ratio at ``level``, (B, T): per token; per sequence (the sum over its ``real`` tokens, copied onto
    each); sequence_normalised (the mean over them: the log of GSPO's geometric-mean ratio)."""
    if level == "token":
        return token_log_ratio
    total = (token_log_ratio * real).sum(dim=1, keepdim=True)
    if level == "sequence":
        return total.expand_as(token_log_ratio)
    if level == "sequence_normalised":
        return (total / real.sum(dim=1, keepdim=True).clamp(min=1.0)).expand_as(token_log_ratio)
    raise ValueError(f"ratio_level: expected token, sequence or sequence_normalised, got {level!r}")


@dataclass(frozen=True)
class Clip:
    """The clipped objective's settings (``GRPOConfig`` names): the window's widths, the two-sided clip, the ratio
    level, and how alpha != pi_k is corrected (``grpo_theory.corrections``)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float = 0.0
    ratio_level: RatioLevel = "token"
    importance_sampling_mode: ImportanceSamplingMode = "paper"
    importance_sampling_cap: float = 3.0
    importance_sampling_cap_min: float = 0.0  # the lower cap (TRL's clip_min, IcePop's band); 0: none
    m2_threshold: float = 0.04  # M2PO's threshold on the kept tokens' mean (log w)^2 (mode m2po)
    rollout_rs_threshold: float = ROLLOUT_RS_THRESHOLD  # TRM's gate on a sequence's largest k2 (mode seq_max_k2)
    objective: Objective = "clip"  # the loss type's per-token objective (``grpo_theory.loss_types``)
    sapo_temperature_pos: float = 1.0  # SAPO's gate temperature where A > 0 (TRL's name and default)
    sapo_temperature_neg: float = 1.05  # ... where A <= 0
    vespo_k_pos: float = 2.0  # VESPO's gamma weight phi(w) = e^lambda w^k e^(-lambda w) where A >= 0 (TRL's defaults)
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0  # ... where A < 0
    vespo_lambda_neg: float = 2.0
    off_policy_mask_threshold: float | None = None  # TRL's off-policy sequence mask (DeepSeek-V3.2); None: off
    clip_ratio_c: float = 10000.0  # DPPO: pi/alpha truncated here (verl's name; its DPPO example's value: none)

    @property
    def high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def correction(self) -> Correction:
        """The mode's object (``grpo_theory.corrections.REGISTRY``)."""
        return REGISTRY[self.importance_sampling_mode]

    @property
    def step_threshold(self) -> float:
        """The threshold of the mode's step mask (``Correction.threshold``)."""
        return self.correction.threshold(self.m2_threshold, self.rollout_rs_threshold)

    @property
    def loss(self) -> "CorrectionLoss":
        """The mode's torch twin (``LOSSES``)."""
        return LOSSES[self.importance_sampling_mode]


@dataclass
class LossStats:
    """Sums over the loss tokens of one or more micro-batches; ``metrics()`` gives the step's values."""

    loss: float = 0.0
    tokens: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    above_cap: float = 0.0
    optional: dict = field(default_factory=dict)  # name -> sum over loss tokens, of the terms a config switches on

    SUMS = ("loss", "tokens", "clip_low", "clip_high", "above_cap")

    def merge(self, other: "LossStats") -> "LossStats":
        optional = {k: self.optional.get(k, 0.0) + other.optional.get(k, 0.0)
                    for k in {**self.optional, **other.optional}}  # keys in order
        return LossStats(**{k: getattr(self, k) + getattr(other, k) for k in self.SUMS}, optional=optional)

    def metrics(self) -> dict[str, float]:
        """TRL's names where they exist: loss, clip_ratio/*, kl; plus ``is_correction/frac_above_cap`` (loss tokens
        whose weight a TRL mode truncated or masked; 0 with the paper's clip) and, where they are on, the KL term's
        means and ``off_policy_mask/frac_masked`` (loss tokens whose completion TRL's off-policy mask dropped; TRL logs
        no such share). Shares and means over the loss tokens:
        nan on a step with none (every group masked, or dropped for staleness), where there is nothing to average.
        The importance weights and the mismatch KL are over every completion token (``llm.tensors.diagnostics.
        weight_metrics``), not these."""
        n = self.tokens
        share = (lambda x: x / n) if n else (lambda x: float("nan"))  # noqa: E731
        out = {
            "loss": self.loss,
            "clip_ratio/low_mean": share(self.clip_low),
            "clip_ratio/high_mean": share(self.clip_high),
            "clip_ratio/region_mean": share(self.clip_low + self.clip_high),
            "is_correction/frac_above_cap": share(self.above_cap),
        }
        out.update({k: share(v) for k, v in self.optional.items()})
        return out


def grpo_loss(
    logp: torch.Tensor,
    logp_k: torch.Tensor,
    logp_alpha: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    clip: float | Clip,
    ratio_level: RatioLevel | None = None,
    beta: float = 0.0,
    logp_ref: torch.Tensor | None = None,
    use_bias_correction_kl: bool = True,
    entropy_mask: torch.Tensor | None = None,
    token_keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Loss (to minimise) of one optimiser step, or of one micro-batch of it, and its statistics.

    Shapes: ``logp`` (pi_theta, with grad), ``logp_k`` (pi_k), ``logp_alpha`` (alpha), ``logp_ref``:
    (B, T) log-probabilities of the sampled completion tokens, float32; ``advantages`` (B,); ``weights``
    (B, T) from ``loss_weights`` (0 off the loss tokens). ``logp_k`` and ``logp_alpha`` carry no gradient.
    ``clip``: epsilon, or the whole ``Clip`` (``ratio_level`` overrides its level when given).

    Sequence-level ratios (the product of a completion's token ratios, or their geometric mean) give each sequence
    one objective value f, copied onto its tokens; with the ``grpo`` weights (1/length per sequence) every sequence
    then counts once, which is the paper's E_alpha f. The config refuses them with the token-level normalisers.

    With a TRL importance-sampling mode the objective is ``grpo_theory.corrected_objective``: PPO's clip of
    rho = pi/pi_k at the ratio level, times w = pi_k/alpha per token or per sequence, truncated or masked at the cap
    (and at the lower cap, when one is set). ``entropy_mask`` (B, T): multiplies the clipped objective per token, not
    the KL term (``top_entropy_quantile``). ``token_keep`` (B, T) bool: M2PO's mask (mode m2po; all kept when None),
    which also multiplies the objective only; the tokens it drops are counted in ``is_correction/frac_above_cap``.
    """
    spec = clip if isinstance(clip, Clip) else Clip(epsilon=clip)
    level = ratio_level or spec.ratio_level
    if not (logp.shape == logp_k.shape == logp_alpha.shape == weights.shape):
        raise ValueError("logp, logp_k, logp_alpha and weights must share one (B, T) shape")
    if beta > 0 and logp_ref is None:
        raise ValueError("logp_ref: needed when beta > 0")
    on = weights > 0
    logp_k, logp_alpha = logp_k.detach(), logp_alpha.detach()
    # the KL's bias correction: pi/alpha, the tokens' sampler; mode none treats the samples as pi_k's (TRL's KL with its
    # correction off: pi/pi_old)
    token_log_ratio = logp - (logp_alpha if spec.correction.weighted else logp_k)
    adv = advantages.to(logp.dtype)[:, None].expand_as(logp)
    flags = None
    if spec.objective == "clip":
        per_token, log_ratio, log_ratio_k, above = clipped_objective(logp, logp_k, logp_alpha, adv, weights != 0, spec,
                                                                     level)
    elif spec.objective in ("dppo_tv", "dppo_kl"):
        per_token, log_ratio, log_ratio_k, above, flags = dppo_objective(logp, logp_k, logp_alpha, adv, spec)
    else:
        per_token, log_ratio, log_ratio_k, above, flags = trl_objective(logp, logp_k, logp_alpha, adv,
                                                                        on.to(logp.dtype), spec, level)
    optional = {}
    if spec.off_policy_mask_threshold is not None:
        kept = off_policy_mask(logp, logp_alpha, adv, on.to(logp.dtype), spec.off_policy_mask_threshold)
        per_token = per_token * kept
        optional["off_policy_mask/frac_masked"] = float(((kept == 0) & on).sum())
    if entropy_mask is not None:
        per_token = per_token * entropy_mask
    if spec.correction.step_mask and token_keep is not None:
        per_token = per_token * token_keep.to(per_token.dtype)
        above = ~token_keep.bool()
    if beta > 0:
        k3 = k3_kl(logp, logp_ref.detach())
        k3_is = torch.exp(token_log_ratio.clamp(max=KL_LOG_MAX)) * k3  # pi/alpha (with gradient) times k3
        per_token = per_token + beta * (k3_is if use_bias_correction_kl else k3)
        with torch.no_grad():
            optional.update({"kl": float(((k3_is if use_bias_correction_kl else k3) * on).sum()),
                             "kl/k3": float((k3 * on).sum()), "kl/k3_is": float((k3_is * on).sum())})
    loss = (per_token * weights).sum()
    return loss, loss_stats(loss, log_ratio, log_ratio_k, adv, spec, on, above, optional, flags)


def off_policy_mask(logp: torch.Tensor, logp_alpha: torch.Tensor, adv: torch.Tensor, real: torch.Tensor,
                    threshold: float) -> torch.Tensor:
    """TRL's off-policy sequence mask (DeepSeek-V3.2; ``off_policy_mask_threshold``), (B, 1): a completion leaves the
    loss when its advantage is negative and the mean over its tokens of log alpha - log pi (pi detached: a sample
    estimate of KL(alpha || pi)) exceeds ``threshold``; a token alpha could not score (nan) counts 0."""
    kl = torch.nan_to_num(logp_alpha.detach() - logp.detach(), nan=0.0)
    mean = (kl * real).sum(dim=1, keepdim=True) / real.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((adv[:, :1] >= 0) | (mean <= threshold)).to(logp.dtype)


def trl_weight(logp_k: torch.Tensor, logp_alpha: torch.Tensor, real: torch.Tensor, spec: "Clip"):
    """The TRL mode's weight w = pi_k/alpha at its level, truncated or masked to [cap_min, cap] (TRL's
    ``importance_sampling_ratio``; 1 with mode none), with log w and the tokens outside the band [cap_min, cap]."""
    twin = spec.correction
    log_w = level_log_ratio(logp_k - logp_alpha, real, twin.level)
    if not twin.weighted:  # mode none (TRL's vllm_importance_sampling_correction=False): no weight, nothing out of band
        return torch.ones_like(log_w), log_w, torch.zeros_like(log_w, dtype=torch.bool)
    w = torch.exp(log_w.clamp(max=LOG_RATIO_MAX))
    lo, hi = spec.importance_sampling_cap_min, spec.importance_sampling_cap
    above = (log_w > math.log(hi)) | (w < lo)
    w = torch.clamp(w, min=lo, max=hi) if twin.truncate else torch.where(above, torch.zeros_like(w), w)
    return w, log_w, above


def dppo_objective(logp, logp_k, logp_alpha, adv, spec: "Clip"):
    """Minus DPPO's objective per token (Qi et al., arXiv 2602.04879, as the authors' code sail-sg/Stable-RL computes
    its rollout-anchored ``dppo_binary_tv`` and ``dppo_binary_kl``): min(pi/alpha, C), detached (C =
    ``clip_ratio_c``; the log-ratio held below 20 first), times A log pi, on the tokens inside the trust region
    around alpha, where p = pi(y_t) and q = alpha(y_t) of the sampled token:

    - dppo_tv: a token of A > 0 leaves when p - q > epsilon_high, one of A <= 0 when p - q < -epsilon;
    - dppo_kl: the binary KL(alpha || pi) of the sampled token against the rest, q log(q/p) + (1 - q)
      log((1 - q + 1e-8)/(1 - p + 1e-8)), above epsilon_high with p > q (A > 0) or above epsilon with p < q (A <= 0).

    The mask, like PPO's clip, stops a token's gradient once pi has left the region in the direction its advantage
    pushes. Returns (minus the objective, log pi/alpha, log pi_k/alpha, no band, (low, high) the tokens masked)."""
    logp_k, logp_alpha = logp_k.detach(), logp_alpha.detach()
    log_r = (logp.detach() - logp_alpha).clamp(max=DPPO_LOG_CEIL)
    ratio = torch.exp(log_r).clamp(max=spec.clip_ratio_c)
    p, q = torch.exp(logp.detach()), torch.exp(logp_alpha)
    if spec.objective == "dppo_tv":
        out_pos, out_neg = (p - q) > spec.high, (p - q) < -spec.epsilon
    else:
        kl = q * (logp_alpha - logp.detach()) + (1 - q) * torch.log(
            (1.0 - q + DPPO_KL_GUARD) / (1.0 - p + DPPO_KL_GUARD))
        out_pos, out_neg = (kl > spec.high) & (p > q), (kl > spec.epsilon) & (p < q)
    positive = adv > 0
    out = torch.where(positive, out_pos, out_neg)
    per_token = -adv * ratio * (~out).to(logp.dtype) * logp
    none = torch.zeros_like(out)
    return per_token, log_r, logp_k - logp_alpha, none, (out & ~positive, out & positive)


def trl_objective(logp, logp_k, logp_alpha, adv, real, spec: "Clip", level: str):
    """Minus TRL 1.16's CISPO, SAPO or VESPO objective per token (``_compute_loss``), with pi_k in TRL's pi_old and
    the TRL mode's weight w = pi_k/alpha in its importance-sampling ratio (which VESPO folds into its sequence weight
    and the others multiply), rho = pi/pi_k at the ratio level:

    - cispo: min(rho, epsilon_high), detached, times A log pi, times w;
    - sapo: 4 sigmoid(tau (rho - 1)) / tau times A, times w, tau = sapo_temperature_pos where A > 0, else _neg;
    - vespo: phi(W) A log pi, phi(W) = e^lambda W^k e^(-lambda W) detached, W = exp of the sequence's summed token
      log pi/pi_k (each held to +-20) plus its summed log w (each held to [log 1e-8, 20]), log W held to
      [log 1e-8, 20]; (k, lambda) = (vespo_k_pos, vespo_lambda_pos) where A >= 0, else the _neg pair.

    Returns (minus the objective (B, T), log rho, log w, tokens outside w's band, (low, high) clip flags)."""
    logp_k, logp_alpha = logp_k.detach(), logp_alpha.detach()
    w, log_w, above = trl_weight(logp_k, logp_alpha, real, spec)
    none = torch.zeros_like(real, dtype=torch.bool)
    if spec.objective == "vespo":
        token = (logp.detach() - logp_k).clamp(-20.0, 20.0)
        log_big_w = (token * real).sum(dim=1, keepdim=True) + (
            torch.log(w).clamp(VESPO_LOG_FLOOR, VESPO_LOG_CEIL) * real).sum(dim=1, keepdim=True)
        log_big_w = log_big_w.clamp(VESPO_LOG_FLOOR, VESPO_LOG_CEIL)
        pos = adv >= 0
        k = torch.where(pos, spec.vespo_k_pos, spec.vespo_k_neg)
        lam = torch.where(pos, spec.vespo_lambda_pos, spec.vespo_lambda_neg).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_big_w - lam * torch.exp(log_big_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        return -phi * adv * logp, token, log_w, above, (none, none)
    log_rho = level_log_ratio(logp - logp_k, real, level)
    rho = torch.exp(log_rho.clamp(max=LOG_RATIO_MAX))
    if spec.objective == "cispo":
        capped = torch.clamp(rho, max=spec.high).detach()
        per_token = -capped * adv * logp * w
        return per_token, log_rho, log_w, above, (none, (rho.detach() > spec.high) & (adv > 0))
    if spec.objective == "sapo":
        tau = torch.where(adv > 0, spec.sapo_temperature_pos, spec.sapo_temperature_neg)
        per_token = -(torch.sigmoid(tau * (rho - 1.0)) * 4.0 / tau) * adv * w
        return per_token, log_rho, log_w, above, (none, none)
    raise ValueError(f"objective: expected clip, cispo, sapo or vespo, got {spec.objective!r}")


class CorrectionLoss:
    """The torch twin of an importance-sampling mode (``grpo_theory.corrections.Correction``, registered under the
    same name in ``LOSSES``): minus its clipped objective per token, with the log-ratios its statistics read and the
    tokens whose weight was out of the band, and where a clip stopped the gradient."""

    def __init__(self, twin: Correction):
        self.twin = twin

    def per_token(self, logp, logp_k, logp_alpha, adv, real, spec: "Clip", level: str):
        """(minus the objective per token (B, T), log r or log rho, log r' or log w, out-of-band tokens)."""
        raise NotImplementedError

    def flags(self, log_ratio, log_ratio_k, adv, spec: "Clip"):
        """Where the clip stops the gradient, ``(low, high)``."""
        raise NotImplementedError


class PaperClipLoss(CorrectionLoss):
    """f_eps(pi/alpha, pi_k/alpha, A): the window around r' = pi_k/alpha; the weight is exact."""

    def per_token(self, logp, logp_k, logp_alpha, adv, real, spec, level):
        log_ratio = level_log_ratio(logp - logp_alpha, real, level)
        log_ratio_k = level_log_ratio(logp_k - logp_alpha, real, level)
        ratio, ratio_k = bounded_ratios(log_ratio, log_ratio_k, adv, spec.high)
        per_token = -clip_objective_torch(ratio, ratio_k, adv, spec.epsilon, spec.high, spec.delta)
        return per_token, log_ratio, log_ratio_k, torch.zeros_like(real, dtype=torch.bool)

    def flags(self, log_ratio, log_ratio_k, adv, spec):
        return clip_flags_torch(torch.exp(log_ratio), torch.exp(log_ratio_k), adv, spec.epsilon, spec.high)


class TRLWeightLoss(CorrectionLoss):
    """PPO's clip of rho = pi/pi_k at the ratio level, times w = pi_k/alpha per token or per sequence, truncated or
    masked at the cap (and at the lower cap, when one is set)."""

    def per_token(self, logp, logp_k, logp_alpha, adv, real, spec, level):
        log_ratio = level_log_ratio(logp - logp_k, real, level)  # rho = pi/pi_k
        w, log_ratio_k, above = trl_weight(logp_k, logp_alpha, real, spec)
        rho, _ = bounded_ratios(log_ratio, torch.zeros_like(log_ratio), adv, spec.high)
        per_token = -w * clip_objective_torch(rho, torch.ones_like(rho), adv, spec.epsilon, spec.high, spec.delta)
        return per_token, log_ratio, log_ratio_k, above

    def flags(self, log_ratio, log_ratio_k, adv, spec):
        return clip_flags_torch(torch.exp(log_ratio), torch.ones_like(log_ratio), adv, spec.epsilon, spec.high)


class M2POLoss(CorrectionLoss):
    """M2PO as published: r A with r = pi/alpha, unclipped, on the tokens the step's second-moment mask keeps (the
    caller's ``token_keep``, ``step_mask_torch``); r held below e^LOG_RATIO_MAX."""

    def per_token(self, logp, logp_k, logp_alpha, adv, real, spec, level):
        log_ratio = logp - logp_alpha
        r = torch.exp(torch.where(log_ratio > LOG_RATIO_MAX, torch.full_like(log_ratio, LOG_RATIO_MAX), log_ratio))
        return -r * adv, log_ratio, logp_k - logp_alpha, torch.zeros_like(real, dtype=torch.bool)

    def flags(self, log_ratio, log_ratio_k, adv, spec):
        none = torch.zeros_like(log_ratio, dtype=torch.bool)  # nothing is clipped
        return none, none


#: The torch twin of every registered mode, by the same name.
LOSSES: dict[str, CorrectionLoss] = {name: (M2POLoss if c.step_mask else TRLWeightLoss if c.trl else PaperClipLoss)(c)
                                     for name, c in REGISTRY.items()}
assert tuple(LOSSES) == MODES


def clipped_objective(logp: torch.Tensor, logp_k: torch.Tensor, logp_alpha: torch.Tensor, adv: torch.Tensor,
                      real: torch.Tensor, spec: Clip, level: str):
    """Minus the clipped objective per token, (B, T), of the mode ``spec`` names (``LOSSES``; ``grpo_theory.
    corrected_objective`` on a table), with the log-ratios its statistics read (r and r', or rho and w) and the
    tokens whose weight was out of the band. ``real``: the loss tokens (B, T) bool."""
    return spec.loss.per_token(logp, logp_k.detach(), logp_alpha.detach(), adv, real.to(logp.dtype), spec, level)


@torch.no_grad()
def loss_stats(loss: torch.Tensor, log_ratio: torch.Tensor, log_ratio_k: torch.Tensor, adv: torch.Tensor, spec: Clip,
               on: torch.Tensor, above: torch.Tensor, optional: dict, flags=None) -> LossStats:
    """The statistics of a loss over its tokens ``on``: of the unbounded ratios (inf where they overflow). The clip
    flags are the mode's (``CorrectionLoss.flags``: the paper's window around r', PPO's around 1 for rho = pi/pi_k,
    none for M2PO)."""
    low, high = spec.loss.flags(log_ratio, log_ratio_k, adv, spec) if flags is None else flags
    return LossStats(loss=float(loss.detach()), tokens=float(on.sum()), clip_low=float((low & on).sum()),
                     clip_high=float((high & on).sum()), above_cap=float((above & on).sum()),
                     optional=optional)

"""The loss types (TRL's ``loss_type``), one object per name, declared once: how a step's per-token losses are
normalised (a convention of the objective, beside ``core.ADVANTAGE_SCALES`` and ``corrections.REGISTRY``). The torch
weights of each normaliser are ``llm.tensors.loss.loss_weights``; the trainer's config takes ``loss_type``'s type from
``LossTypeName`` here, so the config and the loss read one declaration without importing each other."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal, get_args

from runkit.validation import require

from .corrections import correction

LossTypeName = Literal["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo", "luspo", "dppo_tv", "dppo_kl"]
#: The per-token objective a loss type takes: the clipped surrogate (the importance-sampling mode's), one of TRL
#: 1.16's other objectives of rho = pi/pi_k (``llm.tensors.loss.trl_objective``), or DPPO's divergence trust region
#: around alpha (``llm.tensors.loss.dppo_objective``).
Objective = Literal["clip", "cispo", "sapo", "vespo", "dppo_tv", "dppo_kl"]


@dataclass(frozen=True)
class LossType:
    """``normaliser``: what the token losses are divided by: ``sequence`` (each sequence's token count, then the
    number of sequences), ``tokens`` (the step's token count), ``budget`` (sequences x max_completion_length),
    ``sequence_sum`` (each sequence's sum, then the number of sequences: LUSPO's length-unbiased sum).
    ``per_pass``: each micro-batch is its own normaliser (TRL's local batch; the gradient then depends on the split).
    ``objective``: the per-token objective (``Objective``); the clip for TRL's four normalisers and LUSPO, CISPO's,
    SAPO's and VESPO's own for theirs (TRL 1.16's ``_compute_loss``)."""

    name: str
    normaliser: Literal["sequence", "tokens", "budget", "sequence_sum"]
    per_pass: bool = False
    doc: str = ""
    objective: Objective = "clip"


#: One object per loss type, by name.
LOSS_TYPES: dict[str, LossType] = {t.name: t for t in (
    LossType("grpo", "sequence", doc="mean over each sequence's tokens, then over the sequences that have any"),
    LossType("dapo", "tokens", doc="sum over the step's tokens over their number"),
    LossType("dr_grpo", "budget", doc="sum over (sequences x max_completion_length)"),
    LossType("bnpo", "tokens", per_pass=True, doc="each micro-batch's sum over its own tokens (TRL's local batch)"),
    LossType("cispo", "tokens", objective="cispo",
             doc="CISPO: min(rho, epsilon_high), detached, times A log pi; normalised as dapo"),
    LossType("sapo", "sequence", objective="sapo",
             doc="SAPO: a sigmoid gate 4 sigmoid(tau (rho - 1)) / tau times A, tau by the sign of A; as grpo"),
    LossType("vespo", "tokens", objective="vespo",
             doc="VESPO: a gamma weight of the sequence's ratio, detached, times A log pi; normalised as dapo"),
    LossType("luspo", "sequence_sum", doc="LUSPO: the clip summed over each sequence, then a mean over sequences"),
    LossType("dppo_tv", "tokens", objective="dppo_tv",
             doc="DPPO-Binary-TV: min(pi/alpha, C) (detached) A log pi where |pi - alpha| stays in the trust region"),
    LossType("dppo_kl", "tokens", objective="dppo_kl",
             doc="DPPO-Binary-KL: as dppo_tv, the region the binary KL(alpha || pi) of the sampled token"),
)}
assert tuple(LOSS_TYPES) == get_args(LossTypeName)


def loss_type(name: str) -> LossType:
    """The registered loss type ``name``; ValueError naming them otherwise."""
    if name not in LOSS_TYPES:
        raise ValueError(f"loss_type: expected one of {', '.join(LOSS_TYPES)}, got {name!r}")
    return LOSS_TYPES[name]


#: TRL 1.16's defaults of its objectives' settings (SAPO's gate temperatures, VESPO's gamma weight) and verl's DPPO
#: truncation of pi/alpha, under their names: the LLM trainer's config and the bandit simulator both default to these.
SAPO_TEMPERATURE_POS = 1.0
SAPO_TEMPERATURE_NEG = 1.05
VESPO_K_POS, VESPO_LAMBDA_POS = 2.0, 3.0
VESPO_K_NEG, VESPO_LAMBDA_NEG = 3.0, 2.0
CLIP_RATIO_C = 10000.0


@dataclass(frozen=True)
class ObjectiveSettings:
    """The settings of TRL 1.16's objectives, verl's DPPO truncation and TRL's off-policy mask, under their names and
    defaults, declared once: the bandit simulator's config inherits them (``grpo_theory.simulate.SimConfig``), the
    LLM trainer's objective group is built from them (``llm.config.fields.group_of``). On a table a completion is one
    token, so "a completion's tokens" below is that one action."""

    sapo_temperature_pos: float = SAPO_TEMPERATURE_POS
    """SAPO's gate temperature tau where A > 0 (loss_type sapo; TRL's name and default)."""
    sapo_temperature_neg: float = SAPO_TEMPERATURE_NEG
    """SAPO's gate temperature tau where A <= 0 (loss_type sapo; TRL's)."""
    vespo_k_pos: float = VESPO_K_POS
    """VESPO's power k in phi(W) = e^lambda W^k e^(-lambda W) where A >= 0 (loss_type vespo; TRL's)."""
    vespo_lambda_pos: float = VESPO_LAMBDA_POS
    """VESPO's rate lambda where A >= 0 (loss_type vespo; TRL's)."""
    vespo_k_neg: float = VESPO_K_NEG
    """VESPO's power k where A < 0 (loss_type vespo; TRL's)."""
    vespo_lambda_neg: float = VESPO_LAMBDA_NEG
    """VESPO's rate lambda where A < 0 (loss_type vespo; TRL's)."""
    clip_ratio_c: float = CLIP_RATIO_C
    """DPPO (loss_type dppo_tv, dppo_kl): the ratio pi/alpha its objective weighs each token with is truncated here
    (verl's name; 10000, verl's DPPO example: none; the authors' code: 10; the paper finds truncation hurts)."""
    off_policy_mask_threshold: float | None = None
    """TRL's off-policy sequence mask (DeepSeek-V3.2's): a completion of negative advantage leaves the policy term
    when the mean over its tokens of log alpha - log pi exceeds this (a sample KL(alpha || pi)); with every loss type
    and mode. None: off."""


#: TRL 1.16's objectives with its token truncation (cap 3) as their weight pi_k/alpha, CISPO capping pi/pi_k at 5, and
#: DPPO at verl's example thresholds (binary TV 0.15, binary KL 0.05), and VCPO's step and baseline on the paper's
#: clip: the bandit's and the language model's frontier tables both take them from here, under these labels.
FRONTIER_OBJECTIVES = {
    "cispo (token_truncate, eps_high 5)": dict(loss_type="cispo", importance_sampling_mode="token_truncate",
                                               epsilon_high=5.0),
    "sapo (token_truncate)": dict(loss_type="sapo", importance_sampling_mode="token_truncate"),
    "vespo (token_truncate)": dict(loss_type="vespo", importance_sampling_mode="token_truncate"),
    "dppo_tv (0.15)": dict(loss_type="dppo_tv", epsilon=0.15),
    "dppo_kl (0.05)": dict(loss_type="dppo_kl", epsilon=0.05),
    "vcpo ess step (paper clip)": dict(ess_scaling="sqrt"),  # VCPO's step and baseline (``grpo_theory.vcpo``)
    "vcpo baseline (paper clip)": dict(grad_baselining=True),
}


def require_loss_type_settings(config) -> None:
    """The checks a config holding a loss type and its settings must pass (the LLM trainer's and the bandit
    simulator's): which importance-sampling modes each objective combines with (as TRL and DPPO's authors combine
    them), and each setting's range. ``config`` carries loss_type, importance_sampling_mode, the caps, and TRL's and
    verl's names of the objectives' settings."""
    kind = loss_type(config.loss_type)
    mode = correction(config.importance_sampling_mode)
    require(config, kind.objective not in ("dppo_tv", "dppo_kl") or config.importance_sampling_mode == "paper",
            "importance_sampling_mode",
            f"loss_type {config.loss_type} is its own correction of alpha != pi (pi/alpha in a divergence trust "
            "region): leave importance_sampling_mode at paper (vllm_importance_sampling_correction=False is none)")
    require(config, kind.objective != "vespo" or config.importance_sampling_mode in ("token_truncate", "token_mask",
                                                                                      "none"),
            "importance_sampling_mode", "loss_type vespo folds TRL's token weights pi_k/alpha into its sequence "
            "weight: it needs token_truncate or token_mask (as TRL), or none (TRL's correction off)")
    require(config, kind.objective not in ("cispo", "sapo") or mode.trl, "importance_sampling_mode",
            f"loss_type {config.loss_type} is TRL's objective of pi/pi_k times TRL's weight pi_k/alpha: it needs a "
            "TRL mode (TRL's vllm_importance_sampling_mode: token_truncate, token_mask, sequence_truncate or "
            "sequence_mask, TRL's default, where this project's default is paper), or none (correction off)")
    band_holds_one = config.importance_sampling_cap >= 1 and config.importance_sampling_cap_min <= 1
    require(config, kind.objective != "vespo" or band_holds_one, "importance_sampling_cap",
            "loss_type vespo needs a band [importance_sampling_cap_min, importance_sampling_cap] around 1 (TRL "
            "sums the log of its clamped ratio over the padding too, where a band without 1 adds to each "
            "sequence's weight; here padding adds nothing, so the two would differ)")
    require(config, config.clip_ratio_c > 0, "clip_ratio_c", "must be > 0")
    require(config, config.off_policy_mask_threshold is None or config.off_policy_mask_threshold > 0,
            "off_policy_mask_threshold", "must be > 0 (TRL's: a positive KL(alpha || pi) level, e.g. 0.5; at 0 or "
            "below, on-policy completions of negative advantage are dropped by rounding alone), or None: off")
    require(config, config.sapo_temperature_pos > 0, "sapo_temperature_pos", "SAPO's temperatures must be > 0")
    require(config, config.sapo_temperature_neg > 0, "sapo_temperature_neg", "SAPO's temperatures must be > 0")
    require(config, config.vespo_k_pos >= 0, "vespo_k_pos", "VESPO's powers k must be >= 0")
    require(config, config.vespo_k_neg >= 0, "vespo_k_neg", "VESPO's powers k must be >= 0")
    require(config, config.vespo_lambda_pos > 0, "vespo_lambda_pos", "VESPO's rates lambda must be > 0")
    require(config, config.vespo_lambda_neg > 0, "vespo_lambda_neg", "VESPO's rates lambda must be > 0")
    high = config.epsilon_high
    cispo = kind.objective == "cispo"
    require(config, high is None or (high > 0 if cispo else 0 <= high < 10), "epsilon_high",
            "with cispo, a cap on pi/pi_k: must be > 0 (0 would zero every gradient) or None for epsilon"
            if cispo else "must lie in [0, 10), or be None for epsilon")
    cap = config.epsilon if high is None else high
    if cispo and cap < 1:
        warnings.warn(f"loss_type cispo caps pi/pi_k at epsilon_high, a ratio: {cap} (epsilon_high "
                      f"{'None, so epsilon' if high is None else 'as given'}) is below 1, so every token's gradient is "
                      f"scaled by at most {cap} even at pi = pi_k (as TRL computes it); give a cap above 1, e.g. "
                      "epsilon_high 5", UserWarning, stacklevel=2)

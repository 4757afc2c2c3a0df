"""The loss types (TRL's ``loss_type``), one object per name, declared once: how a step's per-token losses are
normalised (a convention of the objective, beside ``core.ADVANTAGE_SCALES`` and ``corrections.REGISTRY``). The torch
weights of each normaliser are ``llm.tensors.loss.loss_weights``; the trainer's config takes ``loss_type``'s type from
``LossTypeName`` here, so the config and the loss read one declaration without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

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

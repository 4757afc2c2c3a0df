"""What every adapter of ``llm.integrations`` shares: the options, one optimiser step's completions as a host trainer
trained on them, the per-lag table, the declared reward range and its voiding, and the held-out set with its
certificate. Tensors in, this project's estimators (``llm.tensors.diagnostics``) out; nothing here knows a host.

The readings of one optimiser step k, from the completions its micro-batches trained on (docs/integrations.md):

- ``lag``: optimiser steps since the completions were generated (alpha = pi_{k - lag}); ``lag_max`` where a step mixes;
- ``tv/pi_k_alpha`` ± ``tv/pi_k_alpha_se``, ``ess/pi_k_alpha``, ``is_weight_seq/*``: ``clustered_metrics`` on the
  sequence log-weights log pi_k/alpha over the policy's tokens, labelled by prompt;
- ``tv/staleness``, ``tv/engine_mismatch``: where the host computed both the engine's log-probs and its own at the
  sampler's weights (TRL with vLLM), the split TV(pi_k, pi_gen) and TV(pi_gen, alpha);
- ``sampling/logp_diff_mean|max``: at lag 0 with the engine's log-probs, the engine against the trainer on the same
  tokens (``llm.tensors.sync_probe.sampler_gap``), with ``llm.train``'s warning (``llm.step.monitors.Warnings``);
- ``heldout/*``: with held-out prompts, ``llm.tensors.diagnostics.heldout_terms`` on completions drawn from alpha that
  never enter the loss.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

import grpo_theory.estimators as ge

from llm.config.fields import one_line, plain
from llm.config.ranges import FLOAT32_EDGE_RTOL, beyond_range, onto_range
from llm.tensors import diagnostics as dg
from llm.tensors import sync_probe


class WatchOptions(BaseModel):
    """The options of ``watch``, under this project's names (``llm.config``'s fields of the same names)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, arbitrary_types_allowed=True)

    reward_range: tuple[float, float] | None = None
    """The total reward's range [low, high], declared before the run (``--reward-range`` of ``llm.train``). Theorem
    1's terms rescale to it, and the certificate certifies only under it; a reward outside it (beyond float rounding)
    voids every certificate logged under it. None: the terms use the range seen so far and the certificate abstains
    (nan)."""
    heldout_prompts: int = 0
    """Extra prompts per generation, drawn from the training set with the watcher's own random stream, whose
    completions from the host's sampler never enter the loss: ``heldout/*`` (TV(pi_{k+1}, alpha), the improvement,
    Theorem 1's terms, the certificate). 0: no generation is added."""
    improvement_lcb_level: float = 0.95
    """Confidence level of ``heldout/improvement_lcb``, each step's certificate (``llm.train``'s option)."""
    improvement_lcb_method: ge.LcbMethod = ge.DEFAULT_LCB_METHOD
    """The certificate's bound: betting (a level for every distribution on the declared range), or t_unguaranteed,
    cantelli_unguaranteed (none)."""
    improvement_lcb_weight_cap: float = ge.IMPROVEMENT_WEIGHT_CAP
    """W: the betting certificate's estimate caps every importance weight at W (``llm.train``'s option)."""
    variance_eps: float = 1e-4
    """eps of sigma_{alpha,eps} = sqrt(Var r + eps) in Theorem 1's terms (``llm.train``'s option; the bound needs
    eps <= 3/4)."""
    engine_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The sampling engine's dtype, which decides the sync check's rule (``llm.tensors.sync_probe.SYNC_CHECKS``): auto
    reads it from the host's engine where it can (vLLM), else takes the trainer's."""
    seed: int | None = None
    """Seed of the watcher's own random stream (the held-out prompts and their sampling); None: the host's seed."""
    summary_file: str | None = "offpolicy_watch.json"
    """The per-lag table and the certificates' count, written at the end of training into the host's output
    directory (a relative name) or where given; None: printed only."""
    log: Callable[[str], Any] | None = None
    """Where the watcher's lines go (start, warnings, the summary); None: standard error."""

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, value):
        return plain(value)  # numpy's scalars as Python's (a config's numbers often are)

    @field_validator("reward_range", mode="before")
    @classmethod
    def _pair(cls, value):
        if value is None:
            return None
        if isinstance(value, np.ndarray) and value.ndim == 1:
            value = value.tolist()
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError(f"reward_range: must be two numbers (LOW, HIGH), got {value!r}")
        return tuple(float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value)

    @field_validator("improvement_lcb_level", "improvement_lcb_weight_cap", "variance_eps", mode="before")
    @classmethod
    def _number(cls, value):
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("improvement_lcb_method", mode="before")
    @classmethod
    def _method(cls, value):
        if not isinstance(value, str):
            return value
        try:
            return ge.lcb_method(value)
        except ValueError:
            raise ValueError(f"improvement_lcb_method: must be one of {', '.join(ge.LCB_METHODS)}, got {value!r}") from None

    @model_validator(mode="after")
    def _rules(self):
        if self.reward_range is not None:
            lo, hi = self.reward_range
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"reward_range: must be two finite numbers LOW < HIGH, got {self.reward_range}")
        if self.heldout_prompts < 0:
            raise ValueError(f"heldout_prompts: must be >= 0, got {self.heldout_prompts}")
        if not 0.5 <= self.improvement_lcb_level < 1:
            raise ValueError(f"improvement_lcb_level: must be in [0.5, 1), got {self.improvement_lcb_level}")
        if not self.improvement_lcb_weight_cap > 1:
            raise ValueError("improvement_lcb_weight_cap: must be > 1 (the capped estimates lie in [-1, W - 1]), got "
                             f"{self.improvement_lcb_weight_cap}")
        if not 0 < self.variance_eps <= 0.75:
            raise ValueError(f"variance_eps: must lie in (0, 0.75] (Theorem 1 needs eps <= 3/4), got {self.variance_eps}")
        return self


def watch_options(**options) -> WatchOptions:
    """``WatchOptions`` from keywords; a wrong name or value is one line (``TypeError``, ``ValueError``), never
    pydantic's box."""
    try:
        return WatchOptions(**options)
    except ValidationError as exc:
        raise one_line(exc, names=list(WatchOptions.model_fields)) from None


# ---- one optimiser step's completions ----------------------------------------------------------------------------

@dataclass
class MicroBatch:
    """Completions of one micro-batch as the host trained on them: per completion its lag, its prompt's label, log
    pi_k/alpha over the policy's tokens and (nan where unknown) log pi_gen/alpha; ``gap``: at lag 0 with the engine's
    log-probs, (the engine's, the trainer's, the policy mask) for the sync check."""

    lag: np.ndarray
    prompts: np.ndarray
    log_w_k: np.ndarray
    log_w_gen: np.ndarray | None = None
    gap: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def sequence_log_weights(logp_num: torch.Tensor, logp_den: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """log num(y)/den(y) of each completion over its policy tokens (``mask`` (B, T)): float64 (B,), the trainer's
    ``llm.tensors.diagnostics.sequence_log_ratio``."""
    B = logp_num.shape[0]
    return dg.sequence_log_ratio(logp_num.float(), logp_den.float(), mask.float(), B, 1).reshape(-1)


def _cat_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p.float().cpu(), (0, width - p.shape[1])) for p in parts])


def step_metrics(parts: list[MicroBatch]) -> tuple[dict[str, float], dict[int, dict]]:
    """The readings of one optimiser step from its micro-batches (module docstring), and per lag present the
    per-prompt values the run's table pools (``LagTable``)."""
    lag = np.concatenate([p.lag for p in parts])
    prompts = np.concatenate([p.prompts for p in parts])
    log_w_k = np.concatenate([p.log_w_k for p in parts])
    known = [p.log_w_gen if p.log_w_gen is not None else np.full(p.lag.shape, np.nan) for p in parts]
    log_w_gen = np.concatenate(known) if any(p.log_w_gen is not None for p in parts) else None
    row = {"lag": float(lag.mean()) if lag.size else float("nan")}
    if lag.size and lag.min() != lag.max():
        row["lag_max"] = float(lag.max())
    row.update(dg.clustered_metrics(log_w_k, prompts, log_w_gen))
    gaps = [p.gap for p in parts if p.gap is not None]
    if gaps:
        row.update(sync_probe.sampler_gap(*(_cat_padded([g[i] for g in gaps]) for i in range(3))))
    by_lag = {}
    for value in np.unique(lag):
        on = lag == value
        by_lag[int(value)] = {
            "metrics": dg.clustered_metrics(log_w_k[on], prompts[on], None if log_w_gen is None else log_w_gen[on]),
            "completions": int(on.sum())}
    return row, by_lag


class LagTable:
    """The run's readings by lag (the summary's table): per lag, the steps and completions seen, the mean over those
    steps of TV(pi_k, alpha) with the standard error of that mean over the steps (each step's a draw), the effective
    sample size, and where known the staleness and the engine's mismatch. martingale's per-lag split, with TV."""

    COLUMNS = ("tv/pi_k_alpha", "ess/pi_k_alpha", "tv/staleness", "tv/engine_mismatch")

    def __init__(self):
        self.values: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.completions: dict[int, int] = defaultdict(int)

    def add(self, by_lag: dict[int, dict]) -> None:
        for lag, entry in by_lag.items():
            self.completions[lag] += entry["completions"]
            for key in self.COLUMNS:
                value = entry["metrics"].get(key)
                if value is not None and math.isfinite(value):
                    self.values[lag][key].append(value)

    def rows(self) -> list[dict]:
        out = []
        for lag in sorted(self.values):
            v = self.values[lag]
            row = {"lag": lag, "steps": len(v["tv/pi_k_alpha"]), "completions": self.completions[lag]}
            for key in self.COLUMNS:
                if v[key]:
                    row[key], row[f"{key}_se"] = ge.mean_and_standard_error(v[key])
            out.append(row)
        return out

    def markdown(self) -> str:
        fmt = lambda row, key: (f"{row[key]:.4f}" + (f" ± {row[key + '_se']:.4f}"  # noqa: E731
                                                     if math.isfinite(row.get(key + "_se", math.nan)) else "")
                                ) if key in row else "-"
        lines = ["| lag | steps | completions | TV(pi_k, alpha) | ESS | staleness TV(pi_k, pi_gen) | "
                 "engine mismatch TV(pi_gen, alpha) |", "|---|---|---|---|---|---|---|"]
        for row in self.rows():
            lines.append(f"| {row['lag']} | {row['steps']} | {row['completions']} | " +
                         " | ".join(fmt(row, k) for k in self.COLUMNS) + " |")
        return "\n".join(lines)


# ---- the declared range and the certificates under it ----------------------------------------------------------

class RangeWatch:
    """The reward range Theorem 1's terms and the certificate read (``llm.step.monitors.DeclaredRange``'s rules, for a
    trainer the watcher does not stop): ``declared``, fixed before the run, or None (the range seen so far, no
    guarantee: the certificate abstains). A reward within float rounding of a declared edge is that edge (``rtol``:
    ``llm.config.ranges.FLOAT32_EDGE_RTOL``, as host trainers add rewards up in float32; counted in ``rounded``). A reward beyond it voids the declaration: every
    certificate logged under it (``certified``: the steps whose certificate was positive) is void, and the
    certificate abstains from then on (``void_step``, ``void_line``)."""

    def __init__(self, declared: tuple[float, float] | None, rtol: float = FLOAT32_EDGE_RTOL):
        self.declared = None if declared is None else dg.RewardRange(*declared)
        self.rtol = rtol
        self.seen = self.declared or dg.UNIT_RANGE
        self.rounded = 0
        self.void_step: int | None = None
        self.void_line = ""
        self.certified: list[int] = []
        self.logged = 0

    @property
    def range(self) -> dg.RewardRange:
        return self.seen

    @property
    def certifies(self) -> bool:
        return self.declared is not None and self.void_step is None

    def see(self, step: int, what: str, rewards) -> tuple[np.ndarray, str | None]:
        """Rewards as the terms read them (rounding at an edge removed), and a line to say when this call voided the
        declaration (None otherwise). Undeclared, or once void: the range widens to hold them (no guarantee)."""
        r = np.asarray(rewards, dtype=np.float64)
        finite = r[np.isfinite(r)]
        line = None
        if self.declared is not None and self.void_step is None:
            lo, hi = self.declared.lo, self.declared.hi
            beyond = beyond_range(finite, lo, hi, self.rtol)
            if not beyond.any():
                kept, moved = onto_range(r, lo, hi)
                self.rounded += moved
                return kept, None
            bad = float(finite[np.flatnonzero(beyond)[0]])
            self.void_step = step
            certified = ", ".join(map(str, self.certified)) or "none"
            line = self.void_line = (
                f"step {step}: a {what} reward {bad!r} lies outside the declared range [{lo:g}, {hi:g}] "
                f"({int(beyond.sum())} such): the declaration was wrong, so every certificate logged under it is void "
                f"(steps certified: {certified}); from here on Theorem 1's terms use the range seen (no guarantee) and "
                "the certificate abstains; training goes on")
        if finite.size:
            self.seen = self.seen.widened(finite)
        return r, line

    def record(self, step: int, lcb: float) -> None:
        self.logged += 1
        if self.certifies and math.isfinite(lcb) and lcb > 0:
            self.certified.append(step)

    def summary(self) -> dict:
        return {"declared": None if self.declared is None else [self.declared.lo, self.declared.hi],
                "steps_logged": self.logged, "steps_certified": 0 if self.void_step is not None else len(self.certified),
                "void_from_step": self.void_step, "void_certificates": len(self.certified) if self.void_step is not None
                else 0, "rewards_rounded_to_an_edge": self.rounded}


# ---- the held-out set ------------------------------------------------------------------------------------------

@dataclass
class HeldoutSet:
    """Held-out completions drawn from alpha at generation ``step``: rewards (P, G) (groups with a reward nobody
    scored dropped: ``dropped``), the forward's inputs, the policy mask and log alpha (the sampler's own:
    ``alpha_from_sampler``), and log pi_k at the current weights (the next step's start)."""

    step: int
    rewards: np.ndarray
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    logp_alpha: torch.Tensor
    logp_k: torch.Tensor
    alpha_from_sampler: bool = True
    dropped: int = 0
    extra: dict = field(default_factory=dict)


def heldout_metrics(held: HeldoutSet, logp_new: torch.Tensor, options: WatchOptions, ranges: RangeWatch
                    ) -> dict[str, float]:
    """``heldout/*`` of a step from its held-out set and log pi_{k+1}: ``llm.tensors.diagnostics.heldout_terms``, the
    function ``llm.train`` logs with; the certificate only under a declaration still standing and alpha's own
    log-probs."""
    est, _ = dg.heldout_terms(held.rewards, held.logp_alpha.float(), held.logp_k.float(), logp_new.float(),
                              held.mask.float(), options.variance_eps, ranges.range,
                              lcb_level=options.improvement_lcb_level, lcb_method=options.improvement_lcb_method,
                              lcb_cap=options.improvement_lcb_weight_cap,
                              certify=ranges.certifies and held.alpha_from_sampler)
    return dg.prefixed("heldout", est)

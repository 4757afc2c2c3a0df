"""When alpha <- pi_theta: a fixed period v, or when the measured divergence says so (docs/theory.md, §7.1).

Theorem 1's lag penalty is c TV(pi_k, alpha): what staleness costs the guarantee is the divergence between the
trainer's policy and the sampler's, not the number of steps between them. ``SyncPolicy.decide`` is the one rule
both halves use: the bandit simulator passes the exact TV(pi_k, alpha), the language-model trainer an unbiased
estimate of it measured before the step's update (held-out prompts).

- ``fixed``: sync every ``period`` = v steps (step % v == 0), Algorithm 1 as the paper states it.
- ``divergence``: sync when the TV estimate exceeds ``tv_budget``, or when the lag would exceed ``max_lag``.
  With ``tv_budget`` = inf and ``max_lag`` = v - 1 it syncs every v steps: ``fixed`` is its special case.

Step 0 never syncs (the sampler starts with the initial weights). ``decide`` returns the reason of a sync, or
"" for none; the reasons are the values of the logged ``sync/reason``.

With asynchronous generation the sampler generates step k + 1's samples while step k trains, so the sync decided at
step k serves step k + 1, whose TV is not measured yet. ``decide_ahead`` bounds it by the triangle inequality,
TV(pi_{k+1}, W) <= TV(pi_k, W) + TV(pi_{k+1}, pi_k) for the weights W the sampler holds, with the next step's drift
TV(pi_{k+1}, pi_k) taken to be the last one measured (``projected_tv``): the policy keeps W while that projection is
within the budget and the lag step k + 1 would have within ``max_lag`` (docs/theory.md, §7.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: ``sync/reason`` values: no sync, a fixed period's sync, a TV estimate over its budget, the lag cap.
NO_SYNC, PERIOD, BUDGET, MAX_LAG = "", "period", "budget", "max_lag"


@dataclass(frozen=True)
class SyncPolicy:
    """``kind`` fixed: every ``period`` steps; divergence: TV estimate > ``tv_budget`` or lag > ``max_lag``."""

    kind: Literal["fixed", "divergence"] = "fixed"
    period: int = 1
    tv_budget: float = math.inf
    max_lag: int = 8

    def __post_init__(self):
        if self.kind not in ("fixed", "divergence"):
            raise ValueError(f"sync_policy: expected fixed or divergence, got {self.kind!r}")
        if self.period < 1:
            raise ValueError(f"sync_period: v must be >= 1, got {self.period}")
        if not self.tv_budget >= 0:  # also refuses NaN
            raise ValueError(f"tv_budget: must be >= 0 (a TV distance lies in [0, 1]), got {self.tv_budget}")
        if self.max_lag < 0:
            raise ValueError(f"max_lag: must be >= 0, got {self.max_lag}")

    def decide(self, step: int, last_sync: int, tv_estimate: float = math.nan) -> str:
        """The reason to sync at the start of ``step`` (before its rollout), or "" to keep alpha, whose weights are
        those of step ``last_sync``. ``tv_estimate``: TV(pi_step, alpha) measured before the step (NaN: none yet,
        which never triggers the budget)."""
        if step <= 0:
            return NO_SYNC
        if self.kind == "fixed":
            return PERIOD if step % self.period == 0 else NO_SYNC
        if step - last_sync > self.max_lag:
            return MAX_LAG
        if tv_estimate > self.tv_budget:  # False for NaN
            return BUDGET
        return NO_SYNC

    def decide_ahead(self, step: int, served_step: int, projected: float = math.nan) -> str:
        """Asynchronous generation: the reason to sync pi_step into the sampler before it generates step + 1's
        samples, or "" to keep the weights of step ``served_step`` it holds. ``projected``: TV(pi_{step+1}, those
        weights) as ``projected_tv`` bounds it (NaN: no estimate yet, which never triggers the budget). Step 0 never
        syncs (the sampler holds pi_0 already)."""
        if step <= 0:
            return NO_SYNC
        if self.kind == "fixed":
            return PERIOD if step % self.period == 0 else NO_SYNC
        return self.decide(step + 1, served_step, projected)

    @property
    def adaptive(self) -> bool:
        """True when a sync depends on measured divergence (the trainer then needs an estimate every step)."""
        return self.kind == "divergence"


def projected_tv(tv_served: float, drift: float) -> float:
    """TV(pi_{k+1}, W) <= TV(pi_k, W) + TV(pi_{k+1}, pi_k): the triangle inequality's bound on the TV the next step
    would train at if the sampler keeps the weights W, with ``tv_served`` = TV(pi_k, W) and ``drift`` the next step's
    TV(pi_{k+1}, pi_k) (in practice the last step's, measured). Exact as a bound when ``drift`` is; NaN in either
    leaves it NaN (no budget sync)."""
    return tv_served + drift

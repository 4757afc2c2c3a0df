"""The monitors of one step (``llm.step.step.run_step``): the phase timer, the exact J, the reward range of Theorem
1's terms, and the warnings about the step's estimates. The run's own output (run directory, trackers, callbacks) is
``llm.run.monitors``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import numpy as np

from llm.core import diagnostics as dg
from llm.core.diagnostics import SYNC_CHECKS
from llm.core.metrics import PHASES
from llm.core.token_filter import NO_FILTER, TokenFilter
from llm.evaluation import mean_exact_j
from llm.models.model import Precision
from llm.tasks import TokenizedTask


class PhaseTimer:
    """Wall-clock seconds of each phase of a step, as ``time/<phase>`` metrics."""

    def __init__(self, phases: Sequence[str] = PHASES):
        self.seconds: dict[str, float] = {f"time/{p}": 0.0 for p in phases}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{phase}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0


class ExactJ:
    """Exact J(pi) over the training prompts (tasks with a finite set of accepted completions): J(pi_k) at the
    start of a step is J(pi_{k+1}) of the previous one (the same weights), so each step costs one forward pass.
    ``enabled`` is false where nothing is measured (the option off, a task without it, a rank that does not join)."""

    def __init__(self, enabled: bool, policy, task: TokenizedTask, temperature: float, pad: int,
                 precision: Precision, token_filter: TokenFilter = NO_FILTER):
        self.enabled = enabled and task.task.has_exact_j
        self.policy, self.task, self.temperature, self.pad, self.precision = policy, task, temperature, pad, precision
        self.token_filter = token_filter
        self._current: float | None = None

    def _measure(self) -> float:
        return mean_exact_j(self.policy, self.task, self.temperature, self.pad, self.precision,
                            token_filter=self.token_filter)

    def before_update(self) -> None:
        if self.enabled and self._current is None:
            self._current = self._measure()

    def after_update(self) -> dict[str, float]:
        """``j/pi_k``, ``j/pi_new`` and the exact ``improvement`` J(pi_{k+1}) - J(pi_k)."""
        if not self.enabled:
            return {}
        j_k, self._current = self._current, self._measure()
        return {"j/pi_k": j_k, "j/pi_new": self._current, "improvement": self._current - j_k}


class RangeTracker:
    """The reward range of Theorem 1's terms for a task scored by reward functions (any finite rewards): [0, 1]
    widened to every training and held-out reward seen, logged as ``bound/reward_lo|hi``; the first widening is
    announced. A resumed run starts from the range of the steps it keeps. Other tasks' rewards lie in [0, 1]."""

    def __init__(self, active: bool, kept_rows: list[dict], log):
        self.active, self.range = active, dg.UNIT_RANGE
        kept = [r for r in kept_rows if "bound/reward_lo" in r] if active else []
        if kept:
            self.range = dg.RewardRange(min(r["bound/reward_lo"] for r in kept), max(r["bound/reward_hi"] for r in kept))
        if self.range != dg.UNIT_RANGE:
            log(f"rewards outside [0, 1] in the steps kept: Theorem 1's terms continue with their range "
                f"[{self.range.lo:.4g}, {self.range.hi:.4g}], widened as new rewards are seen")

    def see(self, step: int, rewards: np.ndarray, heldout_rewards: np.ndarray | None, row: dict,
            write) -> dg.RewardRange:
        if not self.active:
            return self.range
        wider = self.range.widened(rewards).widened(rewards if heldout_rewards is None else heldout_rewards)
        if self.range == dg.UNIT_RANGE and wider != self.range:
            write(f"step {step}: rewards outside [0, 1] (seen so far: [{wider.lo:.4g}, {wider.hi:.4g}]): Theorem 1's "
                  "terms are from now on computed for the rewards rescaled from [0, 1] widened to every reward seen "
                  "(bound/reward_lo|hi), in units of the reward; they hold only if no reward lies outside that range")
        self.range = wider
        row["bound/reward_lo"], row["bound/reward_hi"] = wider.lo, wider.hi
        return wider


#: Warn when the importance weights' effective sample size falls below this fraction of the completions.
ESS_WARN_FRACTION = 0.1


class Warnings:
    """The run's warnings about its estimates: a sampler that disagrees with the trainer right after a sync (a
    stale engine: every time), and an effective sample size of the importance weights below ``ESS_WARN_FRACTION``
    of the completions (said once, again only after it has recovered)."""

    def __init__(self, dtype: str):
        self.check = SYNC_CHECKS[dtype]
        self.floor: float | None = None  # the first synced step's gap: the rounding floor (``SyncCheck``)
        self.low_ess = False

    def see(self, row: dict, synced: bool, write) -> None:
        if synced and self.floor is None and row.get(self.check.metric) is not None and self.check.floor_factor:
            self.floor = row[self.check.metric]
        gap = self.check.stale(row, self.floor)
        if synced and gap is not None:
            how = "by up to" if self.check.metric.endswith("_max") else "on average by"
            write(f"WARNING step {row['step']}: sampler and trainer log-probs differ {how} {gap:.2e} right after "
                  f"a weight sync (> {self.check.threshold(self.floor):.3g}, {self.check.metric}): the sampler may "
                  "hold stale weights")
        low = {k: v for k, v in row.items() if "ess/" in k and not k.endswith("_se") and v < ESS_WARN_FRACTION}
        if low and not self.low_ess:
            worst = min(low, key=low.get)
            write(f"WARNING step {row['step']}: the importance weights' effective sample size is {low[worst]:.1%} of "
                  f"the completions ({worst}): TV, improvement and bound estimates rest on a few completions "
                  "(their *_se say how much); a lower learning rate or v keeps the policies closer")
        self.low_ess = bool(low)

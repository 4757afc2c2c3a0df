"""The monitors of one step (``llm.step.step.run_step``): the phase timer, the exact J, the declared reward range of
Theorem 1's terms and the certificates, and the warnings about the step's estimates. The run's own output (run directory, trackers, callbacks) is
``llm.run.output``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import numpy as np

from runkit.cli import RunError

from llm.config.ranges import beyond_range, onto_range
from llm.tensors import diagnostics as dg
from llm.tensors.sync_probe import sync_check
from llm.tensors.metrics import PHASES
from llm.tensors.token_filter import NO_FILTER, TokenFilter
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
    ``enabled`` is false where nothing is measured (the option off, a task without it, a rank that does not join).
    With ``every`` N > 1 only the steps k with k % N == 0 and the ``last`` step are measured (two passes each where
    the step before was not)."""

    def __init__(self, enabled: bool, policy, task: TokenizedTask, temperature: float, pad: int,
                 precision: Precision, token_filter: TokenFilter = NO_FILTER, every: int = 1, last: int = -1):
        self.enabled = enabled and task.task.has_exact_j
        self.policy, self.task, self.temperature, self.pad, self.precision = policy, task, temperature, pad, precision
        self.token_filter, self.every, self.last = token_filter, every, last
        self._current: float | None = None

    def _measure(self) -> float:
        return mean_exact_j(self.policy, self.task, self.temperature, self.pad, self.precision,
                            token_filter=self.token_filter)

    def measures(self, step: int) -> bool:
        return self.enabled and (step % self.every == 0 or step == self.last)

    def before_update(self, step: int) -> None:
        if self.measures(step) and self._current is None:
            self._current = self._measure()

    def after_update(self, step: int) -> dict[str, float]:
        """``j/pi_k``, ``j/pi_new`` and the exact ``improvement`` J(pi_{k+1}) - J(pi_k) at a measured step."""
        if not self.measures(step):
            self._current = None  # the update moved the weights: the last J measured is no longer pi's
            return {}
        j_k, self._current = self._current, self._measure()
        return {"j/pi_k": j_k, "j/pi_new": self._current, "improvement": self._current - j_k}


class DeclaredRange:
    """The reward range of Theorem 1's terms and of the certificates (``llm.config.ranges``): ``declared`` (lo, hi),
    fixed before step 0, or None. Declared: every training, held-out and test reward is checked against it, and one
    outside stops the run at that step in one line (its rows and its last checkpoint kept: a reward outside the range
    voids every bound computed from it); the certificates certify. Undeclared: the terms use [0, 1] widened to the
    rewards seen so far, flagged ``bound/range_declared`` 0 (no guarantee), and the certificates abstain (nan). Each
    row logs the range used (``bound/reward_lo|hi``). A resumed run without a declaration starts from the range of
    the steps it keeps."""

    def __init__(self, declared: tuple[float, float] | None, kept_rows: list[dict], log):
        self.declared = None if declared is None else dg.RewardRange(*map(float, declared))
        self.range = self.declared or dg.UNIT_RANGE
        kept = [r for r in kept_rows if "bound/reward_lo" in r] if self.declared is None else []
        if kept:
            self.range = dg.RewardRange(min(r["bound/reward_lo"] for r in kept), max(r["bound/reward_hi"] for r in kept))
        if self.declared is None and self.range != dg.UNIT_RANGE:
            log(f"rewards outside [0, 1] in the steps kept: with no declared range, Theorem 1's terms continue with the "
                f"range seen, [{self.range.lo:.4g}, {self.range.hi:.4g}] (no guarantee)")

    @property
    def declared_pair(self) -> tuple[float, float] | None:
        return None if self.declared is None else (self.declared.lo, self.declared.hi)

    @property
    def certifies(self) -> bool:
        """Whether the certificates may certify: only under a declared range."""
        return self.declared is not None

    def start_lines(self, why: str) -> list[str]:
        """What the run says of its range at start-up (``why``: where a declared range comes from)."""
        if self.declared is not None:
            return [f"reward range: [{self.declared.lo:g}, {self.declared.hi:g}] ({why}): Theorem 1's terms and the "
                    "certificates read it; a reward outside it stops the run"]
        return ["reward range: not declared (reward functions with TRL's signature, reward models and environments "
                "declare none): Theorem 1's terms use the range seen so far, with no guarantee, and the certificates "
                "abstain (nan); declare it with --reward-range LOW HIGH"]

    def see(self, step: int, rewards: np.ndarray, heldout_rewards: np.ndarray | None, row: dict, write,
            parts: dict | None = None, texts: list[str] | None = None) -> dg.RewardRange:
        """Check (declared) or widen by (undeclared) a step's training and held-out rewards; log the range used.
        Declared: a reward within float rounding of an edge is set to it, in place (``bound/rewards_rounded`` counts
        them), so every term reads rewards in the range."""
        if self.declared is not None:
            rounded = self.check(step, "training", rewards, parts, texts)
            if heldout_rewards is not None:
                rounded += self.check(step, "held-out", heldout_rewards)
            row["bound/rewards_rounded"] = float(rounded)
        else:
            wider = self.range.widened(rewards)
            wider = wider if heldout_rewards is None else wider.widened(heldout_rewards)
            if self.range == dg.UNIT_RANGE and wider != self.range:
                write(f"step {step}: rewards outside [0, 1] (seen so far: [{wider.lo:.4g}, {wider.hi:.4g}]): with no "
                      "declared range, Theorem 1's terms are computed for the range seen so far (no guarantee); "
                      "declare it with --reward-range LOW HIGH")
            self.range = wider
        row["bound/reward_lo"], row["bound/reward_hi"] = self.range.lo, self.range.hi
        row["bound/range_declared"] = float(self.declared is not None)
        return self.range

    def check(self, step: int, what: str, rewards, parts: dict | None = None, texts: list[str] | None = None) -> int:
        """Stop the run, in one line, at a reward outside the declared range by more than float rounding
        (``llm.config.ranges.beyond_range``: 0.1 + 0.2 under [0, 0.3] is 0.3); set the rewards within rounding of an
        edge to it, in place where ``rewards`` is a float64 array, and return how many were. The line shows the value
        with every digit (``repr``), so that 1.0000000000000002 is not printed as 1."""
        if self.declared is None:
            return 0
        lo, hi = self.declared.lo, self.declared.hi
        r = np.asarray(rewards, dtype=np.float64)
        flat = r.reshape(-1)
        outside = np.flatnonzero(beyond_range(flat, lo, hi))
        if outside.size:
            j = int(outside[0])
            sources = ", ".join(f"{name} {float(np.asarray(v).reshape(-1)[j])!r}" for name, v in (parts or {}).items())
            where = f" (sources: {sources})" if sources else ""
            shown = f" of completion {texts[j][:120]!r}" if texts else ""
            raise RangeViolation(
                f"reward_range: step {step}: a {what} reward {float(flat[j])!r}{shown}{where} lies outside the declared "
                f"range [{lo:g}, {hi:g}] ({outside.size} such); a reward outside the range voids every bound computed "
                "from it, so the run stops here (its rows and its last checkpoint kept; the certificates it logged "
                "are void: a last row of metrics.jsonl says so); declare a range that holds every reward with "
                "--reward-range LOW HIGH", step)
        clipped, moved = onto_range(flat, lo, hi)
        if moved and isinstance(rewards, np.ndarray) and rewards.dtype == np.float64:
            np.copyto(rewards, clipped.reshape(rewards.shape))
        return moved


class RangeViolation(RunError):
    """A reward outside the declared range: the run stops, and every certificate it logged is void (its ``step``)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


#: Warn when the importance weights' effective sample size falls below this fraction of the completions.
ESS_WARN_FRACTION = 0.1
#: Warn when the estimated TV(pi_k, alpha) reaches this: Theorem 1's lag penalty, 2 TV(pi_k, alpha), is then 1 or more,
#: all that a reward in [0, 1] can change, so no bound holds; and the Kish ESS, which is blind to the weights' scale,
#: can still look fine where every weight is near 0 (a policy that has left the sampler's completions behind).
TV_WARN = 0.5


class Warnings:
    """The run's warnings about its estimates: a sampler that disagrees with the trainer right after a sync (a
    stale engine: every time), an effective sample size of the importance weights below ``ESS_WARN_FRACTION`` of the
    completions, and a TV(pi_k, alpha) of ``TV_WARN`` or more (each said once, again only after it has recovered)."""

    def __init__(self, dtype: str, temperature: float = 1.0):
        self.check = sync_check(dtype, temperature)
        self.floor: float | None = None  # the first synced step's gap: the rounding floor (``SyncCheck``)
        self.low_ess = False
        self.far = False

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
        tv = row.get("tv/pi_k_alpha")
        far = tv is not None and tv >= TV_WARN
        if far and not self.far:
            mass = row.get("is_weight_seq/mean")
            write(f"WARNING step {row['step']}: TV(pi_k, alpha) is {tv:.3g} (tv/pi_k_alpha): the policy trained has moved "
                  "far from the one that sampled its completions, so Theorem 1's lag penalty alone, 2 TV, is 1 or more "
                  "and no bound holds" + (f", and pi_k keeps {mass:.2g} of its mass on what alpha draws "
                                          "(is_weight_seq/mean)" if mass is not None else "") +
                  "; a lower learning rate, fewer iterations per batch or a shorter lag keeps them close")
        self.far = far

"""The sync clock of Algorithm 1: which weights alpha holds at each step (docs/theory.md, §7).

Every v = ``sync_period`` steps the trainer's weights go into the sampler: the steps k with k % v == 0 start a *window*
and sync at its first step. Synchronously each window is generated from the weights synced at its first step, so
alpha = pi_{k - lag} with lag = k mod v. With asynchronous generation each window is generated while the previous
one trains, from the weights synced one window earlier (the initial ones for the first two windows): lag runs
v .. 2v - 1 after the first window. ``SyncClock.at`` says all of it for one step, once.

With the divergence policy (``--sync-policy divergence``, ``grpo_theory.sync_policy``) a window ends when the
held-out estimate of TV(pi_k, alpha) measured before the step exceeds the budget, or the lag its cap: the clock
then remembers the last sync (``observe`` hands it each step's row; ``state``/``restore`` carry it through a
checkpoint) and a window is however many steps the policy let it run. With asynchronous generation too the sampler
runs one step ahead: step k + 1's completions are generated, while step k trains, from the weights the sampler holds
after step k's decision, so the decision bounds step k + 1's TV by the triangle inequality (``grpo_theory.sync_policy
.projected_tv``): TV(pi_k, W) for the weights W it holds, plus the last measured one-step drift TV(pi_k, pi_{k-1})
(``heldout/tv/pi_new_pi_k``). TV(pi_k, W) is the last step's ``heldout/tv/pi_new_alpha`` when W generated that step,
the drift itself when W are pi_{k-1} (synced at the last step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpo_theory.sync_policy import NO_SYNC, PERIOD, SyncPolicy, projected_tv

#: The row key whose value at step k - 1 estimates TV(pi_k, alpha) for the divergence policy at step k, and its SE.
TV_KEY, TV_SE_KEY = "heldout/tv/pi_new_alpha", "heldout/tv/pi_new_alpha_se"
#: The row key whose value at step k - 1 estimates the drift TV(pi_k, pi_{k-1}), and its SE (asynchronous divergence).
DRIFT_KEY, DRIFT_SE_KEY = "heldout/tv/pi_new_pi_k", "heldout/tv/pi_new_pi_k_se"


@dataclass(frozen=True)
class Tick:
    """One step on the clock: ``lag`` (steps since the weights that generated its completions were the policy),
    ``starts_window`` (the step syncs, except step 0, whose sampler holds the initial weights), ``window_start``
    (the window's first step) and ``next_window`` (the first step of the window after it)."""

    step: int
    lag: int
    starts_window: bool
    window_start: int
    next_window: int
    reason: str = NO_SYNC
    """``sync/reason``: why the step syncs ("period", "budget", "max_lag"), "" when it does not."""
    ahead: bool = False
    """Divergence policy with asynchronous generation: the step's sync serves the next step (the sampler runs one step
    ahead), and ``starts_window`` marks the first step served by newly synced weights (lag 1) instead."""

    @property
    def syncs(self) -> bool:
        """Whether the trainer's weights go into the sampler at this step: at a window's first step (step 0 excepted:
        the sampler starts with the initial weights); one step ahead, whenever the policy says so."""
        return bool(self.reason) if self.ahead else self.starts_window and self.step > 0


@dataclass
class SyncClock:
    """v = ``v`` and, with ``asynchronous``, windows generated one window ahead; ``policy`` divergence: windows
    that end when the TV estimate says so."""

    v: int
    asynchronous: bool = False
    policy: SyncPolicy = field(default_factory=SyncPolicy)
    last_sync: int = 0
    """Divergence policy: the step whose weights alpha holds."""
    tv_estimate: tuple[float, float] = (math.nan, math.nan)
    """Divergence policy: the last step's estimate of TV(pi_{k+1}, alpha) and its standard error."""
    drift: tuple[float, float] = (math.nan, math.nan)
    """Divergence policy: the last step's estimate of TV(pi_{k+1}, pi_k) and its standard error."""
    decided: tuple[float, float] = (math.nan, math.nan)
    """Divergence policy: the TV estimate (and its SE) the last decision used: TV(pi_k, alpha) synchronously, the
    projected TV(pi_{k+1}, alpha) one step ahead."""

    @classmethod
    def from_config(cls, sync) -> "SyncClock":
        """The clock of a ``SyncConfig`` (``config.sync``)."""
        return cls(sync.sync_period, sync.async_generation,
                   SyncPolicy(sync.sync_policy, sync.sync_period, sync.tv_budget, sync.max_lag))

    @property
    def adaptive(self) -> bool:
        return self.policy.adaptive

    def window_start(self, step: int) -> int:
        """The first step of the window ``step`` lies in."""
        return step - step % self.v

    def weights_step(self, step: int) -> int:
        """The step whose policy the sampler held when it generated ``step``'s completions (alpha =
        pi_{weights_step}): the window's first step, or asynchronously the previous window's (0 for the first two)."""
        w0 = self.window_start(step)
        return max(w0 - self.v, 0) if self.asynchronous else w0

    def at(self, step: int) -> Tick:
        """The step's tick. Divergence policy: decides the sync from the estimate ``observe`` was last handed, and
        moves the clock (call it once per step, in order)."""
        if not self.adaptive:
            w0 = self.window_start(step)
            return Tick(step, step - self.weights_step(step), step == w0, w0, w0 + self.v,
                        PERIOD if step == w0 and step > 0 else NO_SYNC)
        if self.asynchronous:
            return self._ahead(step)
        self.decided = self.tv_estimate
        reason = self.policy.decide(step, self.last_sync, self.tv_estimate[0])
        if reason:
            self.last_sync = step
        return Tick(step, step - self.last_sync, bool(reason) or step == 0, self.last_sync, step + 1, reason)

    def _ahead(self, step: int) -> Tick:
        """Divergence policy, asynchronous: the step's completions came from the weights of step ``last_sync`` (lag
        = step - last_sync); decide whether pi_step replaces them for step + 1's generation."""
        lag = step - self.last_sync
        # TV(pi_k, W): the drift when W = pi_{k-1} (synced at the last step), else the last step's TV(pi_k, alpha)
        served = self.drift if lag == 1 else self.tv_estimate
        self.decided = (projected_tv(served[0], self.drift[0]), served[1] + self.drift[1])  # sd(X + Y) <= sd X + sd Y
        reason = self.policy.decide_ahead(step, self.last_sync, self.decided[0])
        if reason:
            self.last_sync = step
        return Tick(step, lag, lag <= 1, step - lag, step + 1, reason, ahead=True)

    def observe(self, row: dict) -> None:
        """Take the step's held-out TV(pi_{k+1}, alpha) estimate: the next step's TV(pi_k, alpha) while alpha is
        kept (a step that logged none leaves NaN: no budget sync until one is measured)."""
        self.tv_estimate = (float(row.get(TV_KEY, math.nan)), float(row.get(TV_SE_KEY, math.nan)))
        self.drift = (float(row.get(DRIFT_KEY, math.nan)), float(row.get(DRIFT_SE_KEY, math.nan)))

    def metrics(self, tick: Tick) -> dict:
        """``sync/reason`` (a string), ``sync/tv_estimate`` and ``sync/tv_estimate_se`` (divergence policy: the estimate
        the decision used; one step ahead the projected TV of the next step, its SE the sum of its two parts')."""
        out: dict = {"sync/reason": tick.reason}
        if self.adaptive and not math.isnan(self.decided[0]):  # none before the first estimate
            out.update({"sync/tv_estimate": self.decided[0], "sync/tv_estimate_se": self.decided[1]})
        return out

    def state(self) -> dict:
        return {"last_sync": self.last_sync, "tv_estimate": list(self.tv_estimate), "drift": list(self.drift)}

    def restore(self, state: dict | None) -> None:
        if state:
            self.last_sync, self.tv_estimate = int(state["last_sync"]), tuple(state["tv_estimate"])
            self.drift = tuple(state.get("drift", (math.nan, math.nan)))

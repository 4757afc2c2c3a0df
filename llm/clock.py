"""The sync clock of Algorithm 1: which weights alpha holds at each step (docs/theory.md, §7).

Every v = ``sync_period`` steps the trainer's weights go into the sampler: the steps k with k % v == 0 start a *window*
and sync at its first step. Synchronously each window is generated from the weights synced at its first step, so
alpha = pi_{k - lag} with lag = k mod v. With asynchronous generation each window is generated while the previous
one trains, from the weights synced one window earlier (the initial ones for the first two windows): lag runs
v .. 2v - 1 after the first window. ``SyncClock.at`` says all of it for one step, once.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def syncs(self) -> bool:
        """At a window's first step, sync (step 0 excepted: the sampler starts with the initial weights)."""
        return self.starts_window and self.step > 0


@dataclass(frozen=True)
class SyncClock:
    """v = ``v`` and, with ``asynchronous``, windows generated one window ahead."""

    v: int
    asynchronous: bool = False

    @classmethod
    def from_config(cls, config) -> "SyncClock":
        return cls(config.sync_period, config.async_generation)

    def window_start(self, step: int) -> int:
        """The first step of the window ``step`` lies in."""
        return step - step % self.v

    def weights_step(self, step: int) -> int:
        """The step whose policy the sampler held when it generated ``step``'s completions (alpha =
        pi_{weights_step}): the window's first step, or asynchronously the previous window's (0 for the first two)."""
        w0 = self.window_start(step)
        return max(w0 - self.v, 0) if self.asynchronous else w0

    def at(self, step: int) -> Tick:
        w0 = self.window_start(step)
        return Tick(step, step - self.weights_step(step), step == w0, w0, w0 + self.v)

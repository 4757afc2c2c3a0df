"""The reward range a run's guarantees read: declared before the first step, never taken from the rewards seen.

Theorem 1, its estimates and the certificates hold for rewards in a range [lo, hi] known in advance (through
r' = (r - lo)/(hi - lo) in [0, 1]); a range read off the data is not one (docs/theory.md, §8.6: a step that moves
mass onto a reward not yet sampled is certified on 78% of draws). The range comes from, in order:

- ``--reward-range LOW HIGH``, the user's declaration of the total reward;
- else the sources' own ranges, when every source has one (``llm.rewards.sources_range``): the task's own reward and
  every text reward (``--reward-fn``, the answer checks, the built-in tasks, reasoning-gym's scorers) lie in [0, 1]
  and are checked to; a built-in reward function declares its range on its class (``soft_overlong_punishment``
  pays [-1, 0]); a weighted sum's range is the sum of its weighted ranges;
- else none: reward functions with TRL's signature, reward models and environments declare nothing, so their runs
  train as usual and their certificates abstain (nan) until the user declares one.

A reward outside the declared range stops the run at that step (``llm.step.monitors.DeclaredRange``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Theorem 1's reward range, [0, 1]: the range its constants are stated for, and the one text rewards (the answer checks,
#: ``--reward-fn``, the built-in tasks' token rewards) are checked to lie in.
UNIT_INTERVAL = (0.0, 1.0)
TEXT_REWARD_RANGE = UNIT_INTERVAL


def weighted_range(ranges, weights) -> tuple[float, float] | None:
    """The range of sum_i w_i x_i for x_i in ``ranges[i]`` (None when any range is None)."""
    lo = hi = 0.0
    for r, w in zip(ranges, weights, strict=True):
        if r is None:
            return None
        a, b = w * r[0], w * r[1]
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


@dataclass(frozen=True)
class RangeOrigin:
    """The range the run's guarantees read (None: none) and where it came from."""

    range: tuple[float, float] | None
    origin: str  # DECLARED, SOURCES or NONE


DECLARED, SOURCES, NONE = "declared with --reward-range", "the reward's own sources", "none"


def range_origin(declared, own) -> RangeOrigin:
    """The one rule (module docstring): the user's declaration, else the sources' own range ``own``, else none; a
    declaration that does not hold ``own`` is a ValueError (one line)."""
    if declared is None:
        return RangeOrigin(own, SOURCES if own is not None else NONE)
    if own is not None and not (declared[0] <= own[0] and own[1] <= declared[1]):
        raise ValueError(f"reward_range: {range_text(declared)} does not hold the range its sources return, "
                         f"{range_text(own)}")
    return RangeOrigin(tuple(declared), DECLARED)


#: A value within this distance of a declared edge, relative to the range's scale (max(|lo|, |hi|, hi - lo)), is that
#: edge read through float rounding (0.1 + 0.2 under [0, 0.3], a scorer's 1.0000000000000002 under [0, 1], a mean of
#: three 0.1s): about 4,500 float64 ulps at scale 1, far below any excess a reward function means.
EDGE_RTOL = 1e-12


#: The same for rewards a host trainer adds up in float32 (TRL's reward tensors): about 17 float32 ulps at scale 1.
FLOAT32_EDGE_RTOL = 1e-6


def beyond_range(values, lo: float, hi: float, rtol: float = EDGE_RTOL):
    """A boolean array, True where a value lies outside [lo, hi] by more than float rounding (``rtol`` of the range's
    scale: ``EDGE_RTOL`` for float64 arithmetic, ``FLOAT32_EDGE_RTOL`` for float32); nan is never beyond (it is "no
    reward", TRL's None)."""
    import numpy as np

    r = np.asarray(values, dtype=np.float64)
    slack = rtol * max(abs(lo), abs(hi), hi - lo, 1e-300)
    return (r < lo - slack) | (r > hi + slack)


def onto_range(values, lo: float, hi: float):
    """``values`` with those within float rounding of [lo, hi] but outside it set to the edge, and how many were
    (callers have refused a real excess with ``beyond_range`` first)."""
    import numpy as np

    r = np.asarray(values, dtype=np.float64)
    clipped = np.clip(r, lo, hi)
    moved = int(np.sum((clipped != r) & ~np.isnan(r)))
    return np.where(np.isnan(r), r, clipped), moved


def range_text(r) -> str:
    return "none" if r is None else f"[{r[0]:g}, {r[1]:g}]"

"""The reward range a run's guarantees read: declared before the first step, never taken from the rewards seen.

Theorem 1, its estimates and the certificates hold for rewards in a range [lo, hi] known in advance (through
r' = (r - lo)/(hi - lo) in [0, 1]); a range read off the data is not one (docs/theory.md, §8.6: a step that moves
mass onto a reward not yet sampled is certified on 78% of draws). The range comes from, in order:

- ``--reward-range LOW HIGH``, the user's declaration of the total reward;
- else the sources' own ranges, when every source has one: the task's own reward and every text reward
  (``--reward-fn``, the answer checks, the built-in tasks, reasoning-gym's scorers) lie in [0, 1] and are checked to;
  the built-in ``soft_overlong_punishment`` pays [-1, 0]; a weighted sum's range is the sum of its weighted ranges;
- else none: reward functions with TRL's signature, reward models and environments declare nothing, so their runs
  train as usual and their certificates abstain (nan) until the user declares one.

A reward outside the declared range stops the run at that step (``llm.step.monitors.DeclaredRange``).
"""

from __future__ import annotations

#: Text rewards (the answer checks, ``--reward-fn``, the built-in tasks' token rewards): checked to lie in [0, 1].
TEXT_REWARD_RANGE = (0.0, 1.0)
#: The built-in reward functions of ``--reward-funcs`` with a range of their own, by name.
BUILTIN_FUNCTION_RANGES = {"soft_overlong_punishment": (-1.0, 0.0)}


def weighted_range(ranges, weights) -> tuple[float, float] | None:
    """The range of sum_i w_i x_i for x_i in ``ranges[i]`` (None when any range is None)."""
    lo = hi = 0.0
    for r, w in zip(ranges, weights, strict=True):
        if r is None:
            return None
        a, b = w * r[0], w * r[1]
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def sources_range(reward_funcs, reward_weights, environment: bool) -> tuple[float, float] | None:
    """The total reward's range from its sources' own (module docstring): the task's own text reward, or the
    weighted ``reward_funcs`` (by their names; any that is not built in has none); None with an environment (its
    ``get_reward`` declares nothing)."""
    if environment:
        return None
    if not reward_funcs:
        return TEXT_REWARD_RANGE
    weights = list(reward_weights) or [1.0] * len(reward_funcs)
    return weighted_range([BUILTIN_FUNCTION_RANGES.get(f) for f in reward_funcs], weights)


def range_text(r) -> str:
    return "none" if r is None else f"[{r[0]:g}, {r[1]:g}]"

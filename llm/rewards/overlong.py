"""DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13), a built-in reward function in TRL's signature.

With L_max the completion budget (``max_completion_length``) and L_cache the cache (``soft_punish_cache``, TRL's
name), a completion of |y| tokens gets

    0                                  if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache    if L_max - L_cache < |y| <= L_max
    -1                                 if |y| > L_max

(TRL's ``get_soft_overlong_punishment``). Added to a correctness reward with ``--reward-funcs``, it makes rewards
leave [0, 1]: the range of such a sum is declared with ``--reward-range`` (``llm.config.ranges``; docs/data.md).
"""

from __future__ import annotations

#: The name ``--reward-funcs`` knows it by.
NAME = "soft_overlong_punishment"


class SoftOverlongPunishment:
    """The reward of completions by their length (module docstring); logged as ``rewards/<__name__>/mean|std``."""

    __name__ = "soft_overlong_punishment_reward"  # TRL's metric name
    reward_range = (-1.0, 0.0)  # its own range, which the run's guarantees read (``llm.rewards.sources_range``)

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        if not 0 <= soft_punish_cache <= max_completion_len:
            raise ValueError(f"soft_punish_cache: must lie in [0, max_completion_length = {max_completion_len}], got "
                             f"{soft_punish_cache}")
        self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs) -> list[float]:
        start = self.max_completion_len - self.soft_punish_cache
        out = []
        for ids in completion_ids:
            n = len(ids)
            if n <= start:
                out.append(0.0)
            elif n <= self.max_completion_len:
                out.append((start - n) / self.soft_punish_cache)
            else:
                out.append(-1.0)
        return out

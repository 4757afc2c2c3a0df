"""pass@k and maj@k from n >= k samples per prompt (docs/theory.md, §8.3).

A completion *solves* its prompt when its reward is 1 (verifiable rewards are 0 or 1; a partial reward solves
nothing). With n samples of a prompt of which c solve it:

- ``pass_at_k``: 1 - C(n - c, k) / C(n, k), the probability that k of the n samples drawn without replacement
  include a solution: an unbiased estimate of 1 - (1 - p)^k for the prompt's success rate p (Chen et al., 2021,
  arXiv 2107.03374). Where J(pi | x) is exact (the built-in task) ``exact_pass_at_k`` gives 1 - (1 - J)^k itself.
- ``maj_at_k``: the probability that the most frequent answer among k of the n samples (drawn without
  replacement) solves the prompt, ties split evenly: exact over every k-subset when there are at most
  ``MAJ_SUBSETS`` of them, else a mean over that many random subsets. Answers are compared by a key (the built-in
  task's completion text, or the last number of a completion for math answers); an answer class solves the prompt
  when its completions' mean reward is at least 1/2.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: maj@k enumerates every k-subset up to this many; more are sampled (this many, seeded).
MAJ_SUBSETS = 4096


def solved(rewards) -> np.ndarray:
    """Which completions solve their prompt: reward 1 (to float rounding)."""
    return np.asarray(rewards, dtype=np.float64) >= 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate 1 - C(n - c, k)/C(n, k) from n samples with c solutions (k <= n)."""
    if not 1 <= k <= n:
        raise ValueError(f"k: pass@k needs 1 <= k <= n = {n}, got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def exact_pass_at_k(j, k: int) -> np.ndarray:
    """1 - (1 - J)^k: pass@k of a prompt whose success rate J is known exactly."""
    return 1.0 - (1.0 - np.clip(np.asarray(j, dtype=np.float64), 0.0, 1.0)) ** k


def ks_up_to(n: int) -> list[int]:
    """1, 2, 4, ... up to n (and n itself): the k of ``eval/pass@k``."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


def maj_at_k(keys: Sequence, rewards, k: int, rng: np.random.Generator | None = None) -> float:
    """maj@k of one prompt from its n samples' answer ``keys`` and ``rewards`` (module docstring)."""
    n = len(keys)
    if not 1 <= k <= n:
        raise ValueError(f"k: maj@k needs 1 <= k <= n = {n}, got {k}")
    rewards = np.asarray(rewards, dtype=np.float64)
    classes = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    label = np.array([classes[key] for key in keys])
    good = np.array([rewards[label == c].mean() >= 0.5 for c in range(len(classes))])
    total = math.comb(n, k)
    if total <= MAJ_SUBSETS:
        subsets = itertools.combinations(range(n), k)
    else:
        rng = rng or np.random.default_rng(0)
        subsets = (rng.choice(n, size=k, replace=False) for _ in range(MAJ_SUBSETS))
    wins, count = 0.0, 0
    for subset in subsets:
        votes = np.bincount(label[list(subset)], minlength=len(classes))
        top = np.flatnonzero(votes == votes.max())
        wins += good[top].mean()
        count += 1
    return wins / count


def pass_and_maj(rewards: np.ndarray, keys: Sequence[Sequence] | None, ks: Sequence[int]) -> dict[str, float]:
    """``eval/pass@k`` (and ``eval/maj@k`` when answer ``keys`` are given) averaged over prompts, from rewards
    (P, n) and keys (P lists of n)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    c = solved(rewards).sum(axis=1)
    out = {f"eval/pass@{k}": float(np.mean([pass_at_k(n, int(ci), k) for ci in c])) for k in ks}
    if keys is not None:
        rng = np.random.default_rng(0)
        out.update({f"eval/maj@{k}": float(np.mean([maj_at_k(key, r, k, rng) for key, r in zip(keys, rewards)]))
                    for k in ks})
    return out

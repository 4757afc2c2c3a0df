"""Random bandit instances for property checks and the bound-check command.

The RNG is always passed in; nothing here is global. A policy is the softmax of Gaussian logits
with a log-uniform temperature, which spans near-deterministic to near-uniform policies while
keeping every probability positive.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .core import softmax


class Instances(NamedTuple):
    """A batch of single-prompt bandits; policies and rewards have shape (n, n_actions)."""

    pi: np.ndarray
    pi_k: np.ndarray
    alpha: np.ndarray
    r: np.ndarray
    eps: np.ndarray


def random_policy_logits(rng: np.random.Generator, n: int, n_actions: int,
                         scale_range: tuple[float, float] = (0.01, 30.0)) -> np.ndarray:
    scale = np.exp(rng.uniform(*np.log(scale_range), size=(n, 1)))
    return scale * rng.standard_normal((n, n_actions))


def random_instances(rng: np.random.Generator, n: int, n_actions: int) -> Instances:
    """n bandits with ``n_actions`` actions, half of them in each regime:

    - independent: pi, pi_k and alpha drawn independently (mostly far apart);
    - trust region: pi_k and pi are a few softmax-policy-gradient steps from alpha
      (pi_k = alpha tilted by eta_k r, pi = pi_k tilted further), plus noise, as in training.

    Rewards: half continuous uniform on [0, 1], half Bernoulli {0, 1}. eps: uniform on [0, 3/4]
    with 10% exactly 0.
    """
    la = random_policy_logits(rng, n, n_actions)
    binary = rng.random((n, 1)) < 0.5
    r = np.where(binary, (rng.random((n, n_actions)) < 0.5).astype(float), rng.random((n, n_actions)))
    eps = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0.0, 0.75, size=n))

    near = rng.random((n, 1)) < 0.5
    eta_k = np.exp(rng.uniform(np.log(1e-3), np.log(3.0), size=(n, 1)))
    eta = np.exp(rng.uniform(np.log(1e-3), np.log(3.0), size=(n, 1)))
    noise = np.exp(rng.uniform(np.log(1e-4), np.log(0.3), size=(n, 1)))
    lk_near = la + eta_k * r + noise * rng.standard_normal((n, n_actions))
    lp_near = lk_near + eta * r + noise * rng.standard_normal((n, n_actions))
    lk = np.where(near, lk_near, random_policy_logits(rng, n, n_actions))
    lp = np.where(near, lp_near, random_policy_logits(rng, n, n_actions))
    return Instances(softmax(lp), softmax(lk), softmax(la), r, eps)

"""The bias of the estimate of 1/s in the bound's estimates, exactly, for Bernoulli rewards:
``python -m grpo_theory.sigma_bias`` (docs/theory.md, §8.5).

For success rates p and group sizes G it prints E[1/s~] / (1/s), with s = sqrt(p(1 - p) + eps) and s~ the
leave-one-out shrunk estimate of ``grpo_theory.estimators`` (the binomial expectation over the other G - 1 rewards),
beside the same ratio for the plug-in (the population standard deviation of the other G - 1 rewards, no
pseudo-observations). A ratio above 1 makes the estimated lower bound too low (conservative), below 1 too high.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import binom

from .estimators import SIGMA_PSEUDO_COUNT, inverse_sigma_expectation


def plug_in_expectation(p: float, G: int, eps: float) -> float:
    """E[1/sqrt(sigma_plugin^2 + eps)] over the other G - 1 Bernoulli rewards, sigma_plugin their population std."""
    k = np.arange(G)
    m = k / (G - 1)
    return float(np.sum(binom.pmf(k, G - 1, p) / np.sqrt(m * (1 - m) + eps)))


def table(group_sizes=(4, 8, 16), rates=(0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5), eps: float = 1e-4) -> str:
    """The ratios as a markdown table, one row per (estimator, G)."""
    head = "| estimate of 1/s | G | " + " | ".join(f"p = {p:g}" for p in rates) + " |"
    lines = [head, "|" + "---|" * (len(rates) + 2)]
    truth = {p: 1 / np.sqrt(p * (1 - p) + eps) for p in rates}
    for name, fn in ((f"shrunk, a = {SIGMA_PSEUDO_COUNT:g}", lambda p, G: float(inverse_sigma_expectation(p, G, eps))),
                     ("plug-in", lambda p, G: plug_in_expectation(p, G, eps))):
        for G in group_sizes:
            lines.append(f"| {name} | {G} | " + " | ".join(f"{fn(p, G) / truth[p]:.2f}" for p in rates) + " |")
    lines.append(f"\n1/s at these p (eps = {eps:g}): " + ", ".join(f"{truth[p]:.2f}" for p in rates))
    return "\n".join(lines)


@dataclasses.dataclass
class Args:
    """E[1/s~] / (1/s) for Bernoulli rewards: the bias of the bound's estimate of 1/s."""

    eps: float = 1e-4
    """The variance epsilon of s = sqrt(p(1 - p) + eps)."""
    group_sizes: tuple[int, ...] = (4, 8, 16)
    """Group sizes G (each >= 2)."""

    def __post_init__(self):
        if not 0 <= self.eps <= 0.75:
            raise ValueError("eps: must lie in [0, 3/4] (Theorem 1)")
        if not self.group_sizes or min(self.group_sizes) < 2:
            raise ValueError("group_sizes: each G must be >= 2")


def main(args: list[str] | None = None) -> int:
    from runkit.cli import parse

    cfg = parse(Args, args, prog="python -m grpo_theory.sigma_bias", description=Args.__doc__)
    print(table(cfg.group_sizes, eps=cfg.eps))
    return 0


if __name__ == "__main__":
    from runkit.cli import run_main

    run_main(main, prog="python -m grpo_theory.sigma_bias")

"""Monte-Carlo check of Theorem 1 on random bandits: ``python -m grpo_theory.check``.

Draws N random single-prompt bandits (2 to 8 actions; see ``instances.random_instances``),
evaluates the realised improvement J(pi) - J(pi_k) and the Theorem 1 lower bound with the
paper's constant (2) and the tight constant (reward range), and prints violations (must be 0),
the minimum slack, how often each bound is positive (informative) and instances per second.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from runkit.cli import parse, run_main

from .core import bound_terms, expected_reward
from .instances import random_instances
from .numerics import ILL_CONDITIONED, rounding_tolerance


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """Check Theorem 1 of off-policy GRPO on random bandits."""

    n: int = 100_000
    """Number of random bandit instances."""
    min_actions: int = 2
    """Smallest number of actions per bandit."""
    max_actions: int = 8
    """Largest number of actions per bandit (instances are spread evenly over the sizes)."""
    seed: int = 0
    """Seed of the random generator."""

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n: need at least one instance, got {self.n}")
        if not 2 <= self.min_actions <= self.max_actions:
            raise ValueError(
                f"min_actions/max_actions: need 2 <= min_actions <= max_actions, got {self.min_actions}, {self.max_actions}")


@dataclasses.dataclass
class CheckResult:
    n: int
    seconds: float
    rows: dict  # name -> dict(violations, min_slack, frac_positive, frac_vacuous)


def run_check(config: CheckConfig) -> CheckResult:
    rng = np.random.default_rng(config.seed)
    sizes = np.arange(config.min_actions, config.max_actions + 1)
    counts = np.full(len(sizes), config.n // len(sizes))
    counts[: config.n % len(sizes)] += 1
    t0 = time.perf_counter()
    slack = {"paper": [], "tight": []}
    lower = {"paper": [], "tight": []}
    tol = {"paper": [], "tight": []}
    for k, m in zip(sizes, counts):
        if m == 0:
            continue
        inst = random_instances(rng, int(m), int(k))
        improvement = expected_reward(inst.pi, inst.r) - expected_reward(inst.pi_k, inst.r)
        for name, tight in (("paper", False), ("tight", True)):
            terms = bound_terms(inst.pi, inst.pi_k, inst.alpha, inst.r, inst.eps, tight=tight)
            lower[name].append(terms.lower)
            slack[name].append(improvement - terms.lower)
            tol[name].append(rounding_tolerance(inst.alpha, inst.r, inst.eps, terms, tight))
    seconds = time.perf_counter() - t0
    rows = {}
    for name in ("paper", "tight"):
        lb, sl, tl = (np.concatenate(x[name]) for x in (lower, slack, tol))
        finite = np.isfinite(lb)
        well = finite & (tl <= ILL_CONDITIONED)
        rows[name] = dict(
            violations=int(np.sum(~(sl >= -tl))),
            min_slack=float(np.min(sl[well])) if well.any() else float("nan"),
            frac_positive=float(np.mean(lb > 0)),
            frac_vacuous=float(np.mean(~finite)),
            frac_ill=float(np.mean(finite & ~well)),
        )
    return CheckResult(config.n, seconds, rows)


def format_result(res: CheckResult) -> str:
    head = (f"{'bound':<22}{'violations':>11}{'min slack*':>12}{'bound > 0':>11}{'bound = -inf':>14}"
            f"{'ill-cond.*':>12}")
    lines = [head, "-" * len(head)]
    names = {"paper": "paper (c = 2)", "tight": "tight (c = range r)"}
    for key, row in res.rows.items():
        lines.append(
            f"{names[key]:<22}{row['violations']:>11d}{row['min_slack']:>12.3e}"
            f"{row['frac_positive']:>10.2%}{row['frac_vacuous']:>13.2%}{row['frac_ill']:>11.2%}")
    lines.append(f"* min slack over well-conditioned instances; ill-cond.: float64 rounding allowance > {ILL_CONDITIONED:g}"
                 " (checked with that allowance)")
    lines.append(f"{res.n} instances in {res.seconds:.2f} s ({res.n / res.seconds:,.0f} instances/s)")
    return "\n".join(lines)


def main(args: list[str] | None = None) -> int:
    config = parse(CheckConfig, args, prog="python -m grpo_theory.check", description=__doc__.splitlines()[0])
    print(f"Theorem 1 on {config.n} random bandits ({config.min_actions}-{config.max_actions} actions, seed {config.seed})")
    res = run_check(config)
    print(format_result(res))
    return 1 if any(r["violations"] for r in res.rows.values()) else 0


if __name__ == "__main__":
    run_main(main, prog="python -m grpo_theory.check")

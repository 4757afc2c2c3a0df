"""How often the improvement certificate certifies a step that did not improve J, and how often one that did
(docs/theory.md, §8.6): ``python -m grpo_theory.certificate`` prints the coverage table.

The certificate is ``estimators.lower_confidence_bound`` over P per-prompt estimates, each unbiased for the step's
change in J. Its false-certificate rate is measured at a true change of 0 or below (the bound certifies when it is
positive), its power at a positive change, over per-prompt distributions of five shapes, each scaled to standard
deviation 1 (the bound is scale-free), and over the held-out improvement estimator itself on a table where the
update moves probability off a rarely sampled correct answer (``RARE_LOSS``): most prompts never sample it and see a
small gain, a few see the loss. Every cell is a Monte-Carlo rate over ``reps`` replications with its standard error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .estimators import CERTIFICATE_MIN_PROMPTS, DEFAULT_LCB_METHOD, improvement_estimate, lower_confidence_bound

#: Prompt counts of the table.
PROMPT_COUNTS = (2, 4, 8, 16, 32)
#: The parametric families' shift for power: half a per-prompt standard deviation.
POWER_SHIFT = 0.5


def _lognormal(sigma: float, sign: float) -> Callable:
    mean, sd = np.exp(sigma**2 / 2), np.sqrt((np.exp(sigma**2) - 1) * np.exp(sigma**2))
    return lambda rng, shape: sign * (rng.lognormal(0.0, sigma, shape) - mean) / sd


def _skewness_of_lognormal(sigma: float) -> float:
    return float((np.exp(sigma**2) + 2) * np.sqrt(np.exp(sigma**2) - 1))


#: Per-prompt estimates of mean 0 and standard deviation 1, by shape.
FAMILIES: dict[str, Callable] = {
    "symmetric (normal)": lambda rng, shape: rng.standard_normal(shape),
    f"left-skewed (reflected lognormal, skewness -{_skewness_of_lognormal(0.5):.1f})": _lognormal(0.5, -1.0),
    f"strongly left-skewed (reflected lognormal, skewness -{_skewness_of_lognormal(1.0):.1f})": _lognormal(1.0, -1.0),
    f"right-skewed (lognormal, skewness {_skewness_of_lognormal(1.0):.1f})": _lognormal(1.0, 1.0),
    "heavy-tailed (Student t, 3 degrees of freedom)": lambda rng, shape: rng.standard_t(3, shape) / np.sqrt(3.0),
}


@dataclass(frozen=True)
class TableCase:
    """One prompt's table: alpha (= pi_k, lag 0), the rewards and the updated policy pi_new; G responses per
    prompt, the held-out improvement estimator (``improvement_estimate``) per prompt."""

    alpha: tuple[float, ...]
    reward: tuple[float, ...]
    pi_new: tuple[float, ...]
    G: int = 8

    @property
    def change(self) -> float:
        return float(np.dot(np.subtract(self.pi_new, self.alpha), self.reward))

    def estimates(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        alpha, r, w = np.array(self.alpha), np.array(self.reward), np.divide(self.pi_new, self.alpha)
        y = rng.choice(len(alpha), p=alpha, size=(*shape, self.G))
        return improvement_estimate(r[y], w[y], np.ones(y.shape))


#: A common correct answer (0.4), a rare one (0.03) and a wrong one; the update adds 0.01 to the common correct
#: answer and takes three quarters of the rare one's mass: J changes by -0.0125, weights in [0.25, 1.03], per-prompt
#: estimates negative on 21% of prompts (skewness -2.1).
RARE_LOSS = TableCase((0.4, 0.03, 0.57), (1.0, 1.0, 0.0), (0.41, 0.0075, 0.5825))
#: Its power counterpart: the same loss on the rare answer, and 0.04 added to the common one (J changes by +0.0175).
RARE_GAIN = TableCase((0.4, 0.03, 0.57), (1.0, 1.0, 0.0), (0.44, 0.0075, 0.5525))
TABLE_NAME = "left-skewed table (a rare correct answer loses mass)"


@dataclass(frozen=True)
class Rate:
    """A Monte-Carlo rate and its standard error."""

    rate: float
    se: float

    @classmethod
    def of(cls, hits: np.ndarray) -> "Rate":
        p = float(np.mean(hits))
        return cls(p, float(np.sqrt(p * (1 - p) / hits.size)))

    def __str__(self) -> str:
        return f"{self.rate:.3f} ± {self.se:.3f}"


def certified(x: np.ndarray, level: float, method: str = DEFAULT_LCB_METHOD,
              min_count: int = CERTIFICATE_MIN_PROMPTS) -> np.ndarray:
    """Whether the bound over each row of ``x`` (reps, P) certifies (> 0; an abstention, nan, does not); by default
    the certificate the trainer logs."""
    bound = lower_confidence_bound(x, level, method=method, min_count=min_count)
    return np.nan_to_num(np.asarray(bound), nan=-np.inf) > 0


def false_and_power(family: str, P: int, reps: int, level: float = 0.95, method: str = DEFAULT_LCB_METHOD,
                    min_count: int = CERTIFICATE_MIN_PROMPTS, seed: int = 0) -> tuple[Rate, Rate]:
    """The false-certificate rate (true change <= 0) and the power of one family at P prompts."""
    rng = np.random.default_rng([seed, P, sum(map(ord, family))])
    if family == TABLE_NAME:
        null, alt = RARE_LOSS.estimates(rng, (reps, P)), RARE_GAIN.estimates(rng, (reps, P))
    else:
        null = FAMILIES[family](rng, (reps, P))
        alt = FAMILIES[family](rng, (reps, P)) + POWER_SHIFT
    return Rate.of(certified(null, level, method, min_count)), Rate.of(certified(alt, level, method, min_count))


def coverage_table(reps: int = 4000, level: float = 0.95, counts=PROMPT_COUNTS) -> str:
    """The markdown table: per family and prompt count, the certificate's false-certificate rate and power, beside
    the Student-t bound's without abstention."""
    lines = [f"| per-prompt estimates | P | certificate: false | certificate: power | t bound: false | t bound: power |",
             "|---|---|---|---|---|---|"]
    for family in (*FAMILIES, TABLE_NAME):
        for P in counts:
            f, p = false_and_power(family, P, reps, level)
            tf, tp = false_and_power(family, P, reps, level, method="t", min_count=2)
            lines.append(f"| {family} | {P} | {f} | {p} | {tf} | {tp} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import dataclasses

    from runkit.cli import parse

    @dataclasses.dataclass
    class CoverageArgs:
        """The improvement certificate's false-certificate rate and power (docs/theory.md, §8.6)."""

        reps: int = 4000
        """Replications per cell."""
        level: float = 0.95
        """The certificate's confidence level."""

        def __post_init__(self):
            from runkit.validation import require

            require(self, self.reps >= 100, "reps", "must be >= 100")
            require(self, 0.5 <= self.level < 1, "level", "must be in [0.5, 1)")

    args = parse(CoverageArgs, argv, prog="python -m grpo_theory.certificate", description=CoverageArgs.__doc__)
    print(f"level {args.level}, {args.reps} replications per cell; the certificate abstains below "
          f"{CERTIFICATE_MIN_PROMPTS} prompts; power at +{POWER_SHIFT} sd (table: at a change of "
          f"+{RARE_GAIN.change:.4f}; false certificates at {RARE_LOSS.change:.4f})")
    print(coverage_table(args.reps, args.level))
    return 0


if __name__ == "__main__":
    from runkit.cli import run_main

    run_main(main, prog="python -m grpo_theory.certificate")

"""How often the improvement certificate certifies a step that did not improve J, and how often one that did
(docs/theory.md, §8.6): ``python -m grpo_theory.certificate`` prints the coverage table.

The certificate is ``estimators.lower_confidence_bound`` over P independent per-prompt values of a known range: by
default the betting bound (``grpo_theory.betting``) on values in [-1, 1], whose level is a theorem. The table tries to
break it where a bound built from the sample's spread breaks: families whose mass sits at the ends of the range (a
rare harm at -1 that a small sample misses, a point mass carrying a zero mean), and the held-out estimators
themselves on tables where the update moves probability off a rarely sampled correct answer. Every cell is a
Monte-Carlo rate over ``reps`` replications with its standard error, beside the two unguaranteed bounds (Student's t
and Cantelli's with the sample standard deviation) on the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .estimators import (CERTIFICATE_MIN_PROMPTS, DEFAULT_LCB_METHOD, DEFAULT_LCB_RANGE, IMPROVEMENT_WEIGHT_CAP,
                         capped_improvement_estimate, improvement_estimate, lower_confidence_bound)

#: Prompt counts of the table.
PROMPT_COUNTS = (16, 32, 64, 128)


def _two_point(low: float, p_low: float, high: float) -> Callable:
    """-> a sampler of ``low`` with probability ``p_low``, else ``high`` (values in [-1, 1])."""
    return lambda rng, shape: np.where(rng.random(shape) < p_low, low, high)


#: Per-prompt values in [-1, 1] whose mean is at or below 0 (false certificates) and, for each, one above 0 (power).
#: The first four put their mass at the ends of the range; the last is spread.
FAMILIES: dict[str, tuple[Callable, Callable]] = {
    "rare harm (-1 w.p. 2%, else +0.01; mean -0.0102)": (_two_point(-1.0, 0.02, 0.01), _two_point(-1.0, 0.02, 0.1)),
    "zero mean, rarer harm (-1 w.p. 0.5%, else +0.005025)": (_two_point(-1.0, 0.005, 0.005 / 0.995),
                                                             _two_point(-1.0, 0.005, 0.1)),
    "ends of the range (-1 or +1, mean 0)": (_two_point(-1.0, 0.5, 1.0), _two_point(-1.0, 0.4, 1.0)),
    "small gain, rare total loss (+0.2 w.p. 83.3%, else -1; mean 0)": (_two_point(-1.0, 1 / 6, 0.2),
                                                                       _two_point(-1.0, 0.1, 0.2)),
    "spread (uniform on [-1, 1])": (lambda rng, shape: rng.uniform(-1.0, 1.0, shape),
                                    lambda rng, shape: rng.uniform(-0.6, 1.0, shape)),
}
#: The power families' means (the false ones' are in the names).
POWER_MEANS = {"rare harm (-1 w.p. 2%, else +0.01; mean -0.0102)": -0.02 + 0.98 * 0.1,
               "zero mean, rarer harm (-1 w.p. 0.5%, else +0.005025)": -0.005 + 0.995 * 0.1,
               "ends of the range (-1 or +1, mean 0)": 0.2,
               "small gain, rare total loss (+0.2 w.p. 83.3%, else -1; mean 0)": -0.1 + 0.9 * 0.2,
               "spread (uniform on [-1, 1])": 0.2}


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

    def estimates(self, rng: np.random.Generator, shape: tuple[int, int], capped: bool = False) -> np.ndarray:
        """Per-prompt held-out estimates (lag 0: w_k = 1): the unbiased ``improvement_estimate``, or (``capped``) the
        certificate's ``capped_improvement_estimate`` at W = 2, in [-1, 1]."""
        alpha, r, w = np.array(self.alpha), np.array(self.reward), np.divide(self.pi_new, self.alpha)
        y = rng.choice(len(alpha), p=alpha, size=(*shape, self.G))
        if capped:
            return capped_improvement_estimate(r[y], w[y], np.ones(y.shape), IMPROVEMENT_WEIGHT_CAP)
        return improvement_estimate(r[y], w[y], np.ones(y.shape))


#: A common correct answer (0.4), a rare one (0.03) and a wrong one; the update adds 0.01 to the common correct
#: answer and takes three quarters of the rare one's mass: J changes by -0.0125, weights in [0.25, 1.03], per-prompt
#: estimates negative on 21% of prompts (skewness -2.1).
RARE_LOSS = TableCase((0.4, 0.03, 0.57), (1.0, 1.0, 0.0), (0.41, 0.0075, 0.5825))
#: Its power counterpart: the same loss on the rare answer, and 0.04 added to the common one (J changes by +0.0175).
RARE_GAIN = TableCase((0.4, 0.03, 0.57), (1.0, 1.0, 0.0), (0.44, 0.0075, 0.5525))
#: A rarer correct answer (0.005) that the update takes nine tenths of, with 0.004 added to the common one: J changes
#: by -0.0005; most groups never sample the rare answer and see a small gain.
RARER_LOSS = TableCase((0.5, 0.005, 0.495), (1.0, 1.0, 0.0), (0.504, 0.0005, 0.4955))
#: The tables of the coverage study: name -> (no improvement, improvement).
TABLES = {"table: a rare correct answer loses mass (-0.0125 / +0.0175)": (RARE_LOSS, RARE_GAIN),
          "table: a rarer one (-0.0005 / +0.0175)": (RARER_LOSS, RARE_GAIN)}
TABLE_NAME = next(iter(TABLES))


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
              min_count: int = CERTIFICATE_MIN_PROMPTS, low: float = DEFAULT_LCB_RANGE[0],
              high: float = DEFAULT_LCB_RANGE[1]) -> np.ndarray:
    """Whether the bound over each row of ``x`` (reps, P) certifies (> 0); a bound that abstains (nan: an unguaranteed
    method below ``min_count`` values) does not certify. By default the certificate the trainer logs: the betting
    bound on values in [``low``, ``high``] = [-1, 1], which holds its level for every distribution there; a value
    outside that range, nan included, is refused (ValueError), as ``lower_confidence_bound`` refuses it."""
    bound = lower_confidence_bound(x, level, method=method, min_count=min_count, low=low, high=high)
    return np.nan_to_num(np.asarray(bound), nan=-np.inf) > 0


#: The bounds of the table: name -> lower_confidence_bound's method.
BOUNDS = {"betting": "betting", "t (no guarantee)": "t_unguaranteed",
          "Cantelli (no guarantee)": "cantelli_unguaranteed"}


def false_and_power(family: str, P: int, reps: int, level: float = 0.95,
                    seed: int = 0) -> dict[str, tuple[Rate, Rate]]:
    """Per bound (``BOUNDS``), the false-certificate rate (true change <= 0) and the power of one family (or table)
    at P prompts, on the same draws. On a table the betting bound sees the capped estimates, the others the unbiased
    ones (what the trainer gives each)."""
    rng = np.random.default_rng([seed, P, sum(map(ord, family))])
    if family in TABLES:
        null_case, alt_case = TABLES[family]
        state = rng.bit_generator.state
        values = {}
        for capped in (False, True):
            rng.bit_generator.state = state  # the same responses for both estimators
            values[capped] = (null_case.estimates(rng, (reps, P), capped), alt_case.estimates(rng, (reps, P), capped))
        pick = lambda method: values[method == "betting"]  # noqa: E731
    else:
        null_draw, alt_draw = FAMILIES[family]
        both = (null_draw(rng, (reps, P)), alt_draw(rng, (reps, P)))
        pick = lambda method: both  # noqa: E731
    out = {}
    for name, method in BOUNDS.items():
        null, alt = pick(method)
        out[name] = (Rate.of(certified(null, level, method)), Rate.of(certified(alt, level, method)))
    return out


def coverage_table(reps: int = 4000, level: float = 0.95, counts=PROMPT_COUNTS) -> str:
    """The markdown table: per family and prompt count, each bound's false-certificate rate and power."""
    head = " | ".join(f"{b}: false | {b}: power" for b in BOUNDS)
    lines = [f"| per-prompt values | P | {head} |", "|---|---|" + "---|---|" * len(BOUNDS)]
    for family in (*FAMILIES, *TABLES):
        for P in counts:
            rates = false_and_power(family, P, reps, level)
            lines.append(f"| {family} | {P} | " + " | ".join(f"{f} | {p}" for f, p in rates.values()) + " |")
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
    print(f"level {args.level}, {args.reps} replications per cell; the unguaranteed bounds abstain below "
          f"{CERTIFICATE_MIN_PROMPTS} prompts; power means: "
          + "; ".join(f"{k.split(' (')[0]} {v:+.4f}" for k, v in POWER_MEANS.items())
          + f"; tables: G = 8, the betting bound on the capped estimates (W = {IMPROVEMENT_WEIGHT_CAP:g})")
    print(coverage_table(args.reps, args.level))
    return 0


if __name__ == "__main__":
    from runkit.cli import run_main

    run_main(main, prog="python -m grpo_theory.certificate")

"""The improvement certificate's failure cases, before and after the betting bound: ``python
benchmarks/archive/certificate_cases.py`` (under a minute). Each figure is a Monte-Carlo rate over 4,000 replications, at
level 0.95, of certifying (a positive lower confidence bound) where J did not improve:

1. a rare harm (-1 with probability 2%, else +0.01; mean -0.0102) at 16, 32 and 64 prompts;
2. a zero mean carried by a rarer point mass (-1 with probability 0.5%, else +0.005025) at 16 and 64;
3. the held-out estimators on a table with a rarer correct answer (alpha (0.5, 0.005, 0.495), the update takes nine
   tenths of the rare answer: J changes by -0.0005; G = 8) at 16, 24, 32 and 64 prompts;
4. reading across steps: a run of 1,000 steps of 32 held-out prompts, one in ten improving (values uniform on
   [-0.6, 1], mean 0.2), the rest not (uniform on [-1, 1]): the share of certified steps that did not improve, when
   every step's own certificate is read, and under e-BH.

"before": Cantelli's bound with the sample standard deviation (the earlier default, now ``cantelli_unguaranteed``);
"after": the betting bound (the default), on the capped estimates where the values come from a table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from grpo_theory.betting import e_bh, e_value  # noqa: E402
from grpo_theory.certificate import FAMILIES, TABLES, false_and_power  # noqa: E402
from grpo_theory.estimators import lower_confidence_bound  # noqa: E402

REPS = 4000
CASES = [(list(FAMILIES)[0], (16, 32, 64)), (list(FAMILIES)[1], (16, 64)), (list(TABLES)[1], (16, 24, 32, 64))]


def main() -> int:
    print(f"level 0.95, {REPS} replications per cell: the share of replications certified where J did not improve")
    print("| case | P | before (Cantelli, sample sd) | after (betting) |\n|---|---:|---:|---:|")
    for family, counts in CASES:
        for P in counts:
            rates = false_and_power(family, P, REPS)
            print(f"| {family} | {P} | {rates['Cantelli (no guarantee)'][0]} | {rates['betting'][0]} |", flush=True)
    rng = np.random.default_rng(0)
    improving = rng.random(1000) < 0.1
    values = np.where(improving[:, None], rng.uniform(-0.6, 1.0, (1000, 32)), rng.uniform(-1.0, 1.0, (1000, 32)))
    for name, certified in (
            ("Cantelli, each step read", lower_confidence_bound(values, 0.95, method="cantelli_unguaranteed") > 0),
            ("betting, each step read", lower_confidence_bound(values, 0.95) > 0),
            ("betting e-values, e-BH over the run", e_bh(e_value(values, 0.95, -1.0, 1.0), 0.95))):
        n = int(certified.sum())
        wrong = int((certified & ~improving).sum())
        print(f"4. {name}: {n} of 1000 steps certified ({int(improving.sum())} improved), {wrong} of them did not "
              f"improve ({wrong / max(n, 1):.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Why the reward range must be declared: a step that moves mass onto a reward not yet sampled, certified under a
range read off the data, and not under the declared one.

    .venv/bin/python benchmarks/declared_range.py            # about a minute on 2 cores

One prompt's table, repeated over P held-out prompts with G = 8 completions each (lag 0: pi_k = alpha): alpha =
(0.5, 0.4995, 0.0005) on rewards (1, 0, -1), the update pi_{k+1} = (0.7, 0, 0.3). The true change is
J(pi_{k+1}) - J(pi_k) = -0.0995: the step makes things worse. The per-step certificate (``heldout/improvement_lcb``,
the betting bound at level 0.95 on the capped estimates; ``llm.tensors.diagnostics.bound_estimates``, the trainer's own
function) is computed two ways on the same draws:

- the old inference: the range [0, 1] widened to the rewards seen (the -1 answer, drawn with probability 0.0005, is
  usually not among the P x 8 draws, so the range stays [0, 1] and the capped estimates average +0.1995);
- the declared range [-1, 1] (``--reward-range -1 1``).

Prints, per P, how often each certifies the step (a false certificate: the true change is negative) with its
Monte-Carlo standard error, and how often the -1 answer was not drawn at all. Under the declared range the false rate
must stay at most 1 - level = 0.05 (the betting bound's theorem).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALPHA = np.array([0.5, 0.4995, 0.0005])
REWARD = np.array([1.0, 0.0, -1.0])
PI_NEW = np.array([0.7, 0.0, 0.3])
G, LEVEL = 8, 0.95


def true_change() -> float:
    return float(PI_NEW @ REWARD - ALPHA @ REWARD)


def certified_rates(P: int, reps: int, seed: int = 0) -> dict[str, tuple[float, float]]:
    """(rate, standard error) of a positive certificate under the inferred and the declared range, and of the -1
    answer never drawn, over ``reps`` steps of P prompts."""
    from llm.tensors.diagnostics import RewardRange, bound_estimates

    rng = np.random.default_rng([seed, P])
    declared = RewardRange(-1.0, 1.0)
    hits = {"inferred": 0, "declared": 0, "unseen": 0}
    with np.errstate(divide="ignore"):
        log_w = np.log(PI_NEW / ALPHA)
    for _ in range(reps):
        y = rng.choice(3, p=ALPHA, size=(P, G))
        rewards, log_w_new, log_w_k = REWARD[y], log_w[y], np.zeros((P, G))
        inferred = RewardRange().widened(rewards)  # what the trainer did before: [0, 1] widened to the rewards seen
        for name, rr in (("inferred", inferred), ("declared", declared)):
            lcb = bound_estimates(rewards, log_w_k, log_w_new, 1e-4, rr, lcb_level=LEVEL)["improvement_lcb"]
            hits[name] += bool(lcb > 0)
        hits["unseen"] += bool((y != 2).all())
    return {k: (v / reps, float(np.sqrt(v / reps * (1 - v / reps) / reps))) for k, v in hits.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 256])
    args = ap.parse_args()
    print(f"true change J(pi_new) - J(pi_k) = {true_change():+.4f}; level {LEVEL}; {args.reps} steps per row; G = {G}")
    print(f"{'P':>5} {'certified, range inferred':>27} {'certified, declared [-1, 1]':>29} {'-1 never drawn':>16}")
    worst = 0.0
    for P in args.prompts:
        r = certified_rates(P, args.reps)
        cell = lambda k: f"{r[k][0]:.3f} ± {r[k][1]:.3f}"  # noqa: E731
        print(f"{P:>5} {cell('inferred'):>27} {cell('declared'):>29} {cell('unseen'):>16}")
        worst = max(worst, r["declared"][0] - 3 * r["declared"][1])
    return 0 if worst <= 1 - LEVEL else 1


if __name__ == "__main__":
    sys.exit(main())

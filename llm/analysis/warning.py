"""Early warning: does a signal logged at a step predict the exact J the next steps gain?
``python -m llm.analysis.warning RUN_DIR [RUN_DIR ...]`` (each a run directory or a folder of them, such as the
frontier grid's ``runs/llm_frontier``).

Only runs on a task with exact J can be read (the built-in task logs ``j/pi_k`` and ``j/pi_new``). For a horizon h,
a step t's *future gain* is the exact J after step t + h - 1 minus the exact J before step t: what the next h
updates gain in truth. Two measurements per signal:

- within runs: Spearman's rank correlation between the signal at step t and the future gain from t, over the steps
  of one run; the table gives its mean over runs (± its standard error over runs) and the share of runs where it is
  negative. A signal that warns of lost progress (TV, lag, mismatch KL, clip share) correlates negatively, one that
  vouches for it (ESS, the certificate) positively. ``step`` is the baseline: the step index itself, which predicts
  smaller gains later on any concave learning curve, so a signal is informative within runs only where it does
  better than ``step``.
- across runs: Spearman's rank correlation between a run's mean signal and its total exact J gain, over runs, with
  its two-sided p-value: does a run that logs more of the signal end with less J?

A run where a signal is constant (TV at v = 1 synchronously, say) has no within-run correlation for it and is left
out of that column. The correlations measure association, not cause: staleness moves the signals and the J gain
together, so an across-run correlation says the signal separates the regimes, and a within-run one that it moves
before the step's gain does.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro
from scipy import stats

from runkit.cli import parse, run_main

from llm.run.rundir import read_metrics

#: Signal name -> metrics key (``step``: the step index, the baseline).
SIGNALS = {
    "TV(pi_k, alpha)": "tv/pi_k_alpha",
    "held-out TV(pi_k, alpha)": "heldout/tv/pi_k_alpha",
    "ESS of pi_k/alpha": "ess/pi_k_alpha",
    "mismatch KL": "sampling/mismatch_kl",
    "clip share": "clip_ratio/region_mean",
    "lag": "lag",
    "certificate (improvement LCB)": "heldout/improvement_lcb",
    "step": "step",
}


@dataclasses.dataclass(frozen=True)
class WarningConfig:
    """Which logged signals predict the exact J gain of the next steps, within runs and across them."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional]
    """Run directories, or folders searched for them (any directory holding a metrics.jsonl)."""
    horizon: int = 8
    """h: the future gain from step t is the exact J after step t + h - 1 minus the exact J before step t."""

    def __post_init__(self):
        if self.horizon < 1:
            raise ValueError(f"horizon: must be >= 1, got {self.horizon}")
        if not self.runs:
            raise ValueError("runs: name at least one run directory or a folder of them")


def future_gain(j_before: np.ndarray, j_after: np.ndarray, horizon: int) -> np.ndarray:
    """Exact J after step t + h - 1 minus exact J before step t, for every t with h steps ahead of it."""
    n = len(j_before) - horizon + 1
    return np.asarray(j_after[horizon - 1:horizon - 1 + n]) - np.asarray(j_before[:max(n, 0)])


def _spearman(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return math.nan
    return float(stats.spearmanr(x[ok], y[ok]).statistic)


def signal_table(runs: dict[str, list[dict]], horizon: int) -> tuple[str, dict[str, dict[str, float]]]:
    """The table (markdown) and its numbers: signal -> within (mean rho), within_se, within_negative (share of
    runs), within_runs (runs with a correlation), across (rho), across_p."""
    numbers = {}
    for name, key in SIGNALS.items():
        within, means, gains = [], [], []
        for rows in runs.values():
            if not any(key in r for r in rows):
                continue
            s = np.array([r.get(key, math.nan) for r in rows], dtype=float)
            j0, j1 = np.array([r["j/pi_k"] for r in rows]), np.array([r["j/pi_new"] for r in rows])
            g = future_gain(j0, j1, horizon)
            if len(g) >= 3:
                within.append(_spearman(s[:len(g)], g))
            means.append(np.nanmean(s))
            gains.append(j1[-1] - j0[0])
        w = np.array([x for x in within if not math.isnan(x)])
        across = stats.spearmanr(means, gains) if len(means) >= 3 and np.ptp(means) > 0 else None
        numbers[name] = dict(
            within=float(w.mean()) if w.size else math.nan,
            within_se=float(w.std(ddof=1) / math.sqrt(w.size)) if w.size > 1 else math.nan,
            within_negative=float(np.mean(w < 0)) if w.size else math.nan,
            within_runs=float(w.size),
            across=float(across.statistic) if across is not None else math.nan,
            across_p=float(across.pvalue) if across is not None else math.nan,
            across_runs=float(len(means)))
    lines = [f"| signal | runs (within) | within runs: rho with the next {horizon} steps' exact J gain "
             "| runs with rho < 0 | across runs: rho of mean signal with J gain | p |", "|---|---|---|---|---|---|"]
    for name, n in numbers.items():
        within = ([f"{n['within']:+.3f} ± {n['within_se']:.3f}", f"{n['within_negative']:.2f}"] if n["within_runs"]
                  else ["constant in every run", ""])
        across = ["constant", ""] if math.isnan(n["across"]) else [f"{n['across']:+.3f}", f"{n['across_p']:.2g}"]
        lines.append("| " + " | ".join([name, f"{n['within_runs']:.0f}", *within, *across]) + " |")
    return "\n".join(lines), numbers


def find_runs(paths) -> dict[str, list[dict]]:
    """Every run directory (a metrics.jsonl beside it) under the paths, with its rows; runs without exact J are
    refused in one line."""
    found = {}
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"runs: {p} does not exist")
        for m in sorted([p / "metrics.jsonl"] if (p / "metrics.jsonl").exists() else p.rglob("metrics.jsonl")):
            rows = read_metrics(m.parent)
            if rows and "j/pi_k" not in rows[0]:
                raise ValueError(f"runs: {m.parent} has no exact J (j/pi_k): only the built-in task's runs can be read")
            if not all("j/pi_k" in r for r in rows):
                raise ValueError(f"runs: {m.parent} measured the exact J at some steps only (--exact-j-steps > 1): the "
                                 "signal check needs it at every step")
            if rows:
                found[str(m.parent)] = rows
    if not found:
        raise ValueError(f"runs: no run directory (with a metrics.jsonl) under {', '.join(map(str, paths))}")
    return found


def main(args: list[str] | None = None) -> int:
    cfg = parse(WarningConfig, args, prog="python -m llm.analysis.warning", description=__doc__.splitlines()[0])
    runs = find_runs(cfg.runs)
    text, _ = signal_table(runs, cfg.horizon)
    print(f"{len(runs)} runs, horizon {cfg.horizon} steps\n\n{text}")
    return 0


if __name__ == "__main__":
    run_main(main, prog="python -m llm.analysis.warning")

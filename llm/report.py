"""A short text summary of a run directory (first/last rewards, TV and bound columns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .rundir import read_metrics

COLUMNS = ["reward", "tv/pi_k_alpha", "tv/pi_k_alpha_tok_ub", "tv/pi_new_alpha", "improvement",
           "bound/surrogate", "bound/lower", "bound/lower_tight", "bound/lower_tight_nonzero_std",
           "improvement_nonzero_std", "is_weight/max", "sampling/logp_diff_max"]


def summarise(run_dir: str | Path, window: int = 10) -> str:
    rows = read_metrics(run_dir)
    if not rows:
        return f"{run_dir}: no metrics"
    n = min(window, len(rows))
    first, last = rows[:n], rows[-n:]
    lines = [f"run {run_dir}: {len(rows)} steps (means over the first and last {n} steps)",
             f"  {'metric':<32}{'first':>12}{'last':>12}"]
    for c in COLUMNS:
        if c in rows[0]:
            a = np.mean([r[c] for r in first if c in r])
            b = np.mean([r[c] for r in last if c in r])
            lines.append(f"  {c:<32}{a:>12.4g}{b:>12.4g}")
    t = np.median([sum(r.get(k, 0.0) for k in r if k.startswith("time/")) for r in rows])
    lines.append(f"  median seconds per step: {t:.3f}")
    return "\n".join(lines)

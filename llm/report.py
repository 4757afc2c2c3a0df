"""A short text summary of a run directory: first and last steps of the main metrics, the exact and
estimated improvement, and the evaluation on the test prompts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .rundir import read_metrics

COLUMNS = ["reward", "j/pi_k", "tv/pi_k_alpha", "tv/pi_k_alpha_chain_ub_est", "is_weight/max",
           "insample/tv/pi_new_alpha", "heldout/tv/pi_new_alpha",
           "improvement", "insample/improvement", "heldout/improvement",
           "insample/bound/lower_tight", "heldout/bound/lower_tight",
           "insample/bound/lower_tight_nonzero_std", "heldout/bound/lower_tight_nonzero_std",
           "sampling/logp_diff_max"]


def _mean(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return float(np.mean(vals)) if vals else float("nan")


def summarise(run_dir: str | Path, window: int = 10) -> str:
    rows = read_metrics(run_dir)
    if not rows:
        return f"{run_dir}: no metrics"
    n = min(window, len(rows))
    first, last = rows[:n], rows[-n:]
    lines = [f"run {run_dir}: {len(rows)} steps (means over the first and last {n} steps)",
             f"  {'metric':<42}{'first':>12}{'last':>12}"]
    for c in COLUMNS:
        if c in rows[0]:
            lines.append(f"  {c:<42}{_mean(first, c):>12.4g}{_mean(last, c):>12.4g}")
    if "improvement" in rows[0]:
        lines.append(f"  exact J over the training prompts: {rows[0]['j/pi_k']:.4f} -> {rows[-1]['j/pi_new']:.4f}")
        total = {k: sum(r.get(k, 0.0) for r in rows) for k in ("improvement", "insample/improvement", "heldout/improvement")}
        est = ", ".join(f"{k} {v:+.4f}" for k, v in total.items() if k in rows[0] and k != "improvement")
        lines.append(f"  summed over the steps: exact improvement {total['improvement']:+.4f}" + (f"; estimates: {est}" if est else ""))
        for prefix in ("insample", "heldout"):
            key = f"{prefix}/bound/lower_tight"
            if key in rows[0]:
                above = np.mean([r[key] > r["improvement"] for r in rows])
                lines.append(f"  steps where the {prefix} estimate of the tight bound exceeds the exact improvement: {above:.1%}")
    evals = [r for r in rows if "eval/j" in r or "eval/accuracy_greedy" in r]
    if evals:
        first_eval = {k.replace("eval_initial/", "eval/"): v for k, v in rows[0].items() if k.startswith("eval_initial/")}
        for key in ("eval/j", "eval/accuracy_sampled", "eval/accuracy_greedy"):
            if key in evals[-1]:
                lines.append(f"  test prompts, {key}: {first_eval.get(key, float('nan')):.4f} (initial) -> {evals[-1][key]:.4f} (final)")
    t = np.median([sum(r.get(k, 0.0) for k in r if k.startswith("time/")) for r in rows])
    lines.append(f"  median seconds per step: {t:.3f}")
    return "\n".join(lines)

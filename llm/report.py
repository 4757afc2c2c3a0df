"""What a run did, from its ``metrics.jsonl`` only: ``python -m llm.report RUN_DIR [RUN_DIR ...]``.

``summarise`` is a short text summary of one run (first and last steps of the main metrics, the exact and
estimated improvement, the evaluation on the test prompts); ``make run`` prints it. ``plot_runs`` draws several
runs overlaid (e.g. v = 1 against v = 4) in four PNGs: the reward, the evaluation on the test prompts, the TV
estimates, and the bound's estimates against the realised improvement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

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


# ----------------------------------------------------------------------------------------------
# Plots of one or more runs
# ----------------------------------------------------------------------------------------------

#: Curves of each figure: (metric, label, line style). A metric a run lacks is left out of its figure.
TV_CURVES = [("tv/pi_k_alpha", "TV(pi_k, alpha), IS estimate", "-"),
             ("tv/pi_k_alpha_chain_ub_est", "TV(pi_k, alpha), chain-rule bound (est.)", "--"),
             ("heldout/tv/pi_new_alpha", "TV(pi_k+1, alpha), held-out", "-."),
             ("insample/tv/pi_new_alpha", "TV(pi_k+1, alpha), in-sample (biased up)", ":")]
BOUND_ESTIMATES = [("heldout/bound/lower_tight", "held-out estimate"),
                   ("insample/bound/lower_tight", "in-sample estimate (biased up)")]
EVAL_CURVES = [("eval/j", "exact J", "-"), ("eval/accuracy_sampled", "accuracy, sampled", "--"),
               ("eval/accuracy_greedy", "accuracy, greedy", ":")]


def series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``key`` over the rows that carry it."""
    pts = [(r["step"], r[key]) for r in rows if key in r]
    return (np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)) if pts else \
        (np.array([]), np.array([]))


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    c = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def realised_improvement(rows: list[dict]) -> tuple[str, str] | None:
    """The improvement the bound is compared with: the exact one where the task allows it, else the held-out
    estimate."""
    for key, label in (("improvement", "exact improvement"), ("heldout/improvement", "held-out improvement (est.)")):
        if rows and key in rows[0]:
            return key, label
    return None


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short names of the runs: the directory name, with its parent where two names clash."""
    names = [Path(d).name for d in run_dirs]
    return [f"{Path(d).parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(run_dirs, names)]


def plot_runs(run_dirs: Sequence[str | Path], out_dir: str | Path, window: int = 10) -> dict[str, Path]:
    """Four PNGs of the runs overlaid, in ``out_dir``: ``reward.png`` (the training reward and its rolling mean over
    ``window`` steps), ``eval.png`` (the test prompts, after each evaluation; step 0 = before any update),
    ``tv.png`` (the TV estimates per step) and ``bound.png`` (per step, the tight bound's estimates against the
    realised improvement, and their cumulative sums). Figures whose metrics no run has are not written.
    Returns {name: path} of the written files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for d in run_dirs:
        if not (Path(d) / "metrics.jsonl").is_file():
            raise ValueError(f"run_dirs: {d} holds no metrics.jsonl (not a run directory of llm.train)")
        rows = read_metrics(d)
        if not rows:
            raise ValueError(f"run_dirs: {d}/metrics.jsonl holds no complete row")
        runs.append(rows)
    labels = run_labels([Path(d) for d in run_dirs])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written[name] = out / name

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for rows, label, color in zip(runs, labels, colors * len(runs)):
        k, r = series(rows, "reward")
        ax.plot(k, r, color=color, alpha=0.3, lw=0.8)
        ax.plot(k, rolling_mean(r, window), color=color, label=f"{label} (mean of {window} steps)")
    ax.set(xlabel="step", ylabel="mean reward of the step's completions", title="training reward")
    ax.legend(fontsize=8)
    save(fig, "reward.png")

    if any(key in r for rows in runs for r in rows for key, _, _ in EVAL_CURVES):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for rows, label, color in zip(runs, labels, colors * len(runs)):
            for key, name, style in EVAL_CURVES:
                k, v = series(rows, key)
                first = rows[0].get(key.replace("eval/", "eval_initial/"))
                if first is not None:  # the policy before any update, at step 0
                    k, v = np.insert(k + 1, 0, 0.0), np.insert(v, 0, first)
                elif len(k):
                    k = k + 1  # eval/* of step k is the policy after k + 1 updates
                if len(k):
                    ax.plot(k, v, style, marker="o", ms=3, color=color, label=f"{label}: {name}")
        ax.set(xlabel="updates", ylabel="on the test prompts", title="evaluation")
        ax.legend(fontsize=7)
        save(fig, "eval.png")

    if any(key in rows[0] for rows in runs for key, _, _ in TV_CURVES):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for rows, label, color in zip(runs, labels, colors * len(runs)):
            for key, name, style in TV_CURVES:
                k, v = series(rows, key)
                if len(k):
                    ax.plot(k, v, style, color=color, lw=1, label=f"{label}: {name}")
        ax.set(xlabel="step", ylabel="total variation", title="TV estimates per step")
        ax.legend(fontsize=7)
        save(fig, "tv.png")

    if any(realised_improvement(rows) and any(key in rows[0] for key, _ in BOUND_ESTIMATES) for rows in runs):
        fig, (ax, cum) = plt.subplots(1, 2, figsize=(12, 4.8))
        for rows, label, color in zip(runs, labels, colors * len(runs)):
            real = realised_improvement(rows)
            if real is None:
                continue
            k, imp = series(rows, real[0])
            cum.plot(k, np.cumsum(imp), color=color, label=f"{label}: {real[1]}")
            for (key, name), marker, style in zip(BOUND_ESTIMATES, "o^", ("--", ":")):
                pts = [(r[key], r[real[0]], r["step"]) for r in rows if key in r and real[0] in r]
                if not pts:
                    continue
                b, i, steps = (np.array(x, dtype=float) for x in zip(*pts))
                above = float(np.mean(b > i))
                ax.scatter(i, b, s=8, marker=marker, color=color, alpha=0.6,
                           label=f"{label}: {name} ({above:.0%} of steps above)")
                cum.plot(steps, np.cumsum(b), style, color=color,
                         label=f"{label}: bound, {name}" + ("" if len(b) == len(k) else f" ({len(b)} steps)"))
        lims = ax.get_xlim()
        ax.plot(lims, lims, "k-", lw=0.8, label="bound = improvement")
        ax.set(xlabel="realised improvement of the step", ylabel="tight lower bound (estimated)",
               title="Theorem 1 per step: points below the line are bounds that hold")
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_yscale("symlog", linthresh=1e-3)
        cum.set(xlabel="step", ylabel="sum over steps", title="cumulative improvement and bound")
        ax.legend(fontsize=7)
        cum.legend(fontsize=7)
        save(fig, "bound.png")
    return written


@dataclasses.dataclass
class ReportArgs:
    """Summaries and plots of llm.train run directories, from their metrics.jsonl only."""

    run_dirs: Annotated[tuple[Path, ...], tyro.conf.Positional]
    """One or more run directories (their output_dir); several are overlaid in every figure."""
    out: Path | None = None
    """Where the PNGs go (default: RUN_DIR/report for one run, the first run's parent/report for several)."""
    window: int = 10
    """Steps in the rolling mean of the reward and in the summary's first/last means."""

    def __post_init__(self):
        from runkit.validation import require

        require(self, len(self.run_dirs) >= 1, "run_dirs", "give at least one run directory")
        require(self, self.window >= 1, "window", "must be >= 1")


PROG = "python -m llm.report"


def main(args: list[str] | None = None) -> int:
    from runkit.cli import parse

    cfg = parse(ReportArgs, args, prog=PROG, description=ReportArgs.__doc__)
    out = cfg.out or (cfg.run_dirs[0] / "report" if len(cfg.run_dirs) == 1 else cfg.run_dirs[0].parent / "report")
    written = plot_runs(cfg.run_dirs, out, cfg.window)
    for d in cfg.run_dirs:
        print(summarise(d, cfg.window))
    print("wrote " + ", ".join(str(p) for p in written.values()))
    return 0


if __name__ == "__main__":
    from runkit.cli import run_main

    run_main(main, prog=PROG)

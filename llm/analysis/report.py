"""What a run did, from its ``metrics.jsonl`` only: ``python -m llm report RUN_DIR [RUN_DIR ...]``.

``summarise`` is a short text summary of one run (first and last steps of the main metrics, the exact and
estimated improvement, the evaluation on the test prompts); ``make run`` prints it. ``spread`` is where several runs
of one command end, with the spread across them (the report prints it after the summaries when given several).
``plot_runs`` draws several runs overlaid (e.g. v = 1 against v = 4) in four PNGs: the reward, the evaluation on the
test prompts, the TV estimates, and the bound's estimates against the realised improvement.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from grpo_theory.estimators import mean_and_standard_error

from llm.tensors.metrics import PHASE_KEYS, VOID_KEY, certificate_shares, step_seconds
from llm.run.plan import Plan, read_plan
from llm.run.rundir import read_metrics

COLUMNS = ["reward", "j/pi_new", "improvement", "heldout/improvement", "insample/improvement",
           "tv/pi_k_alpha", "heldout/tv/pi_k_alpha", "tv/pi_k_alpha_chain_ub_est", "heldout/tv/pi_new_alpha",
           "insample/tv/pi_new_alpha", "ess/pi_k_alpha", "heldout/ess/pi_new_alpha",
           "heldout/bound_est/lower_tight", "heldout/bound_est/lower_tight_nonzero_std",
           "heldout/bound_est/frac_lower_tight_positive_nonzero_std", "insample/bound_est/lower_tight",
           "heldout/tv/token_max", "heldout/tv/token_mean", "heldout/bound_est/trm_lower",
           "is_weight/max", "sampling/mismatch_kl", "is_correction/frac_above_cap", "kl", "kl/k3",
           "sampling/logp_diff_max", "tools/call_frequency", "tools/failure_frequency", "episode/turn_ess"]
#: A held-out estimate is judged against the exact value in units of its standard error.
SE_MULTIPLE = 3.0


def _mean(rows: list[dict], key: str) -> float:
    """Mean of ``key`` over the rows that carry a number for it (nan, a quantity the step could not estimate, e.g.
    a mean over prompts with varied rewards when none varied, is left out)."""
    vals = [r[key] for r in rows if key in r and not np.isnan(r[key])]
    return float(np.mean(vals)) if vals else float("nan")


def _share(flags) -> str:
    flags = list(flags)
    return f"{sum(flags)} of {len(flags)} ({np.mean(flags):.1%})" if flags else "none"


def summarise(run_dir: str | Path, window: int = 10) -> str:
    """The run in numbers, from metrics.jsonl alone: means of the main metrics over the first and last ``window``
    steps and over all, then what the estimates did against the exact values where the task has them."""
    rows = read_metrics(run_dir)
    if not rows:
        return f"{run_dir}: no metrics"
    n = min(window, max(1, len(rows) // 2))  # first and last never overlap (one step: the same row)
    first, last = rows[:n], rows[-n:]
    lines = [f"run {run_dir}: {len(rows)} step{'s' if len(rows) > 1 else ''} (means over the first and last "
             f"{n} step{'s' if n > 1 else ''}, and over all)",
             f"  {'metric':<56}{'first':>11}{'last':>11}{'all':>11}"]
    stored = read_plan(run_dir)  # what the run decided (a run written before plans has none)
    if stored is not None:
        lines[1:1] = ["  " + line for line in Plan.from_dict(stored).lines()]
    for c in COLUMNS:
        if any(c in r for r in rows):
            lines.append(f"  {c:<56}{_mean(first, c):>11.4g}{_mean(last, c):>11.4g}{_mean(rows, c):>11.4g}")
    lines += exact_comparison(rows)
    lines += certificate_lines(rows, run_level(run_dir))
    lagged = [r for r in rows if r.get("lag", 0) > 0]
    if lagged:
        lines.append(f"  steps with lag > 0: {len(lagged)}; their mean tv/pi_k_alpha {_mean(lagged, 'tv/pi_k_alpha'):.4f}"
                     f", largest is_weight/max {np.nanmax([r['is_weight/max'] for r in lagged]):.3g}")
        by_lag = sorted({r["lag"] for r in rows})
        lines.append("  tv/pi_k_alpha by lag: " + ", ".join(
            f"{lag}: {_mean([r for r in rows if r['lag'] == lag], 'tv/pi_k_alpha'):.4f}" for lag in by_lag))
        chain = [r for r in lagged if "tv/pi_k_alpha_chain_ub_est" in r]
        if chain:
            lines.append("  chain-rule estimate below the importance-sampled TV estimate on "
                         f"{_share(r['tv/pi_k_alpha_chain_ub_est'] < r['tv/pi_k_alpha'] for r in chain)} of them")
    reasons = [r["sync/reason"] for r in rows if r.get("sync/reason")]
    if reasons:  # step 0's sampler holds the initial policy: the first of the syncs the plan and start-up count
        counts = {k: reasons.count(k) for k in dict.fromkeys(reasons)}
        first = 1 if rows[0].get("step") == 0 else 0
        lines.append(f"  weight syncs: {len(reasons) + first} (" + ("step 0's, then " if first else "") + "by reason: "
                     + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")")
    dropped = sum(r.get("dropped_stale", 0.0) for r in rows)
    if dropped:
        lines.append(f"  steps dropped for staleness (lag > max_staleness, no update): {dropped:.0f}")
    checks = [r["sampling/logp_diff_max"] for r in rows if "sampling/logp_diff_max" in r]
    if checks:
        lines.append(f"  sync check: sampler against trainer log-probs on {len(checks)} steps, worst token "
                     f"{max(checks):.2g} (sampling/logp_diff_max)")
    evals = [r for r in rows if "eval/j" in r or "eval/accuracy_greedy" in r]
    if evals:
        first_eval = {k.replace("eval_initial/", "eval/"): v for k, v in rows[0].items() if k.startswith("eval_initial/")}
        for key in ("eval/j", "eval/accuracy_sampled", "eval/accuracy_greedy"):
            if key in evals[-1]:
                during = ", ".join(f"{r[key]:.3f}" for r in evals[:-1])
                lines.append(f"  test prompts ({evals[-1]['eval/num_prompts']:.0f}), {key}: "
                             f"{first_eval.get(key, float('nan')):.4f} (initial) -> "
                             f"{evals[-1][key]:.4f} (final)" + (f"; at the evaluations between: {during}" if during
                                                                 else ""))
    calls = [r for r in rows if "sampling/call_tokens" in r]
    if calls:
        tokens = sum(r["sampling/call_tokens"] for r in calls)
        seconds = sum(r["sampling/call_tokens"] / r["time/sampler_tokens_per_s"] for r in calls)
        lines.append(f"  generation: {tokens:.0f} tokens in {len(calls)} sampler calls, {tokens / seconds:.0f} tokens/s")
    times = {k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in PHASE_KEYS}
    totals = [step_seconds(r) for r in rows]
    phases = ", ".join(f"{k[5:]} {v:.2f}" for k, v in times.items() if v > 0.005)
    lines.append(f"  seconds per step: median {np.median(totals):.3f}, mean {np.mean(totals):.3f} (mean per phase: "
                 f"{phases})")
    return "\n".join(lines)


#: The metrics whose spread across runs ``spread`` prints: where a curve ends, not how a step was estimated.
SPREAD_COLUMNS = ["reward", "j/pi_new", "improvement", "tv/pi_k_alpha", "heldout/improvement", "eval/j",
                  "eval/accuracy_sampled", "eval/accuracy_greedy", "tools/call_frequency"]


def spread(run_dirs: Sequence[str | Path], window: int = 10) -> str:
    """Where several runs of one command (seeds, hosts, thread counts) end: per metric, each run's mean over its last
    ``window`` steps (all of them in a shorter run; an evaluation metric, and the exact J once more: its last value),
    in the order the runs are given ("-" where one did not log it), then their mean, sample standard deviation and
    range across the runs that did. One run's end is one draw; this is the spread to quote."""
    runs = [read_metrics(d) for d in run_dirs]
    shortest = min(len(rows) for rows in runs)
    named = ", ".join(f"[{k + 1}] {d}" for k, d in enumerate(run_dirs))
    lines = [f"across {len(runs)} runs ({named}): the last {min(window, shortest) if shortest else window} steps' "
             "mean of each run (evaluations and 'last step': the last value), then mean +- sample sd [min, max] over "
             "the runs that logged it"]
    for key, last in [(k, k.startswith("eval/")) for k in SPREAD_COLUMNS] + [("j/pi_new", True)]:
        ends: list[float | None] = []
        for rows in runs:
            has = [r for r in rows if key in r and not np.isnan(r[key])]
            ends.append((has[-1][key] if last else _mean(has[-window:], key)) if has else None)
        e = np.asarray([x for x in ends if x is not None])
        if e.size < 2:
            continue
        label = f"{key} (last step)" if last and not key.startswith("eval/") else key
        lines.append(f"  {label:<28} " + " ".join("-" if x is None else f"{x:.4g}" for x in ends) +
                     f"  ->  {e.mean():.4g} +- {e.std(ddof=1):.2g} [{e.min():.4g}, {e.max():.4g}]")
    if len(lines) == 1:
        lines.append("  no metric is logged by two or more of them")
    return "\n".join(lines)


def run_level(run_dir: str | Path) -> float:
    """The run's certificate level (``improvement_lcb_level`` in its config.json; 0.95, the default, without one)."""
    try:
        config = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return 0.95
    return float(config.get("improvement_lcb_level", 0.95))


def certificate_lines(rows: list[dict], level: float = 0.95) -> list[str]:
    """How often the improvement certificate (``heldout/improvement_lcb`` > 0) and Theorem 1's held-out estimate
    (``heldout/bound_est/lower_tight`` > 0) say a step improved J, over every step that logged the certificate (an
    abstention counts as not certified: ``llm.tensors.metrics.certificate_shares``); with the exact improvement, how often
    the lower confidence bound exceeded it (at level L, at most about 1 - L of the steps when it keeps its level)."""
    shares = certificate_shares(rows, level)
    logged = [r for r in rows if "heldout/improvement_lcb" in r]
    void = [r for r in rows if r.get(VOID_KEY)]
    lines = []
    if void:
        lines.append(f"  certificates: void. The run stopped at step {void[0].get('bound/void_step')} on a reward outside "
                     "its declared range, so every certificate it logged (heldout/improvement_lcb, eval/improvement_lcb)"
                     " was claimed under a declaration the data refuted: none is counted")
    if not logged:
        return lines
    undeclared = [r for r in rows if r.get("bound/range_declared") == 0.0]
    why = ("no reward range was declared" if undeclared else
           "too few held-out prompts, or log alpha recomputed by the trainer")
    if undeclared:
        lines.append(f"  reward range: not declared on {len(undeclared)} of {len(rows)} steps: Theorem 1's terms used the "
                     "range seen (bound/reward_lo|hi; no guarantee) and the certificates abstained (nan); declare it "
                     "with --reward-range LOW HIGH")
    estimate = (f"Theorem 1's held-out estimate (heldout/bound_est/lower_tight > 0): "
                f"{_share(r.get('heldout/bound_est/lower_tight', float('nan')) > 0 for r in logged)}")
    if void:
        lines.append(f"  improvement certificate (heldout/improvement_lcb): void on all {len(logged)} steps; {estimate}")
    elif shares["abstained"] == 1:
        lines.append(f"  improvement certificate (heldout/improvement_lcb): abstained on all {len(logged)} steps ({why});"
                     f" {estimate}")
    else:
        abstained = f" (it abstained on {shares['abstained']:.0%}: {why})" if shares["abstained"] else ""
        lines.append(f"  improvement certificate (heldout/improvement_lcb > 0): {shares['certified']:.0%} of "
                     f"{len(logged)} steps{abstained}; {estimate}")
    if "e_bh" in shares:
        lines.append(f"  across the run (e-values heldout/improvement_e): certified steps {shares['e_bh']:.0%} by e-BH "
                     f"(the expected share of false ones among them at most {1 - level:.0%}, at level {level:g}), "
                     f"{shares['spending']:.0%} by alpha-spending (none false, with probability >= {level:g}); a "
                     "positive heldout/improvement_lcb is "
                     "each step's own claim, not the run's")
    if "above_exact" in shares:
        lines.append(f"  heldout/improvement_lcb above the exact improvement on {shares['above_exact']:.0%} of "
                     f"{len(logged)} steps")
    run_cert = [r for r in rows if "eval/improvement_lcb" in r]
    if run_cert:
        last = run_cert[-1]
        bound = lambda key: "abstained" if not math.isfinite(last.get(key, math.nan)) else (  # noqa: E731
            f"{last[key]:+.4f}" + (" (certified)" if last[key] > 0 else " (not certified)"))
        lines.append(f"  run certificate at step {last['step']} (eval/improvement_lcb, paired per test prompt since the "
                     "first evaluation; a union bound over the evaluations and the two accuracies, so every bound holds "
                     f"at once with probability >= the level): sampled accuracy {bound('eval/improvement_lcb')}, "
                     f"greedy {bound('eval/improvement_lcb_greedy')}" + ("; void, as above" if void else ""))
    return lines


def exact_comparison(rows: list[dict]) -> list[str]:
    """Lines comparing the estimates with the exact improvement (tasks with exact J): sums over the steps, the
    held-out estimate's error in its own standard errors, and how often an estimated bound exceeded the exact
    improvement (at all, and by more than ``SE_MULTIPLE`` standard errors of the held-out estimate), over the steps
    where it was measured (all of them unless ``--exact-j-steps`` > 1)."""
    every = len(rows)
    rows = [r for r in rows if "improvement" in r]
    if not rows:
        return []
    exact = np.array([r["improvement"] for r in rows])
    measured = "" if len(rows) == every else f" (measured on {len(rows)} of {every} steps: --exact-j-steps)"
    lines = [f"  exact J over the training prompts: {rows[0]['j/pi_k']:.4f} -> {rows[-1]['j/pi_new']:.4f}; exact "
             f"improvement positive on {_share(exact > 0)} steps{measured}"]
    sums = {k: sum(r.get(k, 0.0) for r in rows) for k in ("heldout/improvement", "insample/improvement")
            if k in rows[0]}
    lines.append(f"  summed over the steps: exact improvement {exact.sum():+.4f}" +
                 "".join(f"; {k} {v:+.4f}" for k, v in sums.items()))
    if "heldout/improvement_se" in rows[0]:
        diff = np.array([r["heldout/improvement"] for r in rows]) - exact
        se = np.array([r["heldout/improvement_se"] for r in rows])
        _, spread = mean_and_standard_error(diff)
        lines.append(f"  heldout/improvement - exact: mean {diff.mean():+.5f} ± {spread:.5f} (standard error over the "
                     f"steps); within {SE_MULTIPLE:g} of its standard errors on {_share(np.abs(diff) <= SE_MULTIPLE * se)}"
                     " steps")
    for prefix in ("heldout", "insample"):
        key = f"{prefix}/bound_est/lower_tight"
        if key in rows[0]:
            bound = np.array([r[key] for r in rows])
            line = f"  {key} above the exact improvement on {_share(bound > exact)} steps"
            if f"{key}_se" in rows[0]:
                se = np.array([r[f"{key}_se"] for r in rows])
                line += f"; by more than {SE_MULTIPLE:g} standard errors on {_share(bound - exact > SE_MULTIPLE * se)}"
            lines.append(line)
    if "heldout/bound_est/trm_lower" in rows[0]:
        trm = np.array([r["heldout/bound_est/trm_lower"] for r in rows])
        tight = np.array([r.get("heldout/bound_est/lower_tight", np.nan) for r in rows])
        lines.append(f"  heldout/bound_est/trm_lower (Trust Region Masking's unified bound) above the exact improvement "
                     f"on {_share(trm > exact)} steps, positive on {_share(trm > 0)}; above Theorem 1's held-out tight "
                     f"bound on {_share(trm > tight)}")
    return lines


# ----------------------------------------------------------------------------------------------
# Plots of one or more runs
# ----------------------------------------------------------------------------------------------

#: Curves of each figure: (metric, label, line style). A metric a run lacks is left out of its figure.
TV_CURVES = [("tv/pi_k_alpha", "TV(pi_k, alpha), IS estimate", "-"),
             ("tv/pi_k_alpha_chain_ub_est", "TV(pi_k, alpha), chain-rule bound (est.)", "--"),
             ("heldout/tv/pi_new_alpha", "TV(pi_k+1, alpha), held-out", "-."),
             ("insample/tv/pi_new_alpha", "TV(pi_k+1, alpha), in-sample (biased up)", ":"),
             ("heldout/tv/token_max", "max per-token TV(pi_k, pi_k+1), held-out prefixes", "x-")]
BOUND_ESTIMATES = [("heldout/bound_est/lower_tight", "Theorem 1, held-out estimate"),
                   ("insample/bound_est/lower_tight", "Theorem 1, in-sample estimate (biased up)"),
                   ("heldout/bound_est/trm_lower", "TRM unified bound, held-out estimate")]
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
    """The improvement the bound is compared with: the exact one where the task allows it and every step measured it
    (``--exact-j-steps`` 1), else the held-out estimate."""
    for key, label in (("improvement", "exact improvement"), ("heldout/improvement", "held-out improvement (est.)")):
        if rows and all(key in r for r in rows):
            return key, label
    return None


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short names of the runs: the directory name, with its parent where two names clash."""
    names = [Path(d).name for d in run_dirs]
    return [f"{Path(d).parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(run_dirs, names)]


def load_runs(run_dirs: Sequence[str | Path]) -> list[list[dict]]:
    """The metrics rows of each run directory; one that is not a run is a one-line error."""
    runs = []
    for d in run_dirs:
        if not (Path(d) / "metrics.jsonl").is_file():
            raise ValueError(f"run_dirs: {d} holds no metrics.jsonl (not a run directory of llm.train)")
        rows = read_metrics(d)
        if not rows:
            raise ValueError(f"run_dirs: {d}/metrics.jsonl holds no complete row")
        runs.append(rows)
    return runs


#: Why a figure of ``plot_runs`` is not drawn: no run logged its metrics, and the option that logs them.
UNDRAWN = {"eval.png": "no run evaluated on the test prompts (--eval-steps)",
           "tv.png": "no run logged a TV estimate",
           "bound.png": "no run logged Theorem 1's estimates (--heldout-prompts, or --insample-diagnostics)"}


def plot_runs(run_dirs: Sequence[str | Path], out_dir: str | Path, window: int = 10) -> dict[str, Path]:
    """Four PNGs of the runs overlaid, in ``out_dir``: ``reward.png`` (the training reward and its rolling mean over
    ``window`` steps), ``eval.png`` (the test prompts, after each evaluation; step 0 = before any update),
    ``tv.png`` (the TV estimates per step, all in [0, 1]) and ``bound.png`` (per step, the tight bound's estimates
    against the realised improvement on symmetric-log axes, and their cumulative sums). Figures whose metrics no run
    has are not written. Returns {name: path} of the written files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(run_dirs)
    labels = run_labels([Path(d) for d in run_dirs])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = list(zip(runs, labels, colors * len(runs)))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    figures = {"reward.png": (True, reward_figure, (7, 4.5)),
               "eval.png": (any(k in r for rows in runs for r in rows for k, _, _ in EVAL_CURVES), eval_figure,
                            (7, 4.5)),
               "tv.png": (any(k in rows[0] for rows in runs for k, _, _ in TV_CURVES), tv_figure, (7, 4.5)),
               "bound.png": (any(k in rows[0] for rows in runs for k, _ in BOUND_ESTIMATES), bound_figure, (12, 4.8))}
    for name, (wanted, draw, size) in figures.items():
        if not wanted:
            continue
        fig = plt.figure(figsize=size)
        draw(fig, drawn, window)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written[name] = out / name
    return written


def reward_figure(fig, drawn, window: int) -> None:
    ax = fig.add_subplot()
    for rows, label, color in drawn:
        k, r = series(rows, "reward")
        ax.plot(k, r, color=color, alpha=0.3, lw=0.8)
        w = min(window, len(k))
        ax.plot(k, rolling_mean(r, w), color=color, label=f"{label} (mean of {w} step{'s' if w > 1 else ''})")
    ax.set(xlabel="step", ylabel="mean reward of the step's completions", title="training reward")
    ax.legend(fontsize=8)


def after_updates(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """An ``eval/*`` series against the number of updates before it: step k's is the policy after k + 1 updates,
    and ``eval_initial/*`` (logged at step 0) the policy before any."""
    k, v = series(rows, key)
    first = rows[0].get(key.replace("eval/", "eval_initial/"))
    if first is not None:
        return np.insert(k + 1, 0, 0.0), np.insert(v, 0, first)
    return k + 1, v


def curves_figure(fig, drawn, curves, at=series, line: dict | None = None, **axes) -> None:
    """Each run's ``curves`` ((key, name, style) per curve) on one axis: ``at(rows, key)`` gives a curve's x and y,
    ``line`` the lines' settings, ``axes`` the axis' labels and limits."""
    ax = fig.add_subplot()
    for rows, label, color in drawn:
        for key, name, style in curves:
            k, v = at(rows, key)
            if len(k):
                ax.plot(k, v, style, color=color, label=f"{label}: {name}", **(line or {}))
    ax.set(**axes)
    ax.legend(fontsize=7)


def eval_figure(fig, drawn, window: int) -> None:
    curves_figure(fig, drawn, EVAL_CURVES, after_updates, dict(marker="o", ms=3), xlabel="updates",
                  ylabel="on the test prompts", title="evaluation")


def tv_figure(fig, drawn, window: int) -> None:
    curves_figure(fig, drawn, TV_CURVES, series, dict(lw=1), xlabel="step", ylim=(0, None),
                  ylabel="total variation (estimates in [0, 1])", title="TV estimates per step")


def bound_figure(fig, drawn, window: int) -> None:
    """Left: each step's estimated tight bound against its realised improvement (exact, else held-out), or per step
    when no run logged an improvement; right: both summed over the steps."""
    ax, cum = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    by_step = not any(realised_improvement(rows) for rows, _, _ in drawn)  # nothing to set the bound against
    for rows, label, color in drawn:
        real = realised_improvement(rows)
        if real is not None:
            k, imp = series(rows, real[0])
            cum.plot(k, np.cumsum(imp), color=color, label=f"{label}: {real[1]}")
        for (key, name), marker, style in zip(BOUND_ESTIMATES, "o^s", ("--", ":", "-.")):
            pts = [(r[key], r[real[0]] if real else 0.0, r["step"]) for r in rows if key in r and (
                real is None or real[0] in r)]
            if not pts:
                continue
            b, i, steps = (np.array(x, dtype=float) for x in zip(*pts))
            if by_step:
                ax.plot(steps, b, style, marker=".", color=color, lw=0.8, label=f"{label}: {name}")
            elif real is not None:
                ax.scatter(i, b, s=8, marker=marker, color=color, alpha=0.6,
                           label=f"{label}: {name} ({float(np.mean(b > i)):.0%} of steps above)")
            cum.plot(steps, np.cumsum(b), style, color=color, label=f"{label}: bound, {name}")
    if by_step:
        ax.set(xlabel="step", ylabel="lower bound (estimated)",
               title="Theorem 1 and TRM per step (no realised improvement logged to compare with)")
    else:
        lims = ax.get_xlim()
        ax.plot(lims, lims, "k-", lw=0.8, label="bound = improvement")
        ax.set(xlabel="realised improvement of the step", ylabel="lower bound (estimated)",
               title="Theorem 1 and TRM per step: points below the line are bounds that hold")
        ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_yscale("symlog", linthresh=1e-3)
    cum.set(xlabel="step", ylabel="sum over steps", title="cumulative improvement and bound")
    ax.legend(fontsize=7)
    cum.legend(fontsize=7)

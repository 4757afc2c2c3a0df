"""Regenerate every figure: ``make figures`` (or ``python figures/plot_all.py``).

Inputs (run directories) come from ``python -m grpo_theory.experiments --out runs/bandit`` and,
for the LLM figures (figures/llm/, drawn as ``python -m llm report`` draws them), from ``python -m llm train
--output-dir runs/arithmetic_v1`` and ``... runs/arithmetic_v4 --sync-period 4`` (skipped if absent). Closed-form curves (penalty weight, success amplification)
are evaluated with the package's own functions. PNGs are written next to this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import grpo_theory as gt  # noqa: E402
from grpo_theory.experiments import ABLATION, V_SWEEP, slug  # noqa: E402
from grpo_theory.simulate import final_j  # noqa: E402
from runkit.runio import load_runs  # noqa: E402

HERE = Path(__file__).parent


def save(fig, name: str) -> None:
    fig.tight_layout()
    fig.savefig(HERE / name, dpi=110)
    plt.close(fig)
    print(f"wrote figures/{name}")


def bound_vs_improvement(runs_root: Path) -> None:
    runs = load_runs(runs_root / "vsweep")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    for ax, key, title in ((axes[0], "bound/lower", "paper constant (c = 2)"),
                           (axes[1], "bound/lower_tight", "tight constant (c = reward range)")):
        for i, v in enumerate(V_SWEEP):
            rows = [r for seed in runs.get(f"v{v}", []) for r in seed]
            x = np.array([r[key] for r in rows])
            y = np.array([r["improvement"] for r in rows])
            ok = np.isfinite(x) & (x > -0.3)
            ax.scatter(x[ok], y[ok], s=4, alpha=0.4, color=plt.cm.viridis(i / len(V_SWEEP)), label=f"v={v}")
        lim = [-0.3, 0.1]
        ax.plot(lim, lim, "k--", lw=1, label="y = x")
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlim(lim)
        ax.set_xlabel(f"Theorem 1 lower bound, {title}")
        ax.set_title("every point must lie above y = x")
    axes[0].set_ylabel("realised improvement J(pi_k+1) - J(pi_k)")
    axes[1].legend(markerscale=3, fontsize=8)
    save(fig, "bound_vs_improvement.png")


def penalty_weight() -> None:
    p = np.linspace(0, 1, 801)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for eps in (0.0, 1e-4, 1e-2, 0.1, 0.75):
        with np.errstate(divide="ignore"):
            ax.plot(p, gt.bernoulli_penalty_weight(p, eps), label=f"eps = {eps:g}")
    ax.set_yscale("log")
    ax.set_ylim(1e-2, 1e3)
    ax.set_xlabel("success probability p under alpha")
    ax.set_ylabel("(1 - s)/s,  s = sqrt(p(1-p) + eps)")
    ax.set_title("Bernoulli penalty weight of TV(pi, alpha)")
    ax.legend(fontsize=8)
    save(fig, "bernoulli_penalty_weight.png")


def ablation_curves(runs_root: Path) -> None:
    runs = load_runs(runs_root / "ablation")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ABLATION:
        seeds = runs.get(slug(name), [])
        if not seeds:
            continue
        j = np.array([[r["j/pi_k"] for r in rows] for rows in seeds])
        m, s = j.mean(0), j.std(0)
        ax.plot(m, label=name)
        ax.fill_between(np.arange(len(m)), m - s, m + s, alpha=0.2)
    ax.set_xlabel("step k")
    ax.set_ylabel("J(pi_k) (exact, mean ± std over seeds)")
    ax.set_title("Bandit ablation (Algorithm 1)")
    ax.legend(fontsize=8)
    save(fig, "ablation_rewards.png")


def tv_and_j_vs_v(runs_root: Path) -> None:
    runs = load_runs(runs_root / "vsweep")
    vs, tv, tv_s, fj, fj_s = [], [], [], [], []
    for v in V_SWEEP:
        seeds = runs.get(f"v{v}", [])
        if not seeds:
            continue
        t = [np.mean([r["tv/pi_k_alpha"] for r in rows]) for rows in seeds]
        f = [final_j(rows) for rows in seeds]
        vs.append(v); tv.append(np.mean(t)); tv_s.append(np.std(t)); fj.append(np.mean(f)); fj_s.append(np.std(f))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.errorbar(vs, tv, tv_s, marker="o", color="C0", capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sync period v")
    ax.set_ylabel("mean TV(pi_k, alpha)", color="C0")
    ax2 = ax.twinx()
    ax2.errorbar(vs, fj, fj_s, marker="s", color="C1", capsize=3)
    ax2.set_ylabel("final J", color="C1")
    ax.set_title("Lag cost vs sync period (bandit)")
    save(fig, "tv_and_final_j_vs_v.png")


def success_amplification() -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for i, beta in enumerate((0.5, 1.0, 2.0)):
        it = gt.success_iterates(0.2, beta, 1e-3, 15)
        axes[0].plot(it, marker=".", label=f"beta = {beta}")
    axes[0].axhline(0.2, color="grey", lw=0.5)
    axes[0].set_xlabel("iteration n")
    axes[0].set_ylabel("p_n")
    axes[0].set_title("p_n = h(p_{n-1}), p_0 = p_ref = 0.2, eps = 1e-3")
    axes[0].legend(fontsize=8)
    p_ref = np.linspace(0.02, 0.98, 97)
    for beta in (0.5, 1.0, 2.0, 5.0):
        axes[1].plot(p_ref, [float(gt.success_fixed_point(p, beta, 1e-3)) for p in p_ref], label=f"beta = {beta}")
    axes[1].plot([0, 1], [0, 1], "k--", lw=1, label="p* = p_ref")
    axes[1].set_xlabel("p_ref")
    axes[1].set_ylabel("smallest fixed point p* above p_ref")
    axes[1].set_title("Success amplification fixed points")
    axes[1].legend(fontsize=8)
    save(fig, "success_amplification.png")


def llm_runs(llm_dirs: list[Path]) -> None:
    """The LLM runs' figures overlaid, drawn by ``python -m llm report``'s own code (``llm.analysis.report.plot_runs``:
    reward, evaluation, TV estimates, Theorem 1's estimates against the exact improvement) into figures/llm/."""
    present = [d for d in llm_dirs if (d / "metrics.jsonl").is_file()]
    if not present:
        print("no LLM run directories (make run writes runs/arithmetic_v4); skipping figures/llm/")
        return
    from llm.analysis.report import plot_runs

    for name in plot_runs(present, HERE / "llm"):
        print(f"wrote figures/llm/{name}")


def trm_bounds_vs_length(lengths=range(1, 11), seeds: int = 20) -> None:
    """Every bound of arXiv 2512.23075 and Theorem 1 against the exact improvement on tabular autoregressive models
    (``grpo_theory.trm``): V = 2, every prefix's logits N(0, 1), Bernoulli(0.3) rewards, and pi one step of size 0.2
    up mu's advantages (logits + 0.2 A^mu(c, a) at every prefix: an improving step); the median over ``seeds`` pairs
    at each length T."""
    from grpo_theory import trm

    rows = {k: [] for k in ("improvement", "surrogate_gain", "theorem1", "theorem1_paper") + trm.BOUND_NAMES
            + ("unified",)}
    for T in lengths:
        per_seed = {k: [] for k in rows}
        for seed in range(seeds):
            rng = np.random.default_rng(1000 * T + seed)
            base = trm.random_tree(rng, 2, T)
            mu = trm.TokenTree.from_logits(base)
            reward = (rng.random(2 ** T) < 0.3).astype(float)
            v = mu.values(reward)
            pi = trm.TokenTree.from_logits([z + 0.2 * (v[t + 1].reshape(z.shape) - v[t][:, None])
                                            for t, z in enumerate(base)])
            e = trm.exact_bounds(pi, mu, reward)
            per_seed["improvement"].append(e["improvement"])
            per_seed["surrogate_gain"].append(e["surrogate_gain"])
            for k in trm.BOUND_NAMES + ("unified",):
                per_seed[k].append(e[f"lower/{k}"])
            for key, tight in (("theorem1", True), ("theorem1_paper", False)):
                per_seed[key].append(float(gt.improvement_lower_bound(
                    pi.sequence_probs(), mu.sequence_probs(), mu.sequence_probs(), reward, 0.0, tight=tight)))
        for k in rows:
            rows[k].append(float(np.median(per_seed[k])))
    T = list(lengths)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(T, rows["improvement"], "k-", lw=2, label="exact improvement J(pi) - J(mu)")
    ax.plot(T, rows["surrogate_gain"], "k:", label="surrogate gain L_mu(pi) - J(mu)")
    for k in trm.BOUND_NAMES + ("unified",):
        ax.plot(T, rows[k], marker="o", ms=3, label=f"TRM {k}" if k != "unified" else "TRM unified (min)")
    ax.plot(T, rows["theorem1"], "s--", ms=3, label="Theorem 1, tight constant (alpha = mu)")
    ax.plot(T, rows["theorem1_paper"], "^--", ms=3, label="Theorem 1, paper constant c = 2")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("sequence length T (V = 2)")
    ax.set_ylabel("lower bound on the improvement (median of 20 pairs)")
    ax.set_title("every curve must lie below the exact improvement")
    ax.legend(fontsize=7)
    save(fig, "trm_bounds_vs_length.png")
    for k, v in rows.items():
        print(f"  {k:>16}: " + " ".join(f"{x:+.2e}" for x in v))


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path("runs")
    penalty_weight()
    trm_bounds_vs_length()
    success_amplification()
    if (root / "bandit" / "vsweep").is_dir():
        bound_vs_improvement(root / "bandit")
        tv_and_j_vs_v(root / "bandit")
    if (root / "bandit" / "ablation").is_dir():
        ablation_curves(root / "bandit")
    llm_runs([root / "arithmetic_v1", root / "arithmetic_v4"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

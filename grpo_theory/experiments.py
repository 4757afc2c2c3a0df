"""Bandit experiments: --experiment ablation, vsweep, staleness, frontier, syncpolicy or all.

- ablation: the paper's four GRPO configurations in bandit form, on-policy (v=1, i=1), on-policy +
  zero-variance mask, off-policy (v=10, i=1), sample reuse (v=1, i=10): final J, steps to reach a
  target J, wall time; mean ± std over seeds.
- vsweep: v in {1, 2, 4, 8, 16, 32}: final J, mean TV(pi_k, alpha), fraction of steps with a positive
  bound (paper and tight constants), steps where the exact bound exceeds the realised improvement
  (must be 0).
- staleness: v in {1, 2, 4, 8, 16}, synchronous and with asynchronous generation (alpha one window older:
  lag v to 2v - 1): the same columns and the mean lag, to show what the extra staleness costs the guarantee.
- frontier: the off-policy corrections (the paper's clip, TRL's truncated and masked weight, IcePop's two-sided mask,
  M2PO's second-moment mask, Trust Region Masking, no correction, TRL 1.16's CISPO, SAPO and VESPO, DPPO's trust
  regions) at staleness v in {1, 4, 16, 64, 256, never}, synchronous and asynchronous: the exact
  J gain, mean TV(pi_k, alpha), mean ESS of pi_k/alpha, the share of steps the held-out improvement certificate
  (``heldout/improvement_lcb`` > 0) certifies, and whether the gain is within one standard deviation of the paper's
  clip at v = 1 (synchronous).
- syncpolicy: fixed v in {1, 4, 10} against the divergence policy (sync when the exact TV(pi_k, alpha) exceeds a
  budget, lag capped at ``SYNC_MAX_LAG``) at three budgets, synchronous and asynchronous (one step ahead, on the
  projected TV): final J, number of syncs, mean TV, mean lag.

Each run writes a run directory under ``<out>/<experiment>/<name>/seed<k>``; the table is printed
and written to ``<out>/<experiment>/results.md``. The figures in ``figures/`` read these directories.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Literal

import numpy as np

from runkit.cli import parse, run_main
from runkit.tables import mean_std as _pm
from runkit.validation import require

from .corrections import ICEPOP, ICEPOP_LABEL
from .loss_types import FRONTIER_OBJECTIVES
from .estimators import CERTIFICATE_MIN_PROMPTS
from .simulate import SimConfig, bound_violations, final_j, simulate, steps_to_target

#: The paper's four GRPO configurations (its GSM8K ablation), as settings that the bandit simulator and the language
#: model trainer (``llm.analysis.ablation``) both take. Every configuration states the zero-variance mask: off for plain
#: on-policy GRPO, on for the others, as the paper's off-policy runs use it.
ABLATION = {
    "on-policy (v=1, i=1)": dict(sync_period=1, num_iterations=1, mask_zero_std_groups=False),
    "on-policy + mask": dict(sync_period=1, num_iterations=1, mask_zero_std_groups=True),
    "off-policy (v=10, i=1)": dict(sync_period=10, num_iterations=1, mask_zero_std_groups=True),
    "sample reuse (v=1, i=10)": dict(sync_period=1, num_iterations=10, mask_zero_std_groups=True),
}
V_SWEEP = (1, 2, 4, 8, 16, 32)
STALENESS_V = (1, 2, 4, 8, 16)
#: The staleness frontier: sync periods (None: never after the first step) and the corrections compared there.
FRONTIER_V = (1, 4, 16, 64, 256, None)
FRONTIER_CORRECTIONS = {
    "paper clip": dict(importance_sampling_mode="paper"),
    "TRL truncate (C=3)": dict(importance_sampling_mode="token_truncate", importance_sampling_cap=3.0),
    "TRL mask (C=3)": dict(importance_sampling_mode="token_mask", importance_sampling_cap=3.0),
    ICEPOP_LABEL: dict(ICEPOP),
    "M2PO (tau=0.04)": dict(importance_sampling_mode="m2po", m2_threshold=0.04),
    "M2PO, AReaL's mask (tau=0.04)": dict(importance_sampling_mode="m2po_areal", m2_threshold=0.04),
    "TRM seq_max_k2 (k2 <= 0.24)": dict(importance_sampling_mode="seq_max_k2"),
    "none (no correction)": dict(importance_sampling_mode="none"),  # TRL's vllm_importance_sampling_correction=False
    # TRL 1.16's CISPO, SAPO, VESPO, DPPO's trust regions (``grpo_theory.objectives``), VCPO's step and baseline
    **FRONTIER_OBJECTIVES,
}
#: Held-out prompts per step in the frontier runs (the certificate's sample: its fewest, below which it abstains).
FRONTIER_HELDOUT = CERTIFICATE_MIN_PROMPTS
#: The sync-policy comparison: fixed periods, and the divergence policy's TV budgets and lag cap.
SYNC_FIXED_V = (1, 4, 10)
SYNC_TV_BUDGETS = (0.005, 0.01, 0.02)
SYNC_MAX_LAG = 16


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Run the bandit ablation and/or the sweep over the sync period v."""

    experiment: Literal["ablation", "vsweep", "staleness", "frontier", "syncpolicy", "all"] = "all"
    """Which experiment to run."""
    seeds: int = 5
    """Number of seeds per configuration (mean ± std over them)."""
    max_steps: int = 300
    """Steps per run."""
    target_j: float = 0.5
    """Target expected reward for the steps-to-target column."""
    learning_rate: float = 2.0
    """Step size shared by every configuration."""
    population: bool = False
    """Run in population mode (exact gradients) instead of sampled groups."""
    out: str = "runs/bandit"
    """Directory for run directories and results tables."""
    frontier_corrections: tuple[str, ...] = tuple(FRONTIER_CORRECTIONS)
    """The frontier's corrections, by their names in its table (the first row is the reference of its last column)."""
    frontier_v: tuple[int, ...] = tuple(v or 0 for v in FRONTIER_V)
    """frontier: the sync periods v (0: never after the first step), as the LLM frontier's option."""
    frontier_num_iterations: int = 1
    """frontier: i, gradient steps per batch. At i = 1 every step's gradient is taken at pi = pi_k, where CISPO,
    SAPO and TRL's truncation have one gradient (each sample's coefficient w A); they part once pi leaves pi_k within
    a step, at i > 1."""

    def __post_init__(self):
        require(self, self.seeds >= 1, "seeds", "must be >= 1")
        unknown = [c for c in self.frontier_corrections if c not in FRONTIER_CORRECTIONS]
        require(self, bool(self.frontier_corrections) and not unknown, "frontier_corrections",
                f"expected one or more names among {', '.join(map(repr, FRONTIER_CORRECTIONS))}")
        require(self, len(set(self.frontier_corrections)) == len(self.frontier_corrections), "frontier_corrections",
                "each name once")
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")
        require(self, 0 < self.target_j <= 1, "target_j", "must lie in (0, 1]")
        require(self, bool(self.frontier_v) and all(v >= 0 for v in self.frontier_v)
                and len(set(self.frontier_v)) == len(self.frontier_v), "frontier_v",
                "must be one or more distinct sync periods >= 1, or 0 for never")
        require(self, self.frontier_num_iterations >= 1, "frontier_num_iterations", "must be >= 1")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


def _run(cfg: ExperimentConfig, experiment: str, name: str, seed: int, **kw) -> tuple[SimConfig, list[dict], float]:
    sim = SimConfig(max_steps=cfg.max_steps, learning_rate=cfg.learning_rate, population=cfg.population,
                    seed=seed, output_dir=str(Path(cfg.out) / experiment / slug(name) / f"seed{seed}"), **kw)
    t0 = time.perf_counter()
    rows = simulate(sim)
    return sim, rows, time.perf_counter() - t0


def ablation(cfg: ExperimentConfig) -> str:
    lines = [f"| configuration | final J | steps to J >= {cfg.target_j} | wall time (s) | weight syncs |",
             "|---|---|---|---|---|"]
    for name, kw in ABLATION.items():
        fj, st, wt = [], [], []
        for seed in range(cfg.seeds):
            sim, rows, secs = _run(cfg, "ablation", name, seed, **kw)
            fj.append(final_j(rows))
            st.append(steps_to_target(rows, cfg.target_j))
            wt.append(secs)
        syncs = -(-cfg.max_steps // kw["sync_period"])
        lines.append(f"| {name} | {_pm(fj)} | {_pm(st, '.0f')} | {_pm(wt, '.2f')} | {syncs} |")
    return "\n".join(lines)


def _summary(runs: list[list[dict]]) -> dict[str, str]:
    """The sweep columns over the seeds' runs of one configuration: mean lag, final J, mean TV(pi_k, alpha), the
    share of steps with a positive bound (paper and tight constants) and the steps where the exact bound exceeds
    the realised improvement (summed; must be 0)."""
    share = lambda key: [np.mean([r[key] > 0 for r in rows]) for rows in runs]  # noqa: E731
    return {"lag": f"{np.mean([r['lag'] for rows in runs for r in rows]):.1f}",
            "j": _pm([final_j(rows) for rows in runs]),
            "tv": _pm([np.mean([r["tv/pi_k_alpha"] for r in rows]) for rows in runs]),
            "pos": _pm(share("bound/lower")), "pos_t": _pm(share("bound/lower_tight")),
            "viol": str(sum(bound_violations(rows) + bound_violations(rows, tight=True) for rows in runs))}


def vsweep(cfg: ExperimentConfig) -> str:
    lines = ["| v | final J | mean TV(pi_k, alpha) | bound > 0 (paper) | bound > 0 (tight) | steps with bound > improvement |",
             "|---|---|---|---|---|---|"]
    for v in V_SWEEP:
        s = _summary([_run(cfg, "vsweep", f"v{v}", seed, sync_period=v)[1] for seed in range(cfg.seeds)])
        lines.append(f"| {v} | {s['j']} | {s['tv']} | {s['pos']} | {s['pos_t']} | {s['viol']} |")
    return "\n".join(lines)


def staleness(cfg: ExperimentConfig) -> str:
    lines = ["| v | generation | mean lag | final J | mean TV(pi_k, alpha) | bound > 0 (paper) | bound > 0 (tight) | "
             "steps with bound > improvement |", "|---|---|---|---|---|---|---|---|"]
    for v in STALENESS_V:
        for mode in ("sync", "async"):
            s = _summary([_run(cfg, "staleness", f"v{v}_{mode}", seed, sync_period=v,
                               async_generation=mode == "async")[1] for seed in range(cfg.seeds)])
            lines.append(f"| {v} | {mode} | {s['lag']} | {s['j']} | {s['tv']} | {s['pos']} | {s['pos_t']} | "
                         f"{s['viol']} |")
    return "\n".join(lines)


def frontier(cfg: ExperimentConfig) -> str:
    """The corrections table at growing staleness (module docstring); the first row (paper clip, v = 1, sync) is the
    reference of the last column."""
    reference = "v=1" if cfg.frontier_v[0] == 1 else "the first row"
    lines = ["| correction | v | generation | mean lag | J gain | mean TV(pi_k, alpha) | mean ESS(pi_k/alpha) | "
             f"certified steps | within 1 sd of {reference} |", "|---|---|---|---|---|---|---|---|---|"]
    ref = None
    i = cfg.frontier_num_iterations
    for name in cfg.frontier_corrections:
        kw = FRONTIER_CORRECTIONS[name]
        for v in (v or None for v in cfg.frontier_v):
            for mode in ("sync", "async"):
                runs = [_run(cfg, "frontier", f"{name}_v{v}_{mode}" + (f"_i{i}" if i > 1 else ""), seed,
                             sync_period=v or cfg.max_steps + 1, async_generation=mode == "async",
                             heldout_prompts=FRONTIER_HELDOUT, num_iterations=i, **kw)[1]
                        for seed in range(cfg.seeds)]
                gain = [final_j(rows) - rows[0]["j/pi_k"] for rows in runs]
                if ref is None:
                    ref = (float(np.mean(gain)), float(np.std(gain)))
                within = "yes" if abs(np.mean(gain) - ref[0]) <= ref[1] else "no"
                lines.append(
                    f"| {name} | {v or 'never'} | {mode} | {np.mean([r['lag'] for rows in runs for r in rows]):.1f} | "
                    f"{_pm(gain)} | {_pm([np.mean([r['tv/pi_k_alpha'] for r in rows]) for rows in runs])} | "
                    f"{_pm([np.mean([r['ess/pi_k_alpha'] for r in rows]) for rows in runs])} | "
                    f"{_pm([np.mean([r['heldout/improvement_lcb'] > 0 for r in rows]) for rows in runs])} | "
                    f"{within} |")
    return "\n".join(lines)


def sync_policies() -> dict[str, dict]:
    """The sync-policy comparison's configurations, by name: fixed v, then the divergence policy's budgets;
    synchronous, then with asynchronous generation (the divergence policy then decides one step ahead)."""
    out = {f"fixed v={v}": dict(sync_period=v) for v in SYNC_FIXED_V}
    out.update({f"divergence TV > {b}": dict(sync_policy="divergence", tv_budget=b, max_lag=SYNC_MAX_LAG)
                for b in SYNC_TV_BUDGETS})
    out.update({f"fixed v={v}, async": dict(sync_period=v, async_generation=True) for v in SYNC_FIXED_V})
    out.update({f"divergence TV > {b}, async": dict(sync_policy="divergence", tv_budget=b, max_lag=SYNC_MAX_LAG,
                                                    async_generation=True) for b in SYNC_TV_BUDGETS})
    return out


def syncpolicy(cfg: ExperimentConfig) -> str:
    lines = ["| sync policy | final J | syncs | mean TV(pi_k, alpha) | mean lag | bound > 0 (tight) | "
             "steps with bound > improvement |", "|---|---|---|---|---|---|---|"]
    for name, kw in sync_policies().items():
        runs = [_run(cfg, "syncpolicy", name, seed, **kw)[1] for seed in range(cfg.seeds)]
        s = _summary(runs)
        syncs = _pm([sum(r["sync"] for r in rows) for rows in runs], ".1f")
        lines.append(f"| {name} | {s['j']} | {syncs} | {s['tv']} | {s['lag']} | {s['pos_t']} | {s['viol']} |")
    return "\n".join(lines)


EXPERIMENTS = {"ablation": ablation, "vsweep": vsweep, "staleness": staleness, "frontier": frontier,
               "syncpolicy": syncpolicy}


def main(args: list[str] | None = None) -> int:
    cfg = parse(ExperimentConfig, args, prog="python -m grpo_theory.experiments", description=__doc__.splitlines()[0])
    todo = list(EXPERIMENTS) if cfg.experiment == "all" else [cfg.experiment]
    mode = "population (exact gradients)" if cfg.population else "sampled groups (G=8, 4 prompts/step)"
    header = (f"bandit: 16 prompts x 8 actions, binary rewards, {mode}, lr {cfg.learning_rate}, "
              f"{cfg.max_steps} steps, {cfg.seeds} seeds (mean ± std)"
              + (f"; the frontier at i = {cfg.frontier_num_iterations}" if cfg.frontier_num_iterations > 1 else ""))
    for exp in todo:
        t0 = time.perf_counter()
        table = EXPERIMENTS[exp](cfg)
        text = f"{header}\n\n{table}\n"
        path = Path(cfg.out) / exp / "results.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"## {exp} ({time.perf_counter() - t0:.1f} s; {path})\n{text}")
    return 0


if __name__ == "__main__":
    run_main(main, prog="python -m grpo_theory.experiments")

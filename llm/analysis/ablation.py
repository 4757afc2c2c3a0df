"""The paper's GRPO ablation and a sweep over v, on the built-in task and tiny model, with exact J:
``python -m llm ablation`` (``make llm-ablation``).

- ablation: on-policy (v=1, i=1, no mask), on-policy + zero-variance mask, off-policy (v=10, i=1) and
  sample reuse (v=1, i=10), both with the mask (the paper's GSM8K configurations, in miniature);
- vsweep: v in {1, 2, 4, 8, 16} (mask on, i = 1);
- staleness: v in {2, 4}, synchronous and with asynchronous generation (alpha one window older: lag v to 2v - 1);
- syncpolicy: fixed v in {1, 4, 10} against the divergence policy (sync when the held-out TV(pi_k, alpha) estimate
  exceeds a budget, lag capped at ``SYNC_MAX_LAG``) at three budgets, and with asynchronous generation fixed v in
  {1, 2, 4} against the divergence policy one step ahead at the same budgets: final test J and the number of syncs;
- corrections: the paper's clip, TRL's four importance-sampling modes and the length-normalised sequence ratio
  (GSPO, with loss_type grpo), at v = 4 synchronously and with asynchronous generation: final test J, mean TV,
  effective sample size, the share of steps with a positive held-out bound estimate, the share of tokens over the cap;
- frontier: the same corrections at growing staleness (``frontier_v``: v in {1, 4, 16, 64, 256, never} by default,
  synchronous and asynchronous): the columns of the corrections table, the share of steps the held-out improvement
  certificate certifies (``heldout/improvement_lcb`` > 0) and whether the train J gain is within one standard
  deviation of the paper clip's at v = 1, synchronous (the bandit's exact counterpart: ``grpo_theory.experiments
  --experiment frontier``). ``frontier_v``, ``frontier_corrections`` and ``frontier_generation`` choose a sub-grid.

Per configuration, mean ± std over seeds: final exact J on the test prompts (``eval/j``), the gain of the exact J on
the training prompts, steps until the training J first reaches a target, weight syncs, the mean lag, mean
TV(pi_k, alpha) (unbiased estimate), the share of held-out prompts with varied rewards whose estimated tight bound is
positive, the share of steps where the held-out estimate of the tight bound exceeds the exact improvement (and by more
than 3 of its standard errors), and the share of steps whose held-out improvement lies within 3 standard errors of
the exact one.

Runs are ordinary run directories under ``<out>/v<v>_i<i>_<mask|nomask>/seed<k>``: a finished one is read back
(its metrics.jsonl with every step is enough: runs made on another machine can be copied in without their
checkpoints), an interrupted one resumes; the runs go seed by seed. The table is printed and written to
``<out>/<experiment>/results.md``.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import re
from pathlib import Path
from typing import Literal

import numpy as np

from grpo_theory.corrections import ICEPOP, ICEPOP_LABEL
from grpo_theory.experiments import ABLATION
from grpo_theory.loss_types import FRONTIER_OBJECTIVES
from runkit.tables import mean_std
from runkit.validation import require

from llm.tensors.metrics import certificate_shares, step_seconds

V_SWEEP = (1, 2, 4, 8, 16)
STALENESS_V = (2, 4)
SYNC_FIXED_V = (1, 4, 10)
SYNC_TV_BUDGETS = (0.03, 0.05, 0.08)
SYNC_MAX_LAG = 10
#: Asynchronous generation's fixed v beside the divergence policy one step ahead (lag v .. 2v - 1 after the first window).
SYNC_ASYNC_V = (1, 2, 4)
#: The corrections compared, as GRPOConfig overrides (the sequence ratios need loss_type grpo).
CORRECTIONS = {
    "paper clip": dict(),
    "token_truncate": dict(importance_sampling_mode="token_truncate"),
    "token_mask": dict(importance_sampling_mode="token_mask"),
    "sequence_truncate": dict(importance_sampling_mode="sequence_truncate"),
    "sequence_mask": dict(importance_sampling_mode="sequence_mask"),
    "sequence_normalised (GSPO)": dict(ratio_level="sequence_normalised", loss_type="grpo"),
    "m2po": dict(importance_sampling_mode="m2po", mask_zero_std_groups=False),  # the paper's 1/N over all tokens
    "m2po_areal": dict(importance_sampling_mode="m2po_areal"),
    "seq_max_k2 (TRM)": dict(importance_sampling_mode="seq_max_k2"),
    ICEPOP_LABEL: dict(ICEPOP),
    # TRL 1.16's objectives with its token truncation (docs/theory.md, 6.1), DPPO at verl's example thresholds (the
    # bandit's frontier has the same rows) and VCPO's step and baseline; LUSPO
    **FRONTIER_OBJECTIVES,
    "luspo (token_truncate)": dict(loss_type="luspo", importance_sampling_mode="token_truncate",
                                   ratio_level="sequence_normalised"),
    "none (no correction)": dict(importance_sampling_mode="none"),  # TRL's vllm_importance_sampling_correction=False
}
CORRECTIONS_V = 4
#: The frontier's sync periods (0: never after the first step) and generation modes, by default.
FRONTIER_V = (1, 4, 16, 64, 256, 0)
GENERATION = ("sync", "async")


@dataclasses.dataclass(frozen=True)
class AblationConfig:
    """Off-policy GRPO configurations on the built-in task, several seeds each, with exact J."""

    experiment: Literal["ablation", "vsweep", "staleness", "syncpolicy", "corrections", "frontier", "all"] = "all"
    """Which experiment to run (all: every one but the frontier, which runs only when named)."""
    seeds: int = 5
    """Seeds per configuration (mean ± std over them)."""
    max_steps: int = 80
    """Steps per run."""
    target_j: float = 0.26
    """Target exact J over the training prompts for the steps-to-target column (the tiny model starts near 0.21)."""
    heldout_prompts: int = 16
    """Held-out prompts per step for the bound estimates (see GRPOConfig.heldout_prompts)."""
    sampler: Literal["transformers", "vllm"] = "transformers"
    """Sampler of every run (the tiny model generates fastest with transformers; vLLM gives the same numbers
    in distribution)."""
    workers: int = 2
    """Runs in parallel, each with one torch thread."""
    out: str = "runs/llm_ablation"
    """Directory for run directories and results tables."""
    frontier_v: tuple[int, ...] = FRONTIER_V
    """frontier: the sync periods v (0: never after the first step)."""
    frontier_corrections: tuple[str, ...] = tuple(CORRECTIONS)
    """frontier: the corrections, by their names in the corrections table."""
    frontier_generation: tuple[Literal["sync", "async"], ...] = GENERATION
    """frontier: synchronous and/or asynchronous generation."""
    learning_rate: float | None = None
    """Every run's learning rate (unset: GRPOConfig's default, 3e-4). A set one is part of the run directories'
    names, so runs at different rates never mix."""
    device: str = "auto"
    """Every run's device (GRPOConfig.device: auto, cpu or cuda[:n]); on a GPU machine the workers share the GPU."""

    def __post_init__(self):
        require(self, self.seeds >= 1, "seeds", "must be >= 1")
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")
        require(self, 0 < self.target_j <= 1, "target_j", "must lie in (0, 1]")
        require(self, self.workers >= 1, "workers", "must be >= 1")
        if not self.frontier_v or min(self.frontier_v) < 0:
            raise ValueError(f"frontier_v: sync periods >= 1, or 0 for never; got {self.frontier_v}")
        unknown = [c for c in self.frontier_corrections if c not in CORRECTIONS]
        if unknown or not self.frontier_corrections:
            raise ValueError(f"frontier_corrections: expected names among {', '.join(map(repr, CORRECTIONS))}; "
                             f"got {', '.join(map(repr, unknown)) or 'none'}")
        if not self.frontier_generation:
            raise ValueError("frontier_generation: sync, async or both")
        require(self, self.learning_rate is None or self.learning_rate > 0, "learning_rate", "must be > 0")
        if not (self.device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise ValueError(f"device: expected auto, cpu or cuda[:n], got {self.device!r}")


#: The settings every configuration states (the GRPOConfig defaults of this tool), in run directory names.
NAMED = {"sync_period": 1, "num_iterations": 1, "mask_zero_std_groups": True, "async_generation": False}


def run_name(overrides: dict) -> str:
    """Directory name of a configuration, from its settings: configurations that coincide (on-policy + mask
    and v = 1 of the sweep) share their runs."""
    o = {**NAMED, **overrides}
    sync = "div" if o.get("sync_policy") == "divergence" else f"v{o['sync_period']}"  # divergence: no fixed v
    name = f"{sync}_i{o['num_iterations']}_{'mask' if o['mask_zero_std_groups'] else 'nomask'}"
    name += "_async" if o["async_generation"] else ""
    extra = sorted(k for k in o if k not in NAMED)
    return name + "".join(f"_{k}={o[k]}" for k in extra)


def plan(cfg: AblationConfig) -> dict[str, dict[str, dict]]:
    """experiment -> configuration name -> the GRPOConfig overrides shared by its seeds."""
    experiments = {
        "ablation": ABLATION,
        "vsweep": {f"v={v}": dict(sync_period=v) for v in V_SWEEP},
        "staleness": {f"v={v}, {mode}": dict(sync_period=v, async_generation=mode == "async")
                      for v in STALENESS_V for mode in ("sync", "async")},
        "syncpolicy": {**{f"fixed v={v}": dict(sync_period=v) for v in SYNC_FIXED_V},
                       **{f"divergence TV > {b}": dict(sync_policy="divergence", tv_budget=b, max_lag=SYNC_MAX_LAG)
                          for b in SYNC_TV_BUDGETS},
                       **{f"fixed v={v}, async": dict(sync_period=v, async_generation=True) for v in SYNC_ASYNC_V},
                       **{f"divergence TV > {b}, async": dict(sync_policy="divergence", tv_budget=b,
                                                              max_lag=SYNC_MAX_LAG, async_generation=True)
                          for b in SYNC_TV_BUDGETS}},
        "corrections": {f"{name}, {mode}": dict(sync_period=CORRECTIONS_V, async_generation=mode == "async", **kw)
                        for mode in ("sync", "async") for name, kw in CORRECTIONS.items()},
        "frontier": {f"{name}, v={v or 'never'}, {mode}": {**staleness(v, mode, cfg.max_steps), **CORRECTIONS[name]}
                     for name in cfg.frontier_corrections for v in cfg.frontier_v for mode in cfg.frontier_generation},
    }
    # "all": every experiment but the frontier, whose default grid alone is 360 distinct runs of 80 steps
    chosen = [n for n in experiments if n != "frontier"] if cfg.experiment == "all" else [cfg.experiment]
    return {name: experiments[name] for name in chosen}


def staleness(v: int, mode: str, max_steps: int) -> dict:
    """A frontier cell's sync settings. A run that never syncs after step 0 (v = 0, or v >= max_steps) samples
    from the initial weights throughout, with synchronous or asynchronous generation alike: all such cells are one
    configuration (sync_period = max_steps + 1, synchronous), run once per seed."""
    if v == 0 or v >= max_steps:
        return dict(sync_period=max_steps + 1, async_generation=False)
    return dict(sync_period=v, async_generation=mode == "async")


def run_config(cfg: AblationConfig, seed: int, overrides: dict):
    from llm.config import GRPOConfig

    if cfg.learning_rate is not None:
        overrides = {**overrides, "learning_rate": cfg.learning_rate}
    return GRPOConfig(output_dir=str(Path(cfg.out) / run_name(overrides) / f"seed{seed}"), seed=seed,
                      max_steps=cfg.max_steps, heldout_prompts=cfg.heldout_prompts, eval_steps=cfg.max_steps,
                      sampler=cfg.sampler, progress=False, save_steps=0, tv_diagnostics=False,
                      num_threads=1 if cfg.workers > 1 else 0, device=cfg.device, **overrides)


def finished(config) -> bool:
    """Whether the run's metrics hold its last step: such a run is read back without loading a model, also from a
    run directory that holds only config.json and metrics.jsonl (copied from another machine without its
    checkpoint)."""
    from llm.run.rundir import read_metrics

    path = Path(config.output.output_dir) / "metrics.jsonl"
    rows = read_metrics(config.output.output_dir) if path.exists() else []
    return bool(rows) and rows[-1]["step"] >= config.max_steps - 1


def _train(config) -> str:
    from llm.run.trainer import train

    return str(train(config, log=lambda *a: None))


def summarise(rows: list[dict], target: float) -> dict[str, float]:
    """The table's numbers for one run."""
    j = np.array([r["j/pi_new"] for r in rows])
    hit = np.flatnonzero(j >= target)
    bound = np.array([r["heldout/bound_est/lower_tight"] for r in rows])
    se = np.array([r["heldout/bound_est/lower_tight_se"] for r in rows])
    exact = np.array([r["improvement"] for r in rows])
    heldout = np.array([r["heldout/improvement"] for r in rows])
    heldout_se = np.array([r["heldout/improvement_se"] for r in rows])
    positive = [r["heldout/bound_est/frac_lower_tight_positive_nonzero_std"] for r in rows]
    certificate = certificate_shares(rows)
    return {
        "syncs": float(sum(bool(r.get("sync/reason")) for r in rows)),
        # the certificate over every step, an abstention counting as not certified (llm.tensors.metrics.certificate_shares);
        # its misses: a lower confidence bound at level q exceeds the exact improvement on at most about 1 - q
        "certified": certificate["certified"], "lcb_above_exact": certificate["above_exact"],
        "ess": float(np.mean([r["ess/pi_k_alpha"] for r in rows])),
        "steps_bound_positive": float(np.mean(bound > 0)),
        "above_cap": float(np.nanmean([r.get("is_correction/frac_above_cap", 0.0) for r in rows])),
        "test_j": rows[-1]["eval/j"],
        "test_j0": rows[0]["eval_initial/j"],
        "train_j": float(j[-1]),
        "j_gain": float(j[-1] - rows[0]["j/pi_k"]),
        "steps_to_target": float(hit[0] + 1) if hit.size else float("nan"),
        "lag": float(np.mean([r["lag"] for r in rows])),
        "tv_k": float(np.mean([r["tv/pi_k_alpha"] for r in rows])),
        "prompts_bound_positive": float(np.nanmean(positive)) if not np.all(np.isnan(positive)) else float("nan"),
        "steps_bound_exceeds": float(np.mean(bound > exact)),
        "steps_bound_exceeds_3se": float(np.mean(bound - exact > 3 * se)),
        "heldout_within_3se": float(np.mean(np.abs(heldout - exact) <= 3 * heldout_se)),
        "seconds_per_step": float(np.median([step_seconds(r, exclude=("eval",)) for r in rows])),
    }


def table(cfg: AblationConfig, results: dict[str, list[dict]], syncs: dict[str, int]) -> str:
    """The ablation, sweep and staleness table (``syncs``: each configuration's number of syncs)."""
    lines = [f"| configuration | test J (final) | train J gain | steps to train J >= {cfg.target_j} | weight syncs "
             "| mean lag | mean TV(pi_k, alpha) | varied held-out prompts with est. bound > 0 "
             "| steps with est. bound > exact improvement (by > 3 SE) | held-out improvement within 3 SE of exact "
             "| s/step (no eval) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        col = lambda key, fmt=".3f": mean_std([s[key] for s in runs], fmt)  # noqa: E731
        lines.append(f"| {name} | {col('test_j')} | {col('j_gain')} | {col('steps_to_target', '.0f')} | {syncs[name]} "
                     f"| {col('lag', '.2f')} | {col('tv_k', '.4f')} | {col('prompts_bound_positive')} "
                     f"| {col('steps_bound_exceeds')} ({col('steps_bound_exceeds_3se')}) | {col('heldout_within_3se')} "
                     f"| {col('seconds_per_step', '.2f')} |")
    return "\n".join(lines)


def sync_table(cfg: AblationConfig, results: dict[str, list[dict]], syncs=None) -> str:
    """The sync-policy table: syncs counted in the rows (after step 0), with their spread over seeds."""
    lines = ["| sync policy | test J (final) | train J gain | weight syncs | mean lag | mean TV(pi_k, alpha) |",
             "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        col = lambda key, fmt=".3f": mean_std([s[key] for s in runs], fmt)  # noqa: E731
        lines.append(f"| {name} | {col('test_j')} | {col('j_gain')} | {col('syncs', '.1f')} | {col('lag', '.2f')} "
                     f"| {col('tv_k', '.4f')} |")
    return "\n".join(lines)


def corrections_table(cfg: AblationConfig, results: dict[str, list[dict]], syncs=None) -> str:
    """The corrections table: learning, divergence, effective sample size and the held-out bound's sign."""
    lines = ["| correction, generation | test J (final) | train J gain | mean TV(pi_k, alpha) | ESS of pi_k/alpha "
             "| steps with est. bound > 0 | tokens over the cap |", "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        col = lambda key, fmt=".3f": mean_std([s[key] for s in runs], fmt)  # noqa: E731
        lines.append(f"| {name} | {col('test_j')} | {col('j_gain')} | {col('tv_k', '.4f')} | {col('ess')} "
                     f"| {col('steps_bound_positive')} | {col('above_cap', '.4f')} |")
    return "\n".join(lines)


def reference_gain(results: dict[str, list[dict]]) -> tuple[float, float] | None:
    """Mean and (population) standard deviation of the paper clip's train J gain at v = 1, synchronous: None
    without that configuration or with one seed, which has no spread to compare with."""
    gains = [s["j_gain"] for s in results.get("paper clip, v=1, sync", [])]
    return (float(np.mean(gains)), float(np.std(gains))) if len(gains) > 1 else None


def far_from(ref_gain: tuple[float, float], gains) -> bool:
    """Whether the mean gain lies more than one standard deviation of the reference from the reference's mean."""
    return bool(abs(np.mean(gains) - ref_gain[0]) > ref_gain[1])


def frontier_table(cfg: AblationConfig, results: dict[str, list[dict]], syncs=None) -> str:
    """The frontier table: the corrections table's columns at each staleness, the certified share and the
    certificate's misses, and the train J gain against the paper clip's at v = 1, synchronous (n/a unless that
    configuration is in the grid, with two seeds or more); below it, the certificate's miss rate over every run."""
    from llm.config import DiagnosticsConfig

    lines = ["| correction, v, generation | test J (final) | train J gain | mean lag | mean TV(pi_k, alpha) "
             "| ESS of pi_k/alpha | certified steps | certificate above exact | tokens over the cap "
             "| within 1 sd of v=1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    ref_gain = reference_gain(results)
    for name, runs in results.items():
        col = lambda key, fmt=".3f": mean_std([s[key] for s in runs], fmt)  # noqa: E731
        within = "n/a" if ref_gain is None else ("no" if far_from(ref_gain, [s["j_gain"] for s in runs]) else "yes")
        lines.append(f"| {name} | {col('test_j')} | {col('j_gain')} | {col('lag', '.1f')} | {col('tv_k', '.4f')} "
                     f"| {col('ess')} | {col('certified')} | {col('lcb_above_exact')} | {col('above_cap', '.4f')} "
                     f"| {within} |")
    # every distinct run once (cells that coincide share runs): the certificate's miss rate over all their steps
    distinct = {id(s): s for runs in results.values() for s in runs}.values()
    misses = np.mean([s["lcb_above_exact"] for s in distinct])
    level = DiagnosticsConfig().improvement_lcb_level  # the runs' level: not an option here
    lines.append(f"\nOver the {len(distinct)} distinct runs, the improvement certificate (level {level}) exceeds the "
                 f"exact improvement on {misses:.1%} of steps (at most about {1 - level:.0%} where it keeps its level)"
                 ".")
    return "\n".join(lines)


def frontier_pivot(cfg: AblationConfig, results: dict[str, list[dict]]) -> str:
    """The frontier at a glance: train J gain by correction (rows) and sync setting (columns, one per distinct
    setting: every cell that never syncs after step 0 is the column "never"), a cell marked * when its mean lies
    more than one standard deviation from the paper clip's at v = 1, synchronous."""
    ref_gain = reference_gain(results)
    cols = {}
    for v in cfg.frontier_v:
        for mode in cfg.frontier_generation:
            setting = staleness(v, mode, cfg.max_steps)
            never = setting["sync_period"] > cfg.max_steps
            label = "never" if never else f"v={v} {mode}"
            cols.setdefault(tuple(setting.values()), (f"v={v or 'never'}, {mode}", label))
    lines = ["| correction | " + " | ".join(label for _, label in cols.values()) + " |", "|---|" + "---|" * len(cols)]
    for name in cfg.frontier_corrections:
        cells = []
        for cell, _ in cols.values():
            gains = [s["j_gain"] for s in results.get(f"{name}, {cell}", [])]
            far = ref_gain is not None and gains and far_from(ref_gain, gains)
            cells.append(mean_std(gains) + (" *" if far else "") if gains else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TABLES = {"syncpolicy": sync_table, "corrections": corrections_table, "frontier": frontier_table}


def run_grid(cfg: AblationConfig) -> int:
    """Train every run of ``cfg``'s experiments not yet finished, then write and print each experiment's table."""
    from tqdm.auto import tqdm

    from llm.run.rundir import read_metrics

    todo = plan(cfg)
    jobs = {(exp, name, seed): run_config(cfg, seed, kw)
            for exp, configs in todo.items() for name, kw in configs.items() for seed in range(cfg.seeds)}
    unique = {c.output.output_dir: c for c in jobs.values()}
    # seed by seed: a grid stopped part way has its first seeds of every configuration
    pending = [c for c in sorted(unique.values(), key=lambda c: c.seed) if not finished(c)]
    print(f"{len(unique)} runs of {cfg.max_steps} steps under {cfg.out}: {len(unique) - len(pending)} finished, "
          f"{len(pending)} to run ({cfg.workers} at a time)")
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no torch state shared
    with cf.ProcessPoolExecutor(cfg.workers, mp_context=ctx) as pool:
        futures = [pool.submit(_train, c) for c in pending]
        for fut in tqdm(cf.as_completed(futures), total=len(futures), unit="run"):
            fut.result()
    summaries = {d: summarise(read_metrics(d), cfg.target_j) for d in unique}  # each run's metrics read once
    base = next(iter(jobs.values()))
    t0 = np.mean([s["test_j0"] for s in summaries.values()])
    header = (f"built-in task (160 training / 40 test prompts), tiny Qwen2 ({cfg.sampler} sampler), "
              f"{base.sampling.prompts_per_step} prompts x G={base.sampling.num_generations} per step, "
              f"lr {base.optim.learning_rate}, beta {base.objective.beta}, {cfg.max_steps} steps, {cfg.seeds} seeds "
              f"(mean ± std); test J at step 0: {t0:.3f}; "
              f"bound estimates on {cfg.heldout_prompts} held-out prompts per step (tight constant)")
    for exp, configs in todo.items():
        results = {name: [summaries[jobs[exp, name, s].output.output_dir] for s in range(cfg.seeds)]
                   for name in configs}
        syncs = {name: jobs[exp, name, 0].num_syncs for name in configs}
        text = f"{header}\n\n{TABLES.get(exp, table)(cfg, results, syncs)}\n"
        if exp == "frontier":
            text += f"\nTrain J gain (* more than one standard deviation from the paper clip's at v = 1, sync):\n\n" \
                    f"{frontier_pivot(cfg, results)}\n"
        path = Path(cfg.out) / exp / "results.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"## {exp} ({path})\n{text}")
    return 0


"""Conventions of metrics.jsonl that readers share (``llm.analysis.report``, the ablation, the benchmarks): no torch here.

Every key under ``time/`` is wall-clock (seconds, or a rate); every other key is a function of the config and the
seed (the same in two runs of one command on one machine, up to float rounding). ``time/<phase>`` for the phases
of ``PHASES`` are the seconds of the step's phases, which add up to the step.
"""

from __future__ import annotations

#: Timed phases of a step, in order; every metrics row carries ``time/<phase>`` for each (0 when skipped).
PHASES = ("sync", "generate", "score", "behaviour", "reference", "optimise", "diagnostics", "eval")
PHASE_KEYS = tuple(f"time/{p}" for p in PHASES)


def step_seconds(row: dict, exclude: tuple[str, ...] = ()) -> float:
    """Seconds of the step a metrics row describes: the sum of its phases (``exclude``: phases left out)."""
    return sum(row.get(f"time/{p}", 0.0) for p in PHASES if p not in exclude)


def deterministic(row: dict) -> dict:
    """The row without its wall-clock keys (``time/*``): what two runs of one command must log alike."""
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def certificate_shares(rows: list[dict], level: float = 0.95) -> dict[str, float]:
    """How the improvement certificate (``heldout/improvement_lcb``) went over the steps that logged it, one
    convention for every reader: ``certified``, the share with a positive bound (each step's own claim at the run's
    level); ``abstained``, the share where it abstained (nan: an unguaranteed bound below its fewest prompts, docs/
    theory.md §8.6), which counts as not certified; ``above_exact``, where the exact improvement is logged, the share
    whose bound exceeded it (an abstention never does); with the betting certificate's e-values
    (``heldout/improvement_e``), ``e_bh``, the share certified by e-BH over the run at ``level`` (the expected share
    of false certificates among them at most 1 - level), and ``spending``, the share certified by alpha-spending
    (no false certificate at all with probability >= level); ``steps``, how many steps logged it (0: every share
    nan)."""
    import math

    logged = [r for r in rows if "heldout/improvement_lcb" in r]
    n = len(logged)
    share = (lambda hits: sum(hits) / n) if n else (lambda hits: float("nan"))  # noqa: E731
    lcb = [r["heldout/improvement_lcb"] for r in logged]
    out = {"steps": float(n), "certified": share([x > 0 for x in lcb]),
           "abstained": share([not math.isfinite(x) for x in lcb])}
    if logged and all("improvement" in r for r in logged):
        out["above_exact"] = share([x > r["improvement"] for x, r in zip(lcb, logged)])
    if logged and all("heldout/improvement_e" in r for r in logged):  # the betting certificate's e-values
        from grpo_theory.betting import alpha_spending, e_bh

        e = [r["heldout/improvement_e"] for r in logged]
        out["e_bh"] = share(e_bh(e, level).tolist())
        out["spending"] = share(alpha_spending(e, level).tolist())
    return out

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


def certificate_shares(rows: list[dict]) -> dict[str, float]:
    """How the improvement certificate (``heldout/improvement_lcb``) went over the steps that logged it, one
    convention for every reader: ``certified``, the share with a positive bound; ``abstained``, the share where it
    abstained (nan: too few held-out prompts, docs/theory.md §8.6), which counts as not certified; ``above_exact``,
    where the exact improvement is logged, the share whose bound exceeded it (an abstention never does); ``steps``,
    how many steps logged it (0: every share nan)."""
    import math

    logged = [r for r in rows if "heldout/improvement_lcb" in r]
    n = len(logged)
    share = (lambda hits: sum(hits) / n) if n else (lambda hits: float("nan"))  # noqa: E731
    lcb = [r["heldout/improvement_lcb"] for r in logged]
    out = {"steps": float(n), "certified": share([x > 0 for x in lcb]),
           "abstained": share([not math.isfinite(x) for x in lcb])}
    if logged and all("improvement" in r for r in logged):
        out["above_exact"] = share([x > r["improvement"] for x, r in zip(lcb, logged)])
    return out

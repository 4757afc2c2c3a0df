"""Conventions of metrics.jsonl that readers share (``llm.report``, the ablation, the benchmarks): no torch here.

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

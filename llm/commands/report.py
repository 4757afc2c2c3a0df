"""Command line of the run report, ``python -m llm report RUN_DIR [RUN_DIR ...]``: parses ``ReportArgs``, then prints
each run's summary and writes the figures (``llm.analysis.report``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import tyro

from runkit.cli import parse
from runkit.validation import require

from llm.analysis.report import UNDRAWN, plot_runs, spread, summarise

PROG = "python -m llm report"


@dataclasses.dataclass
class ReportArgs:
    """Summaries and plots of llm.train run directories, from their metrics.jsonl only."""

    run_dirs: Annotated[tuple[Path, ...], tyro.conf.Positional]
    """One or more run directories (their output_dir); several are overlaid in every figure, and where they end is
    printed with its spread across them."""
    out: Path | None = None
    """Where the PNGs go (default: RUN_DIR/report for one run, the first run's parent/report for several)."""
    window: int = 10
    """Steps in the rolling mean of the reward and in the summary's first/last means."""

    def __post_init__(self):
        require(self, len(self.run_dirs) >= 1, "run_dirs", "give at least one run directory")
        require(self, self.window >= 1, "window", "must be >= 1")


def main(args: list[str] | None = None) -> int:
    cfg = parse(ReportArgs, args, prog=PROG, description=ReportArgs.__doc__)
    out = cfg.out or (cfg.run_dirs[0] / "report" if len(cfg.run_dirs) == 1 else cfg.run_dirs[0].parent / "report")
    written = plot_runs(cfg.run_dirs, out, cfg.window)
    for d in cfg.run_dirs:
        print(summarise(d, cfg.window))
    if len(cfg.run_dirs) > 1:
        print(spread(cfg.run_dirs, cfg.window))
    print("wrote " + ", ".join(str(p) for p in written.values()))
    for name, why in UNDRAWN.items():
        if name not in written:
            print(f"not drawn: {name} ({why})")
    return 0

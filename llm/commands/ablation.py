"""Command line of the LLM ablation, ``python -m llm ablation``: parses ``AblationConfig``, then trains and tabulates
its grid (``llm.analysis.ablation``)."""

from __future__ import annotations

from runkit.cli import parse

from llm.analysis import ablation
from llm.analysis.ablation import AblationConfig, run_grid

PROG = "python -m llm ablation"


def main(args: list[str] | None = None) -> int:
    return run_grid(parse(AblationConfig, args, prog=PROG, description=ablation.__doc__.splitlines()[0]))

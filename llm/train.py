"""Command line of the off-policy GRPO trainer: ``python -m llm.train [--field value ...]``.

Every field of ``llm.GRPOConfig`` is an option (``--help`` lists them with their documentation).
With no options it trains the built-in tiny model on the built-in arithmetic task.
"""

from __future__ import annotations

from grpo_theory.cli import parse, run_main

from .config import GRPOConfig

PROG = "python -m llm.train"


def main(args: list[str] | None = None) -> int:
    config = parse(GRPOConfig, args, prog=PROG, description="Off-policy GRPO (arXiv 2505.22257) with per-step TV and bound logging.")
    from .trainer import train  # heavy imports after parsing, so --help and errors are fast

    run_dir = train(config)
    from .report import summarise

    print(summarise(run_dir))
    return 0


if __name__ == "__main__":
    run_main(main, prog=PROG)

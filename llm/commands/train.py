"""Command line of the off-policy GRPO trainer: ``python -m llm train [--field value ...]`` parses ``llm.GRPOConfig``,
then calls ``llm.run.trainer.train``.

Every field of ``llm.GRPOConfig`` is an option (``--help`` lists them with their documentation). With no options it
trains the built-in tiny model on the built-in arithmetic task. TRL's names are accepted for their fields.
"""

from __future__ import annotations

import os
import sys

from runkit.cli import parse

from llm.config import TRL_NAMES, TRL_SWITCHES, GRPOConfig, translate_trl_args
from llm.config.trl_messages import as_said, trl_flags_said, unread_cap_in_argv

PROG = "python -m llm train"
DESCRIPTION = ("Off-policy GRPO (arXiv 2505.22257) with per-step TV and bound logging. TRL's names are accepted for "
               "their fields: " + ", ".join(f"--{n.replace('_', '-')}" for n in [*TRL_NAMES, *TRL_SWITCHES]) +
               " (docs/trl.md).")


def main(args: list[str] | None = None) -> int:
    given = sys.argv[1:] if args is None else list(args)
    argv = translate_trl_args(given)  # TRL's option names accepted too
    said = trl_flags_said(given)  # an error names a TRL flag as typed
    config = parse(GRPOConfig, argv, prog=PROG, description=DESCRIPTION,
                   explain=lambda message: str(as_said(ValueError(message), said)))
    if (warning := unread_cap_in_argv(given)) is not None:  # of a command line that parses: a refusal says enough
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    from llm.run.trainer import train  # torch and transformers load here, not for --help or a bad option

    run_dir = train(config)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun rank 0 speaks for the run
        from llm.analysis.report import summarise

        print(summarise(run_dir))
    from llm.models.distributed import ran_in_a_group

    if ran_in_a_group():
        # A torchrun rank whose run is finished and written leaves now: at the interpreter's teardown gloo's worker
        # threads could still free tensors and abort the process ("terminate called without an active exception",
        # a few runs in a hundred under --fsdp, after every file was written), which fails the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0

"""Every command of the project under one name: ``python -m llm <command> [options]`` (``llm/__main__.py``) and the
console command ``offpolicy-grpo <command> [options]`` (``[project.scripts]``) are the same dispatcher.
``python -m llm.train``, the trainer's entry point since the first release of the docs, stays the trainer's."""

from __future__ import annotations

import difflib
import importlib
import sys

from runkit.cli import fail, run_main

PROG = "offpolicy-grpo"
#: The form every command is shown and run under; ``offpolicy-grpo`` is the same.
MODULE_PROG = "python -m llm"
#: command -> (module with ``main``, what it does); the bandit's commands are also ``python -m grpo_theory.<name>``.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("llm.commands.train", "train off-policy GRPO on a model and task"),
    "report": ("llm.commands.report", "summarise a run directory and draw its figures"),
    "serve": ("llm.commands.serve", "start vLLM's server for --sampler server"),
    "ablation": ("llm.commands.ablation", "the paper's ablation, the frontier and sync policies"),
    "options": ("llm.commands.options", "print docs/options.md from the config"),
    "tiny": ("llm.commands.tiny", "rebuild the built-in tiny model"),
    "pretrained": ("llm.commands.pretrained", "print the SmolLM2-135M-Instruct model directory"),
    "agent-data": ("llm.commands.agent_data", "write a multiplication task for an agent with a tool"),
    "check": ("grpo_theory.check", "check Theorem 1 exactly on random bandits"),
    "simulate": ("grpo_theory.simulate", "simulate Algorithm 1 on a bandit"),
    "experiments": ("grpo_theory.experiments", "the bandit's experiments and figures"),
    "certificate": ("grpo_theory.certificate", "the certificate's coverage table"),
}


def usage(prog: str) -> str:
    width = max(map(len, COMMANDS))
    other = PROG if prog != PROG else MODULE_PROG
    lines = [f"usage: {prog} <command> [options]   ({prog} <command> --help for a command's options; {other} <command> "
             "is the same)", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(args: list[str] | None = None, prog: str = PROG) -> int:
    """Dispatch ``args`` (default: the process's) to the command it names; ``prog``: how the user called it."""
    args = sys.argv[1:] if args is None else list(args)
    if not args or args[0] in ("-h", "--help"):
        print(usage(prog))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        fail(prog, f"unknown command {name!r}" + (f"; did you mean {near[0]!r}?" if near else "")
             + f" (commands: {', '.join(COMMANDS)})")
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"{prog} {name}", *rest]  # the command reads its own arguments from sys.argv
    run_main(module.main, prog=f"{prog} {name}")
    return 0


def entry() -> None:
    """``[project.scripts]``'s entry point."""
    raise SystemExit(main())

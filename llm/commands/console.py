"""The console command ``offpolicy-grpo <command> [options]`` (``[project.scripts]``): one name for every command
of the project, each the same as its ``python -m`` form, which keeps working (``offpolicy-grpo train --max-steps 5``
is ``python -m llm.train --max-steps 5``)."""

from __future__ import annotations

import difflib
import importlib
import sys

from runkit.cli import fail, run_main

PROG = "offpolicy-grpo"
#: command -> (module with ``main``, its ``python -m`` form, what it does)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("llm.commands.train", "llm.train", "train off-policy GRPO on a model and task"),
    "report": ("llm.commands.report", "llm.report", "summarise a run directory and draw its figures"),
    "serve": ("llm.commands.serve", "llm.serve", "start vLLM's server for --sampler server"),
    "ablation": ("llm.commands.ablation", "llm.ablation", "the paper's ablation, the frontier and sync policies"),
    "options": ("llm.commands.options", "llm.options", "print docs/options.md from the config"),
    "tiny": ("llm.commands.tiny", "llm.tiny", "rebuild the built-in tiny model"),
    "pretrained": ("llm.commands.pretrained", "llm.pretrained", "print the SmolLM2-135M-Instruct model directory"),
    "agent-data": ("llm.commands.agent_data", "llm.agent_data", "write a multiplication task for an agent with a tool"),
    "check": ("grpo_theory.check", "grpo_theory.check", "check Theorem 1 exactly on random bandits"),
    "simulate": ("grpo_theory.simulate", "grpo_theory.simulate", "simulate Algorithm 1 on a bandit"),
    "experiments": ("grpo_theory.experiments", "grpo_theory.experiments", "the bandit's experiments and figures"),
    "certificate": ("grpo_theory.certificate", "grpo_theory.certificate", "the certificate's coverage table"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} <command> [options]   ({PROG} <command> --help for a command's options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {what} (python -m {module})" for name, (_, module, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(args: list[str] | None = None) -> int:
    """Dispatch ``args`` (default: the process's) to the command it names."""
    args = sys.argv[1:] if args is None else list(args)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        fail(PROG, f"unknown command {name!r}" + (f"; did you mean {near[0]!r}?" if near else "")
             + f" (commands: {', '.join(COMMANDS)})")
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"{PROG} {name}", *rest]  # the command reads its own arguments from sys.argv
    run_main(module.main, prog=f"{PROG} {name}")
    return 0


def entry() -> None:
    """``[project.scripts]``'s entry point."""
    raise SystemExit(main())

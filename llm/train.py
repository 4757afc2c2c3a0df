"""``python -m llm.train``: the trainer's command line (``llm.commands.train``). In code, train with the function
``from llm import train`` (importing this module replaces the package's ``train`` attribute with the module: use
``llm.run.trainer.train`` in a process that imported it)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.train import PROG, main

    run_main(main, prog=PROG)

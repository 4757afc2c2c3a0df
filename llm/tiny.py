"""``python -m llm.tiny``: build the tiny model (``llm.commands.tiny``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.tiny import PROG, main

    run_main(main, prog=PROG)

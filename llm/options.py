"""``python -m llm.options``: docs/options.md from GRPOConfig (``llm.commands.options``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.options import PROG, main

    run_main(main, prog=PROG)

"""``python -m llm.report``: summaries and figures of run directories (``llm.commands.report``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.report import PROG, main

    run_main(main, prog=PROG)

"""``python -m llm.ablation``: the LLM ablation's grid of runs and its tables (``llm.commands.ablation``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.ablation import PROG, main

    run_main(main, prog=PROG)

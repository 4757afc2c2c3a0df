"""``python -m llm.serve``: vLLM's server as the lagged sampler (``llm.commands.serve``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.serve import PROG, main

    run_main(main, prog=PROG)

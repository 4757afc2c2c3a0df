"""``python -m llm.pretrained``: the SmolLM2-135M-Instruct model directory (``llm.commands.pretrained``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.pretrained import PROG, main

    run_main(main, prog=PROG)

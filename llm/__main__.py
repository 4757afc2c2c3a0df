"""``python -m llm <command> [options]``: every command of the project (``llm.commands.console``)."""

if __name__ == "__main__":
    from llm.commands.console import MODULE_PROG, main

    raise SystemExit(main(prog=MODULE_PROG))

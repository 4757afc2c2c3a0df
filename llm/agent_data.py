"""``python -m llm.agent_data``: write a multiplication task for an agent with a calculator tool
(``llm.commands.agent_data``)."""

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.agent_data import PROG, main

    run_main(main, prog=PROG)

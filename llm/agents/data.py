"""``python -m llm.agents.data``: the earlier name of ``python -m llm.agent_data`` (the command now lives in
``llm.commands.agent_data``), kept working."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("llm.agent_data", run_name="__main__", alter_sys=True)

"""An agent from the config (``build_agent``), checked at start-up in one line per mistake."""

from __future__ import annotations

from pathlib import Path

from llm.agents.episodes import Agent
from llm.agents.template import ToolTemplate
from llm.agents.tools import ToolRunner, check_environment_factory, environment_tools, import_object, load_tools

#: Tool-capable chat templates shipped with the package (``--chat-template-path``).
TEMPLATES = Path(__file__).resolve().parent / "templates"


def read_chat_template(path: str) -> str:
    """The template text of ``--chat-template-path``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"chat_template_path: no file at {path!r}")
    return p.read_text()


def build_agent(agent_config, task, tokenizer, log=print) -> Agent | None:
    """The run's agent (None without tools, an environment or an agent task): the task's own tools, replaced by a
    user's of the same name, plus the user's others; the environment factory checked on one instance; the template
    checked to express tool calls and their answers (``ToolTemplate``). ``--chat-template-path`` becomes the
    tokenizer's template first (agent or not), so the prompts, the episodes and the saved model use the same one."""
    if agent_config.chat_template_path:
        tokenizer.chat_template = read_chat_template(agent_config.chat_template_path)
    own = {t.__name__: t for t in task.tools}
    user = {t.__name__: t for t in load_tools(agent_config.tools)}
    factory = None
    if agent_config.environment_factory:
        factory = import_object(agent_config.environment_factory, "environment_factory")
        clash = set(check_environment_factory(factory)) & set(user)
        if clash:
            raise ValueError(f"tools: {', '.join(sorted(clash))} is both a tool and a method of the environment")
    if not (own or user or factory):
        return None
    tools = {**own, **user}
    schemas = list(tools.values()) + (environment_tools(factory()) if factory is not None else [])
    template = ToolTemplate(tokenizer, schemas)
    runner = ToolRunner(agent_config.tool_timeout, agent_config.max_tool_response_length, tokenizer)
    if replaced := sorted(set(own) & set(user)):
        log(f"tools: {', '.join(replaced)} given with --tools replace the task's own")
    return Agent(template, runner, tools, factory, agent_config.max_tool_calling_iterations or 0, log)

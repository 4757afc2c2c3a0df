"""An agent from the config (``build_agent``), checked at start-up in one line per mistake."""

from __future__ import annotations

from pathlib import Path

from llm.agents.environments import ENVIRONMENT_COLUMN, EnvironmentPool, environment_tools, load_environments
from llm.agents.episodes import Agent
from llm.agents.template import ToolTemplate
from llm.agents.tools import AnswerBudget, load_tools
from llm.agents.workers import Workers

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
    user's of the same name, plus the user's others; the environments, each probed on one instance, the first of its
    pool (``llm.agents.environments``); the template checked to express tool calls and their answers (``ToolTemplate``);
    a run with no reward source at all refused, as TRL refuses it. ``--chat-template-path`` becomes the tokenizer's
    template first (agent or not), so the prompts, the episodes and the saved model use the same one."""
    if agent_config.chat_template_path:
        tokenizer.chat_template = read_chat_template(agent_config.chat_template_path)
    own = {t.__name__: t for t in task.tools}
    user = {t.__name__: t for t in load_tools(agent_config.tools)}
    workers = Workers(agent_config.tool_timeout)
    pool = EnvironmentPool(workers)
    environments = (load_environments(agent_config.environment_factory, pool) if agent_config.environment_factory
                    else {})
    for env in environments.values():
        if clash := sorted(set(env.tool_names) & set(user)):
            log(f"tools: {', '.join(clash)} is both a tool and a method of the environment {env.class_name}: its "
                "episodes call the environment's (as TRL does)")
    if not (own or user or environments):
        return None
    check_reward_sources(task, environments)
    if None not in environments and environments:
        check_environment_column(task, environments)
    tools = {**own, **user}
    schemas = list(tools.values()) + [t for env in environments.values() for t in environment_tools(env.probe)]
    template = ToolTemplate(tokenizer, schemas)
    if replaced := sorted(set(own) & set(user)):
        log(f"tools: {', '.join(replaced)} given with --tools replace the task's own")
    return Agent(template, AnswerBudget(agent_config.max_tool_response_length, tokenizer), workers, tools, environments,
                 pool, agent_config.max_tool_calling_iterations or 0, log)


def check_reward_sources(task, environments) -> None:
    """No reward source at all is refused (TRL 1.16: "No reward source provided"); with several environments and no
    reward of the task's own, each environment must score its rows."""
    if not task.base_free:
        return
    unscored = [e.class_name for e in environments.values() if not e.reward]
    if len(unscored) == len(environments):
        raise ValueError("environment_factory: no reward source: the environment has no get_reward() method and no "
                         "--reward-funcs were given (TRL 1.16 refuses this too); define get_reward() on the "
                         "environment, or pass --reward-funcs")
    if unscored:
        raise ValueError(f"environment_factory: {', '.join(unscored)} has no get_reward() and no --reward-funcs were "
                         "given, so its rows would have no reward; define get_reward() on it, or pass --reward-funcs")


def check_environment_column(task, environments) -> None:
    """Several environments: every row names one of them in its 'environment' column (TRL's routing)."""
    for test, columns in ((False, task.columns), (True, task.test_columns)):
        n = len(task.test_prompts if test else task.prompts)
        if not n:
            continue
        names = columns.get(ENVIRONMENT_COLUMN)
        if names is None:
            raise ValueError(f"environment_factory: several environments ({', '.join(map(repr, environments))}) are "
                             f"chosen by each row's {ENVIRONMENT_COLUMN!r} column, and the "
                             f"{'test' if test else 'training'} data has none")
        if bad := sorted({str(v) for v in names if v not in environments}):
            raise ValueError(f"environment_factory: rows name the environment {bad[0]!r}, not one of "
                             f"{', '.join(map(repr, environments))}")

"""The agent: tools, an environment, the limits of a multi-turn episode (``llm.agents``; TRL's names)."""

from __future__ import annotations

from pydantic import model_validator

from llm.config.fields import ConfigGroup, require
from llm.config.user_code import spec_validator

class AgentConfig(ConfigGroup):
    """Tool-calling episodes: the policy's turns, the tools' answers between them (docs/agents.md)."""

    tools: tuple[str, ...] = ()
    """Tools as 'module:function' (TRL's ``tools``; from Python the functions themselves): plain Python functions, sync
    or async, with type hints and a docstring with an Args: section, from which transformers builds the schema the
    chat template shows the model. A tool of the same name as one of the task's own (``--dataset arithmetic_tools``:
    multiply) replaces it."""
    environment_factory: tuple[str, ...] = ()
    """An environment factory as 'module:Class' (TRL's ``environment_factory``; from Python any callable, or a dict
    of them), or several as 'name=module:Class', each row choosing one by its 'environment' column: one instance per
    episode, ``reset(**row)`` before it (its text, if any, appended to the prompt's last user message), its public
    methods other than reset and get_reward the tools, its ``get_reward()`` one more reward source of weight 1
    (docs/agents.md)."""
    max_tool_calling_iterations: int | None = None
    """Tool-calling rounds an episode may make (TRL's name); the calls of a turn past it are not run and the episode
    ends there. None: no limit but the completion budget (max_completion_length counts the policy's and the
    environment's tokens, as TRL's does)."""
    tool_timeout: float = 10.0
    """Seconds each round of an episode's calls (reset, the tools, get_reward) may take, all episodes' calls of a
    round running at once; past it the call fails (the model reads an error as the tool's answer; a reset or
    get_reward that fails scores its episode 0) and the episode goes on without it. 0: no limit."""
    max_tool_response_length: int = 256
    """Tokens of a tool's answer the model is shown; a longer answer is cut to this many, with ' [truncated]'
    (verl's name, where it counts characters). 0: no limit."""
    chat_template_path: str = ""
    """A Jinja chat template file to use instead of the tokenizer's own (TRL's and transformers' name), e.g. one
    that can express tool calls for a model whose template cannot (llm/agents/templates/chatml_tools.jinja for
    SmolLM2)."""

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.environment_factory)

    # TRL's trainer takes the functions and the factories themselves: kept here by text (config.json)
    _tool_specs = spec_validator("tools")
    _factory_specs = spec_validator("environment_factory", named=True)

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.max_tool_calling_iterations is None or self.max_tool_calling_iterations >= 1,
                "max_tool_calling_iterations", "must be >= 1, or None for no limit")
        require(self, self.tool_timeout >= 0, "tool_timeout",
                "must be >= 0 seconds (0: no limit)")
        require(self, self.max_tool_response_length >= 0, "max_tool_response_length", "must be >= 0 (0: no limit)")
        require(self, all(":" in t for t in self.tools), "tools", "each must be 'module:function'")
        require(self, all(":" in t for t in self.environment_factory), "environment_factory",
                "each must be 'module:Class' or 'name=module:Class'")
        return self

"""The agent: tools, an environment, the limits of a multi-turn episode (``llm.agents``; TRL's names)."""

from __future__ import annotations

import dataclasses
import math

from llm.config.fields import ConfigGroup, require, require_finite


def import_path(obj, option: str) -> str:
    """'module:qualname' of a function or class defined at a module's top level (one line otherwise): what a config
    holds of TRL's ``tools=[f]`` and ``environment_factory=Env``, imported again where the run starts."""
    import importlib

    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    try:
        found = getattr(importlib.import_module(module), name) if module and "." not in name else None
    except (ImportError, AttributeError):
        found = None
    if found is not obj:
        raise ValueError(f"{option}: {obj!r} is not defined at the top level of an importable module; define it in "
                         "one (the run imports it again as 'module:name')")
    return f"{module}:{name}"


@dataclasses.dataclass
class AgentConfig(ConfigGroup):
    """Tool-calling episodes: the policy's turns, the tools' answers between them (docs/agents.md)."""

    tools: tuple[str, ...] = ()
    """Tools as 'module:function' (TRL's ``tools``): plain Python functions with type hints and a docstring with an
    Args: section, from which transformers builds the schema the chat template shows the model. A tool of the same
    name as one of the task's own (``--dataset arithmetic_tools``: multiply) replaces it."""
    environment_factory: str = ""
    """A class as 'module:Class' (TRL's ``environment_factory``): one instance per episode, ``reset(**row)`` with the
    prompt's data row before it, its public methods are its tools, and its ``reward`` attribute after the episode is
    the reward when no other is given."""
    max_tool_calling_iterations: int | None = None
    """Tool-calling rounds an episode may make (TRL's name); a turn calling tools past it ends the episode and counts
    as failed calls. None: no limit but the completion budget (max_completion_length counts the policy's and the
    environment's tokens, as TRL's does)."""
    tool_timeout: float = 10.0
    """Seconds a tool call may take; past it the call fails with an error the model reads as the tool's answer, and
    the episode goes on (the hung call is abandoned in its thread). 0: no limit."""
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

    def __post_init__(self):
        # TRL's trainer takes the functions and the class themselves: kept here by their import path (config.json)
        if not isinstance(self.tools, tuple) or any(callable(t) for t in self.tools):
            tools = self.tools if isinstance(self.tools, (list, tuple)) else (self.tools,)
            object.__setattr__(self, "tools", tuple(import_path(t, "tools") if callable(t) else t for t in tools))
        if callable(self.environment_factory):
            object.__setattr__(self, "environment_factory",
                               import_path(self.environment_factory, "environment_factory"))
        require_finite(self)
        require(self, self.max_tool_calling_iterations is None or self.max_tool_calling_iterations >= 1,
                "max_tool_calling_iterations", "must be >= 1, or None for no limit")
        require(self, self.tool_timeout >= 0 and math.isfinite(self.tool_timeout), "tool_timeout",
                "must be >= 0 seconds (0: no limit)")
        require(self, self.max_tool_response_length >= 0, "max_tool_response_length", "must be >= 0 (0: no limit)")
        require(self, all(":" in t for t in self.tools), "tools", "each must be 'module:function'")
        require(self, not self.environment_factory or ":" in self.environment_factory, "environment_factory",
                "must be 'module:Class'")

"""The agent: tools, an environment, the limits of a multi-turn episode (``llm.agents``; TRL's names)."""

from __future__ import annotations

import dataclasses
import functools
import math
import re

from llm.config.fields import ConfigGroup, require, require_finite

#: Python objects given to a config that cannot be imported again by name (a lambda, a ``functools.partial``, a class
#: or function defined inside a function), kept for this process under the text config.json holds of them.
OBJECTS: dict[str, object] = {}
OBJECT_PREFIX = "object:"


def describe(obj) -> str:
    """A text for an object that names what it is and where it was defined, the same in every process (no address)."""
    if isinstance(obj, functools.partial):
        args = [describe(obj.func)] + [repr(a) for a in obj.args] + [f"{k}={v!r}" for k, v in obj.keywords.items()]
        return re.sub(r" at 0x[0-9a-f]+", "", f"functools.partial({', '.join(args)})")
    code = getattr(obj, "__code__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    where = f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return re.sub(r" at 0x[0-9a-f]+", "", f"{getattr(obj, '__module__', '?')}:{name}{where}")


def object_spec(obj, option: str) -> str:
    """What a config holds of a Python object (TRL's ``tools=[f]``, ``environment_factory=Env``): 'module:name' for
    one defined at a module's top level (imported again where the run starts, in any process), else
    'object:<description>' kept in ``OBJECTS`` for this process (a resumed run from Python passes it again)."""
    import importlib

    if not callable(obj):
        raise ValueError(f"{option}: {obj!r} is not callable")
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    try:
        found = getattr(importlib.import_module(module), name) if module and name and "." not in name else None
    except (ImportError, AttributeError, TypeError):
        found = None
    if found is obj and "<" not in name:
        return f"{module}:{name}"
    spec = OBJECT_PREFIX + describe(obj)
    OBJECTS[spec] = obj
    return spec


def as_specs(value, option: str, named: bool = False) -> tuple[str, ...]:
    """A config value of names or objects as a tuple of text: a string, an object, a list of them, or (``named``)
    a dict of them by name ('name=spec')."""
    if isinstance(value, dict) and named:
        return tuple(f"{name}={as_specs(v, option)[0]}" for name, v in value.items())
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        value = (value,) if value not in ("", None) else ()
    return tuple(v if isinstance(v, str) else object_spec(v, option) for v in value)


@dataclasses.dataclass
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

    def __post_init__(self):
        # TRL's trainer takes the functions and the factories themselves: kept here by text (config.json)
        if not (isinstance(self.tools, tuple) and all(isinstance(t, str) for t in self.tools)):
            object.__setattr__(self, "tools", as_specs(self.tools, "tools"))
        if not (isinstance(self.environment_factory, tuple) and all(isinstance(t, str)
                                                                    for t in self.environment_factory)):
            object.__setattr__(self, "environment_factory",
                               as_specs(self.environment_factory, "environment_factory", named=True))
        require_finite(self)
        require(self, self.max_tool_calling_iterations is None or self.max_tool_calling_iterations >= 1,
                "max_tool_calling_iterations", "must be >= 1, or None for no limit")
        require(self, self.tool_timeout >= 0 and math.isfinite(self.tool_timeout), "tool_timeout",
                "must be >= 0 seconds (0: no limit)")
        require(self, self.max_tool_response_length >= 0, "max_tool_response_length", "must be >= 0 (0: no limit)")
        require(self, all(":" in t for t in self.tools), "tools", "each must be 'module:function'")
        require(self, all(":" in t for t in self.environment_factory), "environment_factory",
                "each must be 'module:Class' or 'name=module:Class'")

"""TRL 1.16's environment contract (``GRPOTrainer(environment_factory=...)``), read from its source and checked beside
its trainer (docs/trl.md, benchmarks/trl_agents.py):

- a factory is any callable that returns an environment (a class, a lambda, a ``functools.partial``), or a dict of
  them by name, each data row choosing one by its ``environment`` column (that column is not passed to ``reset``);
- ``reset(**row)`` starts an episode on the row and returns None or an observation: text appended to the last user
  message of the prompt (a text prompt gets it appended as it is);
- the tools are the class's public functions other than ``reset`` and ``get_reward``, listed on the class, so a
  property is never evaluated and is never a tool; a row is offered only its environment's tools (and ``--tools``);
- ``get_reward()``, sync or async, scores the episode from the environment's state: one more reward source of weight
  1 beside the reward functions, logged under the class's name (None: does not apply to that episode);
- without a reward function and without ``get_reward`` there is no reward at all: refused at start-up.

One extra of this package's: an environment without ``get_reward`` whose instance has a ``reward`` attribute that is
a number (set in ``__init__``, ``reset`` or a tool) is scored by it, in the same way. Environments are made fresh for
each episode, on the episode's worker (``llm.agents.workers``), not pooled: a window's episodes are scored after
the next window's have started (``--sync-period``, ``--async-generation``), and each keeps its own instance until then.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from llm.agents.tools import tool_schema
from llm.config.objects import import_object

#: The data column that chooses a row's environment when ``environment_factory`` is a dict (TRL's name).
ENVIRONMENT_COLUMN = "environment"
#: Methods of an environment that are not tools (TRL's).
NOT_TOOLS = ("reset", "get_reward")


def factory_entries(entries, option: str = "environment_factory") -> dict[str | None, str]:
    """``environment_factory``'s entries ('module:Class', 'name=module:Class', 'object:...') by environment name
    (None: the one environment of every row)."""
    named: dict[str | None, str] = {}
    for entry in entries:
        name, eq, spec = entry.partition("=") if "=" in entry.partition(":")[0] else (None, "", entry)
        if name is not None and not name:
            raise ValueError(f"{option}: {entry!r} names no environment before '='")
        if name in named:
            raise ValueError(f"{option}: two factories for {'one environment' if name is None else repr(name)}")
        named[name] = spec
    if None in named and len(named) > 1:
        raise ValueError(f"{option}: give one factory, or name every one ('name=module:Class') to choose them by the "
                         f"'{ENVIRONMENT_COLUMN}' column")
    return named


def class_functions(env) -> list[str]:
    """Names of the functions defined on the environment's class (and its bases), as TRL lists them: on the class,
    so a property is neither evaluated nor a tool."""
    return [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)]


def environment_tools(env) -> list[Callable]:
    """An environment's tools, bound to it: its class's public functions other than ``reset`` and ``get_reward``."""
    return [getattr(env, n) for n in class_functions(env) if n not in NOT_TOOLS and not n.startswith("_")]


def reward_attribute(env) -> bool:
    """The extra of this package: a ``reward`` attribute that is a number (not a method), read after the episode."""
    value = env.__dict__.get("reward", getattr(type(env), "reward", None)) if hasattr(env, "__dict__") else None
    return value is not None and not callable(value) and not isinstance(value, property)


@dataclass
class Environment:
    """One environment of the run: its factory, its name (None: the only one), the tools a probe instance showed,
    and how it is scored ('get_reward', 'attribute' or '')."""

    name: str | None
    factory: Callable
    class_name: str
    tool_names: list[str]
    reward: str
    probe: object

    @property
    def reward_source(self) -> str:
        """The reward source's name (TRL's: the class's name), '' without one."""
        return self.class_name if self.reward else ""


def probe(name: str | None, factory: Callable, option: str = "environment_factory") -> Environment:
    """Make one environment now and check it as TRL does: ``reset`` is a function of its class, every tool has a
    schema; how it is scored."""
    where = f"{option}{'' if name is None else f' {name!r}'}"
    if not callable(factory):
        raise ValueError(f"{where}: {factory!r} is not callable")
    try:
        env = factory()
    except Exception as exc:  # noqa: BLE001 - the user's code: one line
        raise ValueError(f"{where}: making an environment raised {type(exc).__name__}: {exc}") from None
    functions = class_functions(env)
    if "reset" not in functions:
        raise ValueError(f"{where}: the environment {type(env).__name__} has no reset(**row) method (TRL's contract)")
    tools = environment_tools(env)
    for t in tools:
        tool_schema(t, option)
    reward = "get_reward" if "get_reward" in functions else "attribute" if reward_attribute(env) else ""
    return Environment(name, factory, type(env).__name__, [t.__name__ for t in tools], reward, env)


def load_environments(entries, option: str = "environment_factory") -> dict[str | None, Environment]:
    """The run's environments by name, each probed (``probe``)."""
    return {name: probe(name, import_object(spec, option), option) for name, spec in factory_entries(entries, option).items()}


def reward_value(env, how: str):
    """The episode's reward from environment ``env`` (``Environment.reward``): ``get_reward()`` (its coroutine when
    it is async: awaited by the worker) or the ``reward`` attribute."""
    return env.get_reward() if how == "get_reward" else getattr(env, "reward", None)

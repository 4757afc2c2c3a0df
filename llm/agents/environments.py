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

- instances are pooled and reused across steps: the instance made to read the tools is the pool's first, an episode
  takes the lowest-numbered free one (TRL hands a batch's j-th row the pool's j-th) and ``reset`` runs on it again,
  so an environment that keeps state from ``__init__`` (a seeded stream of questions, a cursor) moves on from step to
  step as in TRL;
- a ``reward`` attribute is the user's own state (TRL's OpenEnv examples keep one and read it in a reward function):
  never a reward source.

The pool (``EnvironmentPool``) is this package's: each instance lives on the worker thread it was made on
(``llm.agents.workers``), so state bound to a thread (an sqlite connection opened in ``__init__``) works in every
call; an episode gives its instance back once its step has been scored (reward functions read it through
``environments=``: ``Rollout.release``), so a window's episodes, scored after the next window's have started
(``--sync-period``, ``--async-generation``), each keep theirs until then; an instance whose ``reset``, call or
``get_reward`` raised or hung is dropped, not reused (TRL's run would have ended there).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from runkit.cli import exception_text

from llm.agents.tools import tool_schema
from llm.agents.workers import Worker, Workers
from llm.config.user_code import import_object

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


@dataclass
class Environment:
    """One environment of the run: its factory, its name (None: the only one), the tools a probe instance showed
    (that instance is its pool's first), and how it is scored ('get_reward' or '')."""

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


def probe(name: str | None, factory: Callable, pool: "EnvironmentPool", option: str = "environment_factory"
          ) -> Environment:
    """Make one environment now, on a worker of ``pool`` (it becomes the pool's first instance, as TRL's probe does),
    and check it as TRL does: ``reset`` is a function of its class, every tool has a schema; how it is scored."""
    where = f"{option}{'' if name is None else f' {name!r}'}"
    if not callable(factory):
        raise ValueError(f"{where}: {factory!r} is not callable")
    lease = pool.make(name, factory)
    if lease.error is not None:
        raise ValueError(f"{where}: making an environment {lease.error}") from None
    env = lease.env
    functions = class_functions(env)
    if "reset" not in functions:
        raise ValueError(f"{where}: the environment {type(env).__name__} has no reset(**row) method (TRL's contract)")
    tools = environment_tools(env)
    for t in tools:
        tool_schema(t, option)
    reward = "get_reward" if "get_reward" in functions else ""
    return Environment(name, factory, type(env).__name__, [t.__name__ for t in tools], reward, env)


def load_environments(entries, pool: "EnvironmentPool", option: str = "environment_factory"
                      ) -> dict[str | None, Environment]:
    """The run's environments by name, each probed (``probe``) into ``pool``."""
    return {name: probe(name, import_object(spec, option), pool, option)
            for name, spec in factory_entries(entries, option).items()}


@dataclass(eq=False)
class Lease:
    """One pooled environment instance (``EnvironmentPool``): its number in its environment's pool, the worker it
    lives on, the instance (None until made), and why making it failed (None: it did not)."""

    pool: "EnvironmentPool"
    name: str | None
    index: int
    worker: Worker
    env: object = None
    error: str | None = None

    def give_back(self) -> None:
        self.pool.give_back(self)


class EnvironmentPool:
    """The run's environment instances, by environment, reused across steps as TRL 1.16 reuses them (module
    docstring): ``take`` hands out the lowest-numbered free instance of an environment (a new one, made on the episode's
    worker, when none is free), ``give_back`` frees it, ``drop`` discards one that failed. Thread-safe: a window
    generated in the background takes instances while the trainer gives its step's back."""

    def __init__(self, workers: Workers):
        self.workers = workers
        self.lock = threading.Lock()
        self.free: dict[str | None, list[Lease]] = {}
        self.made: dict[str | None, int] = {}
        self.leased: set[Lease] = set()

    def _new(self, name: str | None) -> Lease:
        with self.lock:
            index = self.made.get(name, 0)
            self.made[name] = index + 1
        return Lease(self, name, index, self.workers.acquire())

    def make(self, name: str | None, factory: Callable) -> Lease:
        """A new instance made now on its own worker (the probe), free in the pool; ``error`` says why it is not."""
        lease = self._new(name)
        (out,) = self.workers.run([(lease.worker, factory, ())])
        if out.ok:
            lease.env = out.value
            self.give_back(lease)
        else:
            lease.error = ("timed out" if out.timed_out else
                           f"raised {type(out.error).__name__}: {exception_text(out.error)}")
            self.workers.release(lease.worker)
        return lease

    def take(self, name: str | None) -> Lease:
        """The lowest-numbered free instance of environment ``name``, or a new lease (its instance made at reset)."""
        with self.lock:
            free = self.free.get(name, [])
            lease = min(free, key=lambda x: x.index) if free else None
            if lease is not None:
                free.remove(lease)
        lease = lease or self._new(name)
        with self.lock:
            self.leased.add(lease)
        return lease

    def give_back(self, lease: Lease) -> None:
        with self.lock:
            self.leased.discard(lease)
            if lease.env is not None and lease not in self.free.setdefault(lease.name, []):
                self.free[lease.name].append(lease)

    def drop(self, lease: Lease) -> None:
        """Discard an instance that failed; its worker goes back to the workers (set aside while a call still runs)."""
        with self.lock:
            self.leased.discard(lease)
            if lease in self.free.get(lease.name, []):
                self.free[lease.name].remove(lease)
        lease.env = None
        self.workers.release(lease.worker)

    def close(self) -> None:
        """Every instance's worker released, so that ``Workers.close`` ends its thread."""
        with self.lock:
            leases = [x for free in self.free.values() for x in free] + list(self.leased)
            self.free, self.leased = {}, set()
        for lease in leases:
            self.workers.release(lease.worker)


def reward_value(env, how: str):
    """The episode's reward from environment ``env`` (``Environment.reward``): ``get_reward()``, its coroutine when it
    is async (awaited by the worker)."""
    return env.get_reward()

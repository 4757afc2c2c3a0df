"""Environments and tools written as TRL 1.16's users write them, and as its users' code misbehaves, for
tests/llm/test_agent_contract.py (imported by 'module:name', as a user's are)."""

import asyncio
import random
import sqlite3
import threading
import time


class Multiplier:
    """TRL 1.16's contract: reset(**row) remembers the question, multiply is the tool, get_reward (no docstring: it
    is not a tool) is 1 iff the tool was asked for the row's factors."""

    def reset(self, **row):
        self.question = row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][-1]["content"]
        self.asked = False

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        x, y = (int(v) for v in self.question.rstrip("=").split("*"))
        self.asked = {a, b} == {x, y}
        return a * b

    def get_reward(self):
        return float(self.asked)

    @property
    def broken(self):
        raise RuntimeError("a property is never evaluated at discovery")


class AsyncMultiplier(Multiplier):
    """An async tool and an async get_reward, awaited (TRL awaits both)."""

    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        await asyncio.sleep(0)
        return Multiplier.multiply(self, a, b)

    async def get_reward(self):
        await asyncio.sleep(0)
        return float(self.asked) * 3.0 - 1.0  # in [-1, 2]: TRL takes any float


class Observed(Multiplier):
    """reset returns an observation, appended to the last user message (TRL's)."""

    def reset(self, **row):
        super().reset(**row)
        return " please"


class OwnsTheData(Multiplier):
    """No dataset: reset returns the question (TRL's environment that owns the data)."""

    count = 0

    def reset(self, **row):
        OwnsTheData.count += 1
        a, b = 2 + OwnsTheData.count % 7, 3
        super().reset(prompt=f"{a}*{b}=")
        return self.question


class WithDatabase(Multiplier):
    """An sqlite connection opened in reset, used in the tool and in get_reward: sqlite refuses a connection used on
    another thread than the one that made it."""

    def reset(self, **row):
        super().reset(**row)
        self.db = sqlite3.connect(":memory:")
        self.db.execute("create table calls (a int, b int)")
        self.thread = threading.get_ident()

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.db.execute("insert into calls values (?, ?)", (a, b))
        return Multiplier.multiply(self, a, b)

    def get_reward(self):
        calls = self.db.execute("select count(*) from calls").fetchone()[0]
        return float(self.asked and calls == 1)


class ResetRaises(Multiplier):
    def reset(self, **row):
        raise KeyError("no such row")


class ResetHangs(Multiplier):
    def reset(self, **row):
        time.sleep(3600)


class RewardHangs(Multiplier):
    def get_reward(self):
        time.sleep(3600)


class RewardGarbage(Multiplier):
    def get_reward(self):
        return "high"


class HangsSometimes(Multiplier):
    """multiply hangs for ``hang_s`` seconds on the factor 2 (then answers), else answers at once."""

    hang_s = 1.5

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        if 2 in (a, b):
            time.sleep(self.hang_s)
        return Multiplier.multiply(self, a, b)


class NoReward:
    """An environment with tools and no reward."""

    def reset(self, **row):
        pass

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return a * b


class RewardMethod(NoReward):
    """The reward as a method named ``reward`` (TRL offers every public method but reset and get_reward as a tool)."""

    def reward(self):
        return 1.0


class Adder:
    """A second environment for a dict of factories: its tool is add, its reward 1 iff add was called."""

    def reset(self, **row):
        self.added = False

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first term.
            b: The second term.
        """
        self.added = True
        return a + b

    def get_reward(self):
        return float(self.added)


def saw_the_observation(prompts, completions, **kwargs):
    """1 where the prompt a reward function gets ends with ``Observed``'s observation (TRL passes the prompts as
    shown, reset's text appended)."""
    last = lambda p: p if isinstance(p, str) else p[-1]["content"]  # noqa: E731
    return [float(last(p).endswith(" please")) for p in prompts]


def asked_with_environment(prompts, completions, environments, **kwargs):
    """A reward function over TRL's ``environments=``: 0.5 iff the episode's environment saw the right call."""
    return [0.5 * float(env.asked) if env is not None else None for env in environments]


async def async_multiply(a: int, b: int) -> int:
    """Multiply two integers, asynchronously.

    Args:
        a: The first factor.
        b: The second factor.
    """
    await asyncio.sleep(0)
    return a * b


def slow_multiply(a: int, b: int) -> int:
    """Multiply two integers, slowly on the factor 2.

    Args:
        a: The first factor.
        b: The second factor.
    """
    if 2 in (a, b):
        time.sleep(HangsSometimes.hang_s)
    return a * b


class AsyncReset(Multiplier):
    """An ``async def reset``: awaited on the episode's worker as the async tools and get_reward are (every episode
    failed with 'reset returned a coroutine')."""

    async def reset(self, **row):
        await asyncio.sleep(0)
        super().reset(**row)
        return " please"

    def get_reward(self):
        return float(self.asked)


class Unprintable:
    def __str__(self):
        raise RuntimeError("cannot render me")


class UnprintableAnswer(Multiplier):
    """A tool whose value's str() raises: the call's error, not the run's end."""

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        Multiplier.multiply(self, a, b)
        return Unprintable()


def reads_the_database(prompts, completions, environments, **kwargs):
    """A reward function reading WithDatabase's connection, made on the episode's worker thread."""
    return [float(env.db.execute("select count(*) from calls").fetchone()[0]) for env in environments]


class Quizmaster(Multiplier):
    """Owns its questions: a seeded stream made in __init__, one question per reset (TRL's instances are pooled and
    reset again, so each one moves on through its stream from step to step)."""

    def __init__(self):
        self.rng = random.Random(0)

    def reset(self, **row):
        a, b = self.rng.randint(2, 9), self.rng.randint(2, 9)
        super().reset(prompt=f"{a}*{b}=")
        return f" {a}*{b}="


class KeepsReward:
    """TRL's OpenEnv pattern: the episode's reward kept in a ``reward`` attribute and read back by a reward function
    over ``environments=``; no get_reward. The attribute is the user's state, not a reward source."""

    def __init__(self):
        self.reward = 0.0  # a number from the start, as many users write it

    def reset(self, **row):
        self.question = row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][-1]["content"]
        self.reward = 0.0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        x, y = (int(v) for v in self.question.rstrip("=").split("*"))
        self.reward = float({a, b} == {x, y})
        return a * b


def kept_reward(environments, **kwargs):
    return [env.reward for env in environments]


class NanReward(Multiplier):
    """get_reward returns nan where the episode made no call: TRL's nansum reads it as "does not apply"."""

    def get_reward(self):
        return float(self.asked) if self.asked else float("nan")


class DatabaseFromInit(WithDatabase):
    """An sqlite connection made in __init__ (the instance's whole life, as TRL's pooled instances keep one), used in
    reset, the tool and get_reward: every call must come on the thread that made it."""

    def __init__(self):
        self.db = sqlite3.connect(":memory:")
        self.db.execute("create table calls (a int, b int)")

    def reset(self, **row):
        Multiplier.reset(self, **row)
        self.db.execute("delete from calls")

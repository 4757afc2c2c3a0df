"""The environments, tools and reward functions of ``benchmarks/trl_agents.py``: each item of TRL 1.16's environment
contract used at least once, written as a TRL user writes them. The built-in agent model calls ``multiply`` on a
question ``a*b=`` (its format: ``[multiply{"a":3,"b":4}]<eos>=12|12<eos>``)."""

from __future__ import annotations

import asyncio
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixtures.agent_envs import Adder, AsyncMultiplier, Multiplier  # noqa: E402,F401  Adder: the dict's second
from llm.tasks.arithmetic_tools import multiply  # noqa: E402,F401  the standalone tool (--tools)


def _factors(text: str) -> tuple[int, int]:
    a, _, b = text.strip().rstrip("=").partition("*")
    return int(a), int(b)


class Calculator(Multiplier):
    """The tests' ``Multiplier`` (reset(**row) keeps the question, multiply is its tool, get_reward scores the call, a
    property that raises is never evaluated), its score read as ``right`` by the reward functions below."""

    @property
    def right(self) -> bool:
        return self.asked


class Picky(Calculator):
    """A tool that raises on some inputs (a failed call)."""

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers; refuses an odd first factor.

        Args:
            a: The first factor.
            b: The second factor.
        """
        if a % 2:
            raise ValueError(f"odd factor {a}")
        return super().multiply(a, b)


class AsyncCalculator(AsyncMultiplier, Calculator):
    """An async tool and an async get_reward whose values leave [0, 1] (``AsyncMultiplier``'s)."""


class OwnsTheData(Calculator):
    """No dataset: the environment draws its next question from a stream seeded in ``__init__`` at every reset and
    returns it (appended to an empty user message). Under TRL's pooling an instance moves on from step to step; a
    fresh instance per episode would ask the stream's first question forever."""

    def __init__(self):
        self.stream = random.Random(0)

    def reset(self, **row):
        self.question = f"{self.stream.randint(2, 9)}*{self.stream.randint(2, 9)}="
        self.asked = False
        return self.question


class Announcer(Picky):
    """The question is not in the prompt (every row's prompt is the same empty message) but in a column of the row:
    reset returns it as the observation, so only matching rows on every column pairs the episodes."""

    def reset(self, question, **row):
        self.question, self.asked = question, False
        return question


class KeepsScore(Calculator):
    """TRL's OpenEnv pattern: no get_reward; the tool keeps ``self.reward``, a reward function reads it back through
    ``environments=``. The attribute is the user's state, not a second reward source."""

    get_reward = None

    def __init__(self):
        self.reward = 0.0  # a number from the start, as many users write it

    def reset(self, **row):
        super().reset(**row)
        self.reward = 0.0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        out = Calculator.multiply(self, a, b)
        self.reward = float(self.right)
        return out


class Abstains(Calculator):
    """get_reward is nan ("does not apply", TRL's nansum) on questions whose first factor is odd."""

    def get_reward(self):
        return math.nan if _factors(self.question)[0] % 2 else float(self.right)


class Unscored(Calculator):
    """No get_reward: scored by reward functions only."""

    get_reward = None


def env_reward(prompts, completions, environments, **kwargs):
    """A reward function over TRL's ``environments=``: 0.25 iff the environment saw the right call (None for an
    environment it does not know)."""
    return [0.25 * float(e.right) if hasattr(e, "right") else None for e in environments]


async def async_env_reward(prompts, completions, environments, **kwargs):
    """``env_reward`` as an ``async def`` (TRL awaits async reward functions): 0.5 iff the right call was seen."""
    await asyncio.sleep(0)
    return [0.5 * float(e.right) if hasattr(e, "right") else None for e in environments]


def kept_reward(prompts, completions, environments, **kwargs):
    """The OpenEnv pattern's reward function: the ``reward`` each environment kept."""
    return [e.reward for e in environments]


def answer_reward(prompts, completions, **kwargs):
    """1 iff the last assistant turn's text is the product of the question's factors (the episode as messages)."""
    out = []
    for prompt, messages in zip(prompts, completions):
        a, b = _factors(prompt[-1]["content"] if not isinstance(prompt, str) else prompt)
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        out.append(float(last.strip() == str(a * b)))
    return out

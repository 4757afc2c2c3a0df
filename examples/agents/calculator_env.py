"""An environment as TRL 1.16 takes it (``GRPOTrainer(environment_factory=CalculatorEnv)``, here
``--environment-factory calculator_env:CalculatorEnv``).

- ``reset(**row)`` starts an episode on a data row (its prompt and every other column); it returns None, or text that
  is appended to the prompt's last user message.
- Every public method other than ``reset`` and ``get_reward`` is a tool (type hints and an Args: docstring, as for a
  plain tool); methods starting with ``_`` and properties are not.
- ``get_reward()`` (sync or async) scores the finished episode from the environment's state: one more reward source of
  weight 1 beside ``--reward-funcs``, logged as ``rewards/CalculatorEnv/mean``. Any float.

One instance per episode; ``__init__``, ``reset``, the tools and ``get_reward`` of an episode run on one thread, so a
connection opened in ``reset`` works in the tools.
"""

import sqlite3


class CalculatorEnv:
    def reset(self, **row):
        a, b = row["prompt"].rstrip("=").split("*")
        self.factors = {int(a), int(b)}
        self.log = sqlite3.connect(":memory:")  # state bound to this episode's thread
        self.log.execute("create table calls (a int, b int)")
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.log.execute("insert into calls values (?, ?)", (a, b))
        return a * b

    def get_reward(self) -> float:
        """1 if the one call asked for the question's factors, 0.5 if several calls did, else 0."""
        calls = self.log.execute("select a, b from calls").fetchall()
        right = [c for c in calls if set(c) == self.factors]
        return 1.0 if right and len(calls) == 1 else 0.5 if right else 0.0

"""Tools and an environment for tests/llm/test_agents.py, imported by 'module:name' as a user's would be."""

import time


def multiply(a: int, b: int) -> int:
    """Multiply two integers, off by one (a user's replacement of the built-in tool).

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b + 1


def fails(a: int, b: int) -> int:
    """A tool that raises.

    Args:
        a: Any integer.
        b: Any integer.
    """
    raise ZeroDivisionError("tool broke")


def hangs(a: int, b: int) -> int:
    """A tool that does not answer in time.

    Args:
        a: Any integer.
        b: Any integer.
    """
    time.sleep(30)
    return 0


def huge(a: int, b: int) -> str:
    """A tool whose answer is far too long.

    Args:
        a: Any integer.
        b: Any integer.
    """
    return "9" * 100_000


def opaque(a: int, b: int) -> object:
    """A tool that returns an object that is not text.

    Args:
        a: Any integer.
        b: Any integer.
    """
    return object()


def no_docstring(a: int, b: int) -> int:
    return a


class Calculator:
    """An environment in TRL 1.16's style: the episode's row is remembered at reset; get_reward is 1 iff the product
    was asked for with the row's factors."""

    def reset(self, **row):
        self.row = row
        self.asked = False

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        x, y = (int(v) for v in self.row["prompt"].rstrip("=").split("*"))
        self.asked = {a, b} == {x, y}
        return a * b

    def get_reward(self) -> float:
        return float(self.asked)

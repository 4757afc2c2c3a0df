"""A user's replacement of the built-in task's tool that fails on some inputs (tests/llm/test_agent_contract.py)."""


def multiply(a: int, b: int) -> int:
    """Multiply two integers; refuses a zero.

    Args:
        a: The first factor.
        b: The second factor.
    """
    if a == 0 or b == 0:
        raise ValueError("zero")
    return a * b

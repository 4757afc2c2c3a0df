"""Tools as TRL 1.16 takes them (``GRPOTrainer(tools=[multiply, add])``, here ``--tools calculator_tools:multiply
calculator_tools:add``): plain functions, sync or async, with type hints and a docstring whose Args: section describes
each argument. transformers builds each tool's schema from them; the chat template shows the schemas to the model."""

import asyncio


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers (an async tool: awaited on the episode's worker).

    Args:
        a: The first term.
        b: The second term.
    """
    await asyncio.sleep(0)
    return a + b


def reward_used_the_tool(prompts, completions, **kwargs) -> list[float]:
    """A reward function with TRL's signature: each completion is the episode as messages (the assistant's turns with
    their tool_calls, the tools' answers); 1 iff some tool answered without an error."""
    return [float(any(m.get("role") == "tool" and not str(m.get("content", "")).startswith("{'error'")
                      for m in messages)) for messages in completions]

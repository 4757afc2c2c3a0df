"""Reward functions for agents' episodes, with TRL's signature (``--reward-funcs llm.rewards.agents:<name>``): they
get each episode as messages (the policy's turns with their ``tool_calls``, the tools' answers)."""

from __future__ import annotations

import json

from llm.rewards.functions import parse_number


def _last_turn(messages) -> str:
    if isinstance(messages, str):
        return messages
    return next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")


def last_turn_answer(prompts, completions, answer, **kwargs) -> list[float]:
    """1 iff the last number of the episode's last turn equals ``answer`` (the tools' answers do not count)."""
    out = []
    for c, a in zip(completions, answer):
        got, want = parse_number(_last_turn(c)), parse_number(a)
        out.append(float(got is not None and want is not None and got == want))
    return out


def called_tool(prompts, completions, **kwargs) -> list[float]:
    """1 iff the episode called a tool that answered without an error (a format reward: the call was well formed,
    named a tool and got its answer)."""
    out = []
    for c in completions:
        answers = [m.get("content", "") for m in c if isinstance(m, dict) and m.get("role") == "tool"] \
            if not isinstance(c, str) else []
        out.append(float(any(not _is_error(a) for a in answers)))
    return out


def _is_error(text) -> bool:
    """A failed call's answer: TRL's ``str({"error": ...})`` (or the same as JSON)."""
    import ast

    for read in (json.loads, ast.literal_eval):
        try:
            value = read(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        return isinstance(value, dict) and "error" in value
    return False

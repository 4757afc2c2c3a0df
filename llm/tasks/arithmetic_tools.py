"""The built-in agent task, ``--dataset arithmetic_tools``, and the built-in model's tool-call format.

A question "a*b=" (a in 0..19, b in 0..9, the arithmetic task's fixed 160/40 split of the 200 pairs) is answered by
calling the tool ``multiply(a, b)`` and then writing its result. On the built-in model's character tokenizer an
accepted episode reads

    12*7=[multiply{"a":12,"b":7}]<eos>=84|84<eos>

where ``[multiply{...}]<eos>`` and ``84<eos>`` are the policy's two turns and ``=84|`` is the environment's (the tool's
answer as the chat template renders it). The reward is 1 iff the episode's tokens are one of the accepted episodes
(the call with its arguments in either order, the tool's answer, then that answer): a finite set, so J(pi | x) is
the exact sum of their probabilities under pi, the environment's tokens contributing no factor (they are the same
under every policy; docs/theory.md, §8.8). The accepted episodes are built by running the real episode loop on the
scripted turns, so the reward, the exact J and the rollouts read the same tokens, and a user's ``--tools
mod:multiply`` replaces the built-in tool in all three.
"""

from __future__ import annotations

from llm.tasks import Task, arithmetic_split

#: The built-in model's chat template: a user's text as it is, an assistant turn as its text or its calls
#: ``[name{json arguments}]``, then EOS, a tool's answer as ``=answer|``. No generation prompt, no tools section
#: (the model knows its one tool from its warm-up).
BUILTIN_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' or m.role == 'system' -%}{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- if m.content %}{{ m.content }}{% endif -%}"
    "{%- for c in m.tool_calls or [] -%}[{{ c.function.name }}"
    "{{ c.function.arguments | tojson(separators=(',', ':')) }}]{%- endfor -%}"
    "{{ eos_token }}"
    "{%- elif m.role == 'tool' -%}={{ m.content }}|"
    "{%- endif -%}"
    "{%- endfor -%}"
)
BUILTIN_TOOL_CALL_OPEN = "["

#: transformers' response template of that format (``tokenizer.parse_response``).
BUILTIN_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"\Z",  # the end of the prefix: the format has no assistant header
    "fields": {
        "tool_calls": {"open_pattern": r"\[(?P<name>[A-Za-z_]\w*)", "close": "]", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
        "content": {"close_pattern": r"<eos>|$", "content": "text"},
    },
}


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def tools_prompt(a: int, b: int) -> str:
    return f"{a}*{b}="


def accepted_plans(a: int, b: int) -> tuple[tuple[tuple[tuple[str, dict], ...], ...], ...]:
    """The accepted episodes of question (a, b) as scripts: the call's arguments in either order (once when a = b);
    the answer turn is the tool's own answer, filled in by the episode loop."""
    orders = [(a, b)] if a == b else [(a, b), (b, a)]
    return tuple(((("multiply", {"a": x, "b": y}),),) for x, y in orders)


def arithmetic_tools_task() -> Task:
    """The built-in agent task (module docstring): the arithmetic task's split of the (a, b) pairs."""
    train, test = arithmetic_split()
    prompts = lambda part: tuple(tools_prompt(a, b) for a, b in part)  # noqa: E731
    answers = lambda part: tuple(str(a * b) for a, b in part)  # noqa: E731
    plans = lambda part: tuple(accepted_plans(a, b) for a, b in part)  # noqa: E731
    return Task("arithmetic_tools", prompts(train), answers(train), test_prompts=prompts(test),
                test_answers=answers(test), accepted_scripts=plans(train), test_accepted_scripts=plans(test),
                tools=(multiply,))

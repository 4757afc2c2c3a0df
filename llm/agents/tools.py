"""Tools, TRL's interface (``GRPOTrainer(tools=...)``): finding them, their schemas, and what the model reads of an
answer.

A tool is a plain Python function (sync or async) with type hints and a docstring whose ``Args:`` section describes
each argument: transformers builds its JSON schema from them (``transformers.utils.get_json_schema``), the schema the
chat template shows the model. It is named by 'module:function' or given as the function itself (``llm.config.agent``
keeps an object that cannot be imported by name for this process: ``object:...``).

What the model reads of an answer is what TRL 1.16 sends: a list (content blocks) as it is, anything else as
``str(value)``; a call that raised, as ``str({"error": str(exception)})``. This package's extras: an answer longer
than ``max_tool_response_length`` tokens is cut, with ' [truncated]' (cut by characters before it is tokenised, so a
megabyte costs no more than its first few thousand characters), and a call that runs past ``tool_timeout`` answers
``{'error': 'no answer within tool_timeout = 10 s'}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llm.config.user_code import import_object


def tool_schema(fn: Callable, option: str = "tools") -> dict:
    """The tool's JSON schema as transformers builds it from the signature and the docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers' DocstringParsingException, TypeHintParsingException
        name = getattr(fn, "__name__", repr(fn))
        hint = (" (if it is the episode's reward, name it get_reward: TRL 1.16 reads the reward from get_reward() and "
                "offers every other public method as a tool)" if name == "reward" else "")
        raise ValueError(f"{option}: tool {name!r} has no schema transformers can build ({exc}); give it type hints "
                         f"and a docstring with an Args: section{hint}") from None


def load_tools(specs, option: str = "tools") -> list[Callable]:
    """The functions of ``--tools module:function ...``, each with a schema (checked now, not at the first call)."""
    tools = []
    for spec in specs:
        fn = import_object(spec, option)
        if not callable(fn):
            raise ValueError(f"{option}: {spec!r} is not callable")
        if not getattr(fn, "__name__", None):
            raise ValueError(f"{option}: {spec!r} has no __name__, which is the tool's name the model calls")
        tool_schema(fn, option)
        tools.append(fn)
    names = [t.__name__ for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"{option}: two tools share a name ({', '.join(names)})")
    return tools


def answer_content(value):
    """What the model reads of a tool's answer, as TRL 1.16 sends it: a list (content blocks) as it is, anything else
    as ``str(value)``."""
    return value if isinstance(value, list) else str(value)


def error_content(message: str) -> str:
    """A failed call's answer, as TRL 1.16 writes it: ``str({"error": message})``."""
    return str({"error": message})


@dataclass
class AnswerBudget:
    """Cuts a tool's text answer to ``max_tokens`` tokens of ``tokenizer`` (0: no limit), with ' [truncated]'. The
    text is first cut to ``max_tokens`` x the longest token's characters: no more than that can be among the kept
    tokens, so the cut is the same as tokenising the whole answer, at the cost of its first few thousand
    characters."""

    max_tokens: int
    tokenizer: object
    truncated: int = field(default=0, init=False)
    _token_chars: int = field(default=0, init=False)

    @property
    def token_chars(self) -> int:
        """The most characters one token decodes to (a byte-level token's string has one character per byte)."""
        if not self._token_chars:
            vocab = self.tokenizer.get_vocab()
            self._token_chars = max(8, max((len(t) for t in vocab), default=8))
        return self._token_chars

    def __call__(self, content):
        if not self.max_tokens or not isinstance(content, str):
            return content
        text = content[: self.max_tokens * self.token_chars + 1]
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) <= self.max_tokens and len(text) == len(content):
            return content
        self.truncated += 1
        return self.tokenizer.decode(ids[: self.max_tokens]) + " [truncated]"

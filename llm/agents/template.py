"""The chat template's tool-call format, read through transformers: what the environment's tokens are after a turn
that called tools, and what a turn says (``ToolTemplate``).

- The environment's tokens: the tool messages rendered by the tokenizer's own chat template after a short dummy
  conversation whose assistant turn ends with EOS, minus that conversation: exactly the tokens the template puts
  between the policy's EOS and its next turn (the tool's answer, the roles' glue, the generation prompt).
- A turn's meaning: ``tokenizer.parse_response`` with the tokenizer's ``response_template`` (transformers' response
  parsing). A tokenizer without one gets the template of a format this module knows (the built-in model's and the
  ``<tool_call>`` JSON format of Qwen and Hermes) when its chat template renders tool calls that way; otherwise it is
  refused at start-up, as is a chat template that cannot express a tool call or its answer.
"""

from __future__ import annotations

from dataclasses import dataclass

#: transformers' response template of the ``<tool_call>{json}</tool_call>`` format (Qwen2.5, Qwen3, Hermes; the
#: ChatML template shipped in llm/agents/templates/chatml_tools.jinja).
TOOL_CALL_JSON = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*|$", "content": "text"},
    },
}

_PROBE_TOOL, _PROBE_ANSWER = "probe_tool_x", "probe-answer-7"


@dataclass
class Parsed:
    """A turn as TRL 1.16 reads it (``trl.chat_template_utils.parse_response``): the message (role, content and any
    ``tool_calls``), its calls, and, when the parser could not read it, why (``malformed``: the turn is then a final
    answer, its text decoded, as TRL takes it)."""

    message: dict
    malformed: str = ""

    @property
    def calls(self) -> list[dict]:
        return self.message.get("tool_calls") or []

    @property
    def content(self) -> str:
        return self.message.get("content") or ""


class ToolTemplate:
    """The tool-call format of ``tokenizer``'s chat template."""

    def __init__(self, tokenizer, tools: list):
        self.tokenizer, self.tools = tokenizer, tools
        self.eos = tokenizer.eos_token_id
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tools: the model's tokenizer has no chat template, so tool calls have no format; pass a "
                             "template that renders them with --chat-template-path")
        rendered = self._render(self._probe_conversation(), tokenize=False)
        if _PROBE_TOOL not in rendered or _PROBE_ANSWER not in rendered:
            missing = "tool calls" if _PROBE_TOOL not in rendered else "tool results"
            raise ValueError(f"tools: the chat template cannot express {missing} (a call of {_PROBE_TOOL!r} and its "
                             "answer do not appear in its rendering); pass a tool-capable template with "
                             "--chat-template-path")
        self.response_template = getattr(tokenizer, "response_template", None) or self._known_format(rendered)
        if self.response_template is None:
            raise ValueError("tools: the tokenizer has no response_template (transformers' response parsing) and its "
                             "chat template's tool-call format is not one this package knows; set "
                             "tokenizer.response_template in tokenizer_config.json")

    def _render(self, messages: list[dict], tokenize: bool, generation_prompt: bool = False, tools=None):
        tools = self.tools if tools is None else tools
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=tokenize,
                                                  add_generation_prompt=generation_prompt, return_dict=False)

    def _probe_conversation(self) -> list[dict]:
        return [{"role": "user", "content": "q"}, self.call_message([(_PROBE_TOOL, {"x": 1})]),
                {"role": "tool", "name": _PROBE_TOOL, "content": _PROBE_ANSWER}]

    @staticmethod
    def call_message(calls: list[tuple[str, dict]], content: str = "") -> dict:
        """An assistant message calling ``calls`` (name, arguments), in transformers' message format."""
        return {"role": "assistant", "content": content,
                "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}

    def _known_format(self, rendered: str) -> dict | None:
        from llm.tasks.arithmetic_tools import BUILTIN_RESPONSE_TEMPLATE, BUILTIN_TOOL_CALL_OPEN

        if "<tool_call>" in rendered and "<|im_start|>" in rendered:
            return TOOL_CALL_JSON
        if f"{BUILTIN_TOOL_CALL_OPEN}{_PROBE_TOOL}{{" in rendered:
            return BUILTIN_RESPONSE_TEMPLATE
        return None

    def prompt_ids(self, messages: list[dict], tools=None) -> list[int]:
        """A conversation's tokens with the tools' schemas (``tools``: a row's own; default: every tool) and the
        generation prompt."""
        return list(self._render(messages, tokenize=True, generation_prompt=True, tools=tools))

    def turn_ids(self, message: dict) -> list[int]:
        """The tokens of one assistant turn as the template writes it, EOS included (the built-in task's accepted
        episodes and the warm-up's; the policy's own turns are never re-tokenised)."""
        user = {"role": "user", "content": "q"}
        before = self._render([user], tokenize=True, generation_prompt=True)
        after = self._render([user, message], tokenize=True)
        ids = self._after(before, after, "an assistant turn")
        return ids[: ids.index(self.eos) + 1] if self.eos in ids else ids

    def environment_ids(self, tool_messages: list[dict]) -> list[int]:
        """The tokens after a turn that ended with EOS and called tools: ``tool_messages`` (role 'tool') rendered by
        the template, with its glue and the next turn's generation prompt. As TRL 1.16 computes them: after a dummy
        conversation whose assistant turn calls the first answer's tool, rendered without the tools' schemas, cut
        at its last EOS."""
        convo = [{"role": "user", "content": "dummy"}, self.call_message([(tool_messages[0]["name"], {})])]
        before = list(self._render(convo, tokenize=True, tools=[]))
        eos_at = [i for i, t in enumerate(before) if t == self.eos]
        if eos_at:  # the template may write more after the turn's EOS (a newline): that is the environment's
            before = before[: eos_at[-1] + 1]
        after = self._render(convo + tool_messages, tokenize=True, generation_prompt=True, tools=[])
        return self._after(before, after, "a tool's answer")

    def _after(self, before: list[int], after: list[int], what: str) -> list[int]:
        before, after = list(before), list(after)
        if after[: len(before)] != before:
            raise ValueError(f"tools: the chat template renders {what} by changing the tokens before it, so the "
                             "episode's tokens cannot be extended in place; use a template whose renderings extend "
                             "one another (--chat-template-path)")
        return after[len(before):]

    def parse(self, turn_ids: list[int], prefix: list[int] | None = None, tools=None) -> Parsed:
        """One turn of the policy (its tokens, EOS included) read as TRL 1.16 reads it: transformers' response
        parsing with the tokens before it as ``prefix`` and the episode's tools; the content without a trailing EOS
        text; a call without a name, or a turn the parser cannot read, makes the whole turn a final answer, its
        tokens decoded."""
        tools = self.tools if tools is None else tools
        try:
            message = self.tokenizer.parse_response(list(turn_ids), self.response_template, prefix=list(prefix or []),
                                                    tools=tools or None)
            if message is None:
                raise ValueError("parse_response returned None")
            message = dict(message)
            if isinstance(message.get("content"), str):
                message["content"] = message["content"].removesuffix(self.tokenizer.eos_token)
            if not message.get("content"):
                message["content"] = ""
            if "tool_calls" in message:
                message["tool_calls"] = _checked_calls(message["tool_calls"])
        except Exception as exc:  # noqa: BLE001 - a turn the format cannot read is the model's text, as TRL takes it
            return Parsed({"role": "assistant", "content": self.tokenizer.decode(list(turn_ids),
                                                                                 skip_special_tokens=True)},
                          f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
        return Parsed(message)


def _checked_calls(calls) -> list[dict]:
    """TRL 1.16's check of parsed calls (``_validate_tool_calls``): a list of dicts, each call's name a string,
    missing arguments {}; anything else raises (the turn is then a final answer)."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ValueError("tool_calls must be a list or None.")
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise ValueError(f"tool_calls[{i}] must be a dict.")
        fn = call.get("function", call)
        if not isinstance(fn, dict):
            raise ValueError(f"tool_calls[{i}]['function'] must be a dict.")
        if not isinstance(fn.get("name"), str):
            raise ValueError(f"tool_calls[{i}] needs a name that is a string.")
        if fn.get("arguments") is None:
            fn["arguments"] = {}
    return calls

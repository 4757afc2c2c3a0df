"""Tools and environments, TRL's interface (``GRPOTrainer(tools=..., environment_factory=...)``), and the calls.

A tool is a plain Python function with type hints and a docstring whose ``Args:`` section describes each argument:
transformers builds its JSON schema from them (``transformers.utils.get_json_schema``), the schema the chat template
shows the model. An environment is a class whose ``reset(**row)`` starts an episode on a data row and whose public
methods are its tools; after the episode its ``reward`` attribute, when it has one, is a reward source.

``ToolRunner.call`` never raises: a tool that raises, hangs past ``tool_timeout`` seconds, returns something that is
not text, or returns more than ``max_tool_response_length`` tokens; an unknown tool; arguments the tool does not
take: each gives the model an error text as the tool's answer (TRL's ``{"error": ...}``) and counts as a failure.
"""

from __future__ import annotations

import importlib
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


def import_object(spec: str, option: str):
    """``package.module:name`` imported; ``ValueError`` naming ``option`` otherwise."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{option}: expected 'module:name', got {spec!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{option}: cannot import {spec!r} ({exc})") from None


def tool_schema(fn: Callable, option: str = "tools") -> dict:
    """The tool's JSON schema as transformers builds it from the signature and the docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as exc:  # transformers' DocstringParsingException, TypeHintParsingException
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(f"{option}: tool {name!r} has no schema transformers can build ({exc}); give it type hints "
                         "and a docstring with an Args: section") from None


def load_tools(specs, option: str = "tools") -> list[Callable]:
    """The functions of ``--tools module:function ...``, each with a schema (checked now, not at the first call)."""
    tools = []
    for spec in specs:
        fn = import_object(spec, option)
        if not callable(fn):
            raise ValueError(f"{option}: {spec!r} is not callable")
        tool_schema(fn, option)
        tools.append(fn)
    names = [t.__name__ for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"{option}: two tools share a name ({', '.join(names)})")
    return tools


def environment_tools(env) -> list[Callable]:
    """An environment's tools: its public methods other than ``reset`` (bound to it)."""
    return [getattr(env, n) for n in dir(env) if not n.startswith("_") and n != "reset"
            and inspect.ismethod(getattr(env, n))]


def check_environment_factory(factory, option: str = "environment_factory") -> list[str]:
    """Make one environment now and check it: a ``reset`` and at least one tool with a schema. Returns its tools'
    names."""
    try:
        env = factory()
    except Exception as exc:
        raise ValueError(f"{option}: {getattr(factory, '__name__', factory)!r}() raised {type(exc).__name__}: {exc}") \
            from None
    if not callable(getattr(env, "reset", None)):
        raise ValueError(f"{option}: the environment has no reset(**row) method")
    tools = environment_tools(env)
    if not tools:
        raise ValueError(f"{option}: the environment has no public methods, so no tools")
    for t in tools:
        tool_schema(t, option)
    return [t.__name__ for t in tools]


#: What a failed call is, by kind (``tools/failure_frequency`` counts them all; the log names each kind once).
FAILURES = ("raised", "timed out", "not text", "unknown tool", "malformed call", "over the call limit")


@dataclass
class CallResult:
    text: str
    failure: str | None = None  # one of FAILURES
    detail: str = ""


@dataclass
class ToolRunner:
    """Calls tools with ``timeout`` seconds each (0: none) and answers of at most ``max_tokens`` tokens of
    ``tokenizer`` (longer ones are cut, with a note; 0: no limit)."""

    timeout: float
    max_tokens: int
    tokenizer: object
    truncated: int = field(default=0, init=False)

    def call(self, tools: dict[str, Callable], name: str, arguments) -> CallResult:
        if name not in tools:
            known = ", ".join(sorted(tools)) or "none"
            return CallResult(json.dumps({"error": f"unknown tool {name!r} (tools: {known})"}), "unknown tool", name)
        if not isinstance(arguments, dict):
            return CallResult(json.dumps({"error": "arguments must be an object"}), "malformed call", name)
        out, error = self._run(tools[name], arguments)
        if error is not None:
            kind, detail = error
            return CallResult(json.dumps({"error": self._budget(detail)}), kind, f"{name}: {detail}")
        if isinstance(out, str):
            text, failure = out, None
        else:
            try:
                text, failure = json.dumps(out), None
            except (TypeError, ValueError):
                text, failure = str(out), "not text"
        return CallResult(self._budget(text), failure, f"{name} returned {type(out).__name__}" if failure else "")

    def _run(self, fn: Callable, arguments: dict):
        box: dict = {}

        def target():
            try:
                box["out"] = fn(**arguments)
            except BaseException as exc:  # noqa: BLE001  the tool's exception is its answer
                box["err"] = f"{type(exc).__name__}: {exc}"

        if not self.timeout:
            target()
        else:
            worker = threading.Thread(target=target, daemon=True, name="tool-call")  # a hung tool is left behind
            worker.start()
            worker.join(self.timeout)
            if worker.is_alive():
                return None, ("timed out", f"no answer within tool_timeout = {self.timeout:g} s")
        if "err" in box:
            return None, ("raised", box["err"])
        return box.get("out"), None

    def _budget(self, text: str) -> str:
        if not self.max_tokens:
            return text
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) <= self.max_tokens:
            return text
        self.truncated += 1
        return self.tokenizer.decode(ids[: self.max_tokens]) + " [truncated]"

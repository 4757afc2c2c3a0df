"""Typed command lines (tyro) with one-line errors instead of tracebacks or boxes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
import typing
import warnings
from typing import Callable, TypeVar

import tyro

T = TypeVar("T")

#: tyro's names of types, as the config's own one-line errors say them.
_KINDS = {"none": "None", "int": "an integer", "float": "a number", "str": "text"}
_RULE = re.compile(r"^[\s\-─━│┃╭╮╰╯┏┓┗┛]*$")
_BOX_CHARS = re.compile(r"[│┃╭╮╰╯┏┓┗┛─━]")


def _first_error_line(text: str) -> str:
    """Reduce tyro's boxed error (title, rule, message, rule, help...) to the message, one line."""
    blocks, cur = [], []
    for raw in text.splitlines():
        line = _BOX_CHARS.sub("", raw).strip()
        if _RULE.match(raw) or not line:
            if cur:
                blocks.append(cur)
                cur = []
            continue
        cur.append(line)
    if cur:
        blocks.append(cur)
    body = blocks[1] if len(blocks) > 1 else (blocks[0] if blocks else ["invalid command line"])
    hints = []
    for block in blocks[2:]:  # tyro's "Perhaps you meant:" / "Arguments similar to --x:" and the options it lists
        head = re.fullmatch(r"(?:Perhaps you meant|Arguments similar to (\S+)):", block[0])
        flags = [line.split()[0].rstrip(",") for line in block[1:] if line.startswith("--")]  # "--x, --no-x"
        if head and flags:
            hints.append(f"{head.group(1) + ': ' if head.group(1) else ''}did you mean {', '.join(flags)}?")
    message = re.sub(r"^Error parsing \S+: (?=\w+: )", "", " ".join(body))  # a config's own line: no group names
    unread = re.fullmatch(r"Error parsing (\S+): no type matching (.+) could be instantiated from \[(.*)\]\.?", message)
    if unread:  # tyro's words for a value of a union type it cannot read
        kinds = " or ".join(_KINDS.get(k.strip("{}").lower(), k) for k in unread.group(2).split("|"))
        message = f"{unread.group(1)}: must be {kinds}, got {unread.group(3)}"
    python = re.fullmatch(r"Error parsing (\S+): (invalid literal for int\(\) with base 10|could not convert string "
                          r"to float): (.*)", message)
    if python:  # int()'s and float()'s words
        message = f"{python.group(1)}: must be {'an integer' if 'int' in python.group(2) else 'a number'}, got " \
                  f"{python.group(3)}"
    return message + (f" ({'; '.join(hints)})" if hints else "")


def _fields(cls) -> list[str]:
    """The field names of a dataclass or a pydantic model class."""
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls.model_fields)


def switch_names(cls) -> set[str]:
    """The names of the boolean fields of ``cls`` (a dataclass or a pydantic model) and of the ones it holds (its
    switches)."""
    hints = typing.get_type_hints(cls)
    out = set()
    for name in _fields(cls):
        if hints[name] is bool:
            out.add(name)
        elif dataclasses.is_dataclass(hints[name]) or hasattr(hints[name], "model_fields"):
            out |= switch_names(hints[name])
    return out


def switch_name(flag: str) -> str:
    """The field a switch's flag names, whichever spelling: ``--no-use-peft``, ``--use_peft`` -> ``use_peft``."""
    return flag.removeprefix("--").replace("-", "_").removeprefix("no_")


def _switch_hint(message: str, argv: list[str], switches: set[str]) -> str:
    """For a value tyro did not take after one of the ``switches`` (``--use-peft no``): how switches are written."""
    if not message.startswith("Unrecognized options: "):
        return ""
    unknown = message.removeprefix("Unrecognized options: ").split(" (")[0].split(", ")
    for flag, arg in zip(argv, argv[1:]):
        name = switch_name(flag)
        if arg in unknown and not arg.startswith("-") and flag.startswith("--") and name in switches:
            dashed = name.replace("_", "-")
            return f" ({flag} is a switch: --{dashed} or --no-{dashed}, without a value)"
    return ""


def parse(cls: type[T], args: list[str] | None, prog: str, description: str | None = None,
          explain: Callable[[str], str] = lambda message: message) -> T:
    """Parse ``args`` into ``cls`` with tyro; on a bad option print ``prog: error: ...`` and exit 2 (``explain``
    may rewrite the message first, e.g. to name an option as the user typed it).

    ``--help`` prints tyro's full help as usual.
    """
    argv = sys.argv[1:] if args is None else list(args)
    if any(a in ("-h", "--help") for a in argv):
        return tyro.cli(cls, args=argv, prog=prog, description=description)
    buf = io.StringIO()
    try:
        with (contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf),
              warnings.catch_warnings(record=True) as seen):
            warnings.simplefilter("always", FutureWarning)
            config = tyro.cli(cls, args=argv, prog=prog, description=description)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        message = explain(_first_error_line(buf.getvalue()))
        fail(prog, message + _switch_hint(message, argv, switch_names(cls)) + " (see --help)")
    for w in seen:  # what the config says of a value it accepted (a renamed choice), which the capture would hide
        if issubclass(w.category, FutureWarning):
            print(f"{prog}: warning: {w.message}", file=sys.stderr)
    return config


def exception_text(exc: BaseException) -> str:
    """str() of an exception, or its type's name where that str() raises too (a user's ``__str__``)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - the user's __str__
        return f"<{type(exc).__name__} whose str() raised>"


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (at most ``limit`` characters), or its type's name:
    what a one-line error quotes of an exception raised by a library or a user's code."""
    for line in exception_text(exc).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(exc).__name__


class RunError(RuntimeError):
    """A failure of the run's environment, not of its configuration (a server that died, a lost
    connection): ``run_main`` prints it as one line and exits with status 1."""


def fail(prog: str, message: str) -> None:
    """Print a one-line error and exit with status 2 (a usage error)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_main(main: Callable[[list[str] | None], int], prog: str) -> None:
    """Run a CLI ``main``, turning ``ValueError`` (a bad configuration, exit 2) and ``RunError`` (a failing
    environment, exit 1) into a one-line error."""
    try:
        code = main(None)
    except ValueError as exc:
        fail(prog, str(exc))
    except RunError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:  # the reader went away (``--help | head``): stop quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush fails no more
        raise SystemExit(1) from None
    raise SystemExit(code or 0)

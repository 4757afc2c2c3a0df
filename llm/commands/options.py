"""docs/options.md, written from ``GRPOConfig`` itself: every option, its default and its docstring, under the group
that holds it (``llm.config``). ``python -m llm options > docs/options.md`` rewrites the page; a test fails when the
page and the config disagree."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

from llm.config import GROUPS, GRPOConfig, flat_fields

HEADER = """# Options

Every field of `llm.GRPOConfig` is an option of `python -m llm train` (`--field-name value`, booleans as
`--field-name` / `--no-field-name`); `python -m llm train --help` prints the same text. A bad value is one line
naming the field. Names are TRL's where the concept is the same ([trl.md](trl.md)). In Python the fields sit in the
groups below (`config.optim.learning_rate`, each group checking its own fields); the command line, `from_trl`,
`GRPOConfig(learning_rate=...)`, `config.learning_rate` and config.json keep them flat. Options marked *resumable* may
change when a run resumes. This page is written by `python -m llm options > docs/options.md`.
"""


def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring below it in ``cls``'s source, on one line."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    out = {}
    for node, nxt in zip(body, [*body[1:], None]):
        if isinstance(node, ast.AnnAssign):
            doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
            out[node.target.id] = " ".join(str(doc).split())
    return out


def section_title(group: str) -> str:
    """``optim`` -> "optim: The optimiser: ..." (the group's docstring's first sentence); "" -> the run's own."""
    if not group:
        return "The run (GRPOConfig's own fields)"
    return f"{group}: {GROUPS[group].__doc__.split(chr(10))[0].strip()}"


def documented_fields() -> list[tuple[str, str, str]]:
    """(group, field name, docstring) for every option, in the order of ``--help``."""
    docs = {group: field_docs(GROUPS[group] if group else GRPOConfig) for group in ("", *GROUPS)}
    return [(group, f.name, docs[group].get(f.name, "")) for group, f in flat_fields()]


def default_text(field: dataclasses.Field) -> str:
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    mark = " (resumable)" if field.metadata.get("resumable") else ""
    return f"`{value!r}`{mark}"


def markdown() -> str:
    fields = {f.name: f for _, f in flat_fields()}
    parts, current = [HEADER.rstrip()], None
    for group, name, doc in documented_fields():
        if group != current:
            current = group
            parts.append(f"\n## {section_title(group)}\n\n| option | default | meaning |\n|---|---|---|")
        cell = doc.replace("|", "\\|")
        parts.append(f"| `--{name.replace('_', '-')}` | {default_text(fields[name])} | {cell} |")
    return "\n".join(parts) + "\n"


PROG = "python -m llm options"


def main(args: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if args is None else list(args)
    if args in (["-h"], ["--help"]):
        print(f"usage: {PROG}\n\nPrints docs/options.md, every option of the trainer with its default and meaning "
              f"(from GRPOConfig). Takes no options.")
        return 0
    if args:
        raise ValueError(f"takes no options, got {' '.join(args)} (see --help)")
    print(markdown(), end="")
    return 0

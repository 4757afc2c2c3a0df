"""docs/options.md, written from ``GRPOConfig`` itself: every field, its default and its docstring, under the
group comment it sits below in llm/config.py. ``python -m llm.options > docs/options.md`` rewrites the page; a
test fails when the page and the config disagree."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re

from llm.config import GRPOConfig

HEADER = """# Options

Every field of `llm.GRPOConfig` is an option of `python -m llm.train` (`--field-name value`, booleans as
`--field-name` / `--no-field-name`); `python -m llm.train --help` prints the same text. A bad value is one line
naming the field. Names are TRL's where the concept is the same ([trl.md](trl.md)). This page is written by
`python -m llm.options > docs/options.md`.
"""

#: ``# ---- model and data ----`` above a run of fields.
GROUP = re.compile(r"^\s*# -+ (.+?) -+\s*$")


def documented_fields() -> list[tuple[str, str, str]]:
    """(group, field name, docstring) for every field of GRPOConfig, in source order."""
    source = inspect.getsource(GRPOConfig)
    lines = source.splitlines()
    body = ast.parse(source).body[0].body
    out, group = [], ""
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign):
            continue
        for line in lines[: node.lineno - 1][::-1]:
            if m := GROUP.match(line):
                group = m.group(1)
                break
        nxt = body[i + 1] if i + 1 < len(body) else None
        doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
        out.append((group, node.target.id, " ".join(doc.split())))
    return out


def default_text(field: dataclasses.Field) -> str:
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return f"`{value!r}`"


def markdown() -> str:
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    parts, current = [HEADER.rstrip()], None
    for group, name, doc in documented_fields():
        if group != current:
            current = group
            title = group[0].upper() + group[1:]
            parts.append(f"\n## {title}\n\n| option | default | meaning |\n|---|---|---|")
        cell = doc.replace("|", "\\|")
        parts.append(f"| `--{name.replace('_', '-')}` | {default_text(fields[name])} | {cell} |")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")

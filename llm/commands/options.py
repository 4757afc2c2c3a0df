"""docs/options.md, written from ``GRPOConfig`` itself: every option, its default and its docstring, under the group
that holds it (``llm.config``). ``python -m llm options > docs/options.md`` rewrites the page; a test fails when the
page and the config disagree."""

from __future__ import annotations

from pydantic.fields import FieldInfo

from llm.config import GROUPS, flat_fields
from llm.config.fields import is_resumable

HEADER = """# Options

Every field of `llm.GRPOConfig` is an option of `python -m llm train` (`--field-name value`, booleans as
`--field-name` / `--no-field-name`); `python -m llm train --help` prints the same text. A bad value is one line
naming the field. Names are TRL's where the concept is the same ([trl.md](trl.md)). In Python `GRPOConfig` is a
pydantic model whose fields sit in the groups below, each a frozen pydantic model checking its own fields
(`config.optim.learning_rate`; `model_dump`, `model_dump(exclude_unset=True)` for what was said, `model_validate`,
whose errors are pydantic's ValidationError, and `model_json_schema`, of the nested form). The command line,
`from_trl`, `GRPOConfig(learning_rate=...)`, `config.learning_rate` and config.json keep the names flat;
`config.learning_rate = x` and `config.model_copy(update={"learning_rate": x})` give a new, re-validated group (a group
never changes once built; `model_copy` validates here, unlike pydantic's own, so no flat name can shadow its group).
Options marked *resumable* may change when a run resumes. This page is written by
`python -m llm options > docs/options.md`.
"""


def section_title(group: str) -> str:
    """``optim`` -> "optim: The optimiser: ..." (the group's docstring's first sentence); "" -> the run's own."""
    if not group:
        return "The run (GRPOConfig's own fields)"
    return f"{group}: {GROUPS[group].__doc__.split(chr(10))[0].strip()}"


def documented_fields() -> list[tuple[str, str, str]]:
    """(group, field name, docstring) for every option, in the order of ``--help`` (pydantic's description of each
    field: the docstring below it, on one line)."""
    return [(group, name, " ".join((info.description or "").split())) for group, name, info in flat_fields()]


def default_text(info: FieldInfo) -> str:
    mark = " (resumable)" if is_resumable(info) else ""
    return f"`{info.get_default(call_default_factory=True)!r}`{mark}"


def markdown() -> str:
    fields = {name: info for _, name, info in flat_fields()}
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

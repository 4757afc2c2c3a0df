"""``python -m llm agent-data OUT.jsonl``: a multiplication task for a pretrained model with a calculator tool.

Rows in TRL's format: ``prompt`` ("What is 347 * 28? ...") and ``answer`` (the product). Three-digit by two-digit
factors, so that a small model cannot multiply in its head and gains by calling ``multiply`` (``llm.tasks.arithmetic_tools``,
``--tools llm.tasks.arithmetic_tools:multiply``); the default reward (``--answer-check last_number``) reads the last turn of the
episode only (``TokenizedTask.texts``), so the tool's answer alone scores nothing. The question shows the call's
format, which SmolLM2-135M-Instruct does not produce unprompted (docs/results.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runkit.cli import parse
from runkit.validation import require

PROG = "python -m llm agent-data"
QUESTION = ('What is {a} * {b}? Call the multiply tool by writing <tool_call>{{"name": "multiply", "arguments": '
            '{{"a": {a}, "b": {b}}}}}</tool_call>, then reply with the product only.')


def multiplication_rows(n: int, seed: int) -> list[dict]:
    """``n`` questions a * b with a in 100..999 and b in 10..99, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(100, 1000, n), rng.integers(10, 100, n)
    return [{"prompt": QUESTION.format(a=int(x), b=int(y)), "answer": str(int(x) * int(y))} for x, y in zip(a, b)]


@dataclass
class DataArgs:
    """Write the multiplication task's training and test rows (JSONL)."""

    out: Path
    """The training rows' file; the test rows go beside it with '-test' before the suffix."""
    train_size: int = 512
    test_size: int = 64
    seed: int = 0

    def __post_init__(self):
        require(self, self.train_size >= 1, "train_size", "must be >= 1")
        require(self, self.test_size >= 0, "test_size", "must be >= 0")


def main(argv: list[str] | None = None) -> int:
    args = parse(DataArgs, argv, prog=PROG, description=DataArgs.__doc__)
    rows = multiplication_rows(args.train_size + args.test_size, args.seed)
    test = args.out.with_name(args.out.stem + "-test" + args.out.suffix)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for path, part in ((args.out, rows[: args.train_size]), (test, rows[args.train_size:])):
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        print(path)
    return 0


if __name__ == "__main__":
    from runkit.cli import run_main

    run_main(main, prog=PROG)

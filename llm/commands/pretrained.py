"""``python -m llm pretrained smollm2``: print the SmolLM2-135M-Instruct model directory, converting the installed
GGUF file once (``llm.models.pretrained``)."""

from __future__ import annotations

import sys

from llm.models.pretrained import smollm2_dir

PROG = "python -m llm pretrained"


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if args != ["smollm2"]:
        raise ValueError("expected one argument: smollm2 (prints the SmolLM2-135M-Instruct model directory)")
    print(smollm2_dir(log=lambda *a: print(*a, file=sys.stderr)))
    return 0

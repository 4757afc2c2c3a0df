"""Verifiable tasks: prompts with reference answers and a reward function in [0, 1].

- ``arithmetic``: the built-in task, "a+b=" with a in 0..19, b in 0..9; reward 1 iff the
  completion (up to end of sequence) is exactly the decimal sum.
- GSM8K-format JSONL (``question``, ``answer`` ending in "#### N"): reward 1 iff the last number in
  the completion equals N.
- A user reward function ``module:function`` with signature ``(completion: str, answer: str) -> float``.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

RewardFn = Callable[[str, str], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Task:
    """A finite pool of prompts with answers and a verifiable reward."""

    name: str
    prompts: tuple[str, ...]
    answers: tuple[str, ...]
    reward_fn: RewardFn

    def __post_init__(self):
        if len(self.prompts) == 0:
            raise ValueError(f"dataset: task {self.name!r} has no prompts")
        if len(self.prompts) != len(self.answers):
            raise ValueError("dataset: prompts and answers differ in number")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Indices of n prompts drawn uniformly with replacement."""
        return rng.integers(0, len(self.prompts), size=n)

    def score(self, completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        """Rewards as float64; raises if the reward function leaves [0, 1] (the bound needs it)."""
        r = np.array([float(self.reward_fn(c, a)) for c, a in zip(completions, answers)], dtype=np.float64)
        if r.size and (not np.all(np.isfinite(r)) or r.min() < 0 or r.max() > 1):
            raise ValueError(f"reward_fn: rewards must lie in [0, 1], got range [{r.min()}, {r.max()}]")
        return r


# ----------------------------------------------------------------------------------------------
# Built-in arithmetic task
# ----------------------------------------------------------------------------------------------

ARITH_A = range(20)
ARITH_B = range(10)


def arithmetic_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, equals the answer."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


def arithmetic_task() -> Task:
    pairs = [(a, b) for a in ARITH_A for b in ARITH_B]
    return Task(
        "arithmetic",
        tuple(arithmetic_prompt(a, b) for a, b in pairs),
        tuple(str(a + b) for a, b in pairs),
        exact_match_reward,
    )


# ----------------------------------------------------------------------------------------------
# GSM8K format
# ----------------------------------------------------------------------------------------------


def parse_number(text: str) -> float | None:
    """The last number in ``text`` (commas allowed as thousands separators), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def gsm8k_answer(answer_field: str) -> str:
    """The final answer of a GSM8K ``answer`` field: the text after the last '####'."""
    if "####" not in answer_field:
        raise ValueError("dataset: a GSM8K answer must end with '#### <number>'")
    return answer_field.rsplit("####", 1)[1].strip().replace(",", "")


def numeric_reward(completion: str, answer: str) -> float:
    """1.0 iff the last number in the completion equals the numeric answer."""
    got, want = parse_number(completion), parse_number(answer)
    return 1.0 if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=1e-6) else 0.0


GSM8K_TEMPLATE = "Question: {question}\nAnswer:"


def load_gsm8k_jsonl(path: str | Path, template: str = GSM8K_TEMPLATE) -> Task:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset: file not found: {path}")
    prompts, answers = [], []
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompts.append(template.format(question=row["question"].strip()))
                answers.append(gsm8k_answer(row["answer"]))
            except (json.JSONDecodeError, KeyError, AttributeError) as exc:
                raise ValueError(f"dataset: {path}:{i}: expected a JSON object with 'question' and 'answer' ({exc})") from None
    return Task(f"gsm8k:{path.name}", tuple(prompts), tuple(answers), numeric_reward)


def load_hub_gsm8k(name: str, split: str = "train", template: str = GSM8K_TEMPLATE) -> Task:
    """A GSM8K-format data set by ``datasets`` name (needs the optional ``datasets`` package and network)."""
    try:
        import datasets  # noqa: PLC0415
    except ImportError:
        raise ValueError("dataset: loading a hub data set needs `pip install datasets`; pass a local JSONL file instead") from None
    config = "main" if name in ("gsm8k", "openai/gsm8k") else None
    ds = datasets.load_dataset(name, config, split=split)
    return Task(f"hf:{name}", tuple(template.format(question=q.strip()) for q in ds["question"]),
                tuple(gsm8k_answer(a) for a in ds["answer"]), numeric_reward)


def import_reward_fn(path: str) -> RewardFn:
    """Import ``package.module:function``; the function maps (completion, answer) to a float in [0, 1]."""
    if ":" not in path:
        raise ValueError(f"reward_fn: expected 'module:function', got {path!r}")
    module, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"reward_fn: cannot import {path!r} ({exc})") from None
    if not callable(fn):
        raise ValueError(f"reward_fn: {path!r} is not callable")
    return fn


def load_task(dataset: str, reward_fn: str = "") -> Task:
    """``arithmetic`` (built in), a path to a GSM8K-format JSONL file, or ``hf:<name>``."""
    if dataset == "arithmetic":
        task = arithmetic_task()
    elif dataset.startswith("hf:"):
        task = load_hub_gsm8k(dataset[3:])
    elif dataset.endswith((".jsonl", ".json")) or Path(dataset).exists():
        task = load_gsm8k_jsonl(dataset)
    else:
        raise ValueError(f"dataset: expected 'arithmetic', a .jsonl path or 'hf:<name>', got {dataset!r}")
    if reward_fn:
        task = Task(task.name, task.prompts, task.answers, import_reward_fn(reward_fn))
    return task

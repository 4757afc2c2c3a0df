"""Procedural tasks from reasoning-gym: ``--dataset reasoning_gym:<name>`` (e.g. ``basic_arithmetic``, ``chain_sum``,
``gsm_symbolic``; ``python -c "import reasoning_gym.factory as f; print(sorted(f.DATASETS))"`` lists them all).

reasoning-gym generates questions with their answers from a seed and scores an answer with the generator's own
``score_answer`` (exact match 1, partial credit for some tasks, always in [0, 1]). Here:

- **prompts**: the question and ``instruction`` (default "Reply with the final answer only.") on the next line; with
  ``--chat-template`` rendered as one user message, as an instruct model expects;
- **split**: one generator call of ``train_size + test_size`` entries from ``seed`` (the generator's options from
  ``--generator-kwargs``), questions made unique, then split: the first ``train_size`` train, the rest test, so no
  test question is a training question. Small problem spaces give fewer entries than asked; the split keeps the same
  proportions and the start-up line says how many there are;
- **reward**: the generator's ``score_answer`` of the answer read from the completion (``read_answer``): the text of
  the last ``<answer>...</answer>`` if the completion has one, else, for a numeric reference answer, the last number
  in the completion (a model that explains before it answers is not penalised for the explanation), else the whole
  completion, stripped.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llm.tasks import Task

PREFIX = "reasoning_gym:"
DEFAULT_INSTRUCTION = "Reply with the final answer only."

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


@dataclass(frozen=True)
class GeneratorSpec:
    """A procedural generator's options (``key=value`` strings, values read as Python literals), the sizes of the
    split, its seed and the instruction appended to every question."""

    kwargs: tuple[str, ...] = ()
    train_size: int = 1000
    test_size: int = 100
    seed: int = 0
    instruction: str = DEFAULT_INSTRUCTION

    @classmethod
    def from_config(cls, data) -> "GeneratorSpec":
        """The ``generator_*`` fields of a ``DataConfig`` (``config.data``)."""
        return cls(data.generator_kwargs, data.generator_train_size, data.generator_test_size, data.generator_seed,
                   data.generator_instruction)

    def options(self) -> dict:
        """``kwargs`` as a dict: ``min_terms=2`` -> {"min_terms": 2}; a value that is no Python literal stays text."""
        out = {}
        for item in self.kwargs:
            key, sep, value = item.partition("=")
            if not sep or not key.isidentifier():
                raise ValueError(f"generator_kwargs: expected key=value, got {item!r}")
            try:
                out[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                out[key] = value
        return out


def is_numeric(answer: str) -> bool:
    """True for a reference answer that is one number as written (``-6``, ``12.5``)."""
    return bool(_NUMBER.fullmatch(answer.strip()))


def read_answer(completion: str, reference: str) -> str:
    """The answer a completion gives: the last ``<answer>`` tag's text, else (numeric reference) its last number,
    else the completion itself; stripped of surrounding whitespace."""
    tagged = _ANSWER_TAG.findall(completion)
    if tagged:
        return tagged[-1].strip()
    if is_numeric(reference):
        numbers = _NUMBER.findall(completion.replace(",", ""))
        return numbers[-1] if numbers else ""
    return completion.strip()


def reasoning_gym_task(name: str, spec: GeneratorSpec = GeneratorSpec()) -> Task:
    """The task ``reasoning_gym:<name>``: a seeded train/test split of the generator's entries, scored by its own
    ``score_answer`` (module docstring). Unknown names and options are refused in one line."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ValueError("dataset: reasoning_gym tasks need the reasoning-gym package (pip install -e '.[real]', "
                         "or pip install reasoning-gym)") from None
    if name not in DATASETS:
        close = [n for n in sorted(DATASETS) if name[:4] in n][:8]
        raise ValueError(f"dataset: reasoning-gym has no task {name!r}" + (f" (close: {', '.join(close)})" if close
                                                                             else "; see reasoning_gym.factory.DATASETS"))
    options = spec.options()
    size = spec.train_size + spec.test_size
    try:
        data = reasoning_gym.create_dataset(name, size=size, seed=spec.seed, **options)
        entries = [data[i] for i in range(size)]
    except Exception as exc:  # noqa: BLE001 - the generator's own refusal of an option, in one line
        from runkit.cli import first_line

        raise ValueError(f"generator_kwargs: reasoning_gym:{name} refused {options or 'its defaults'}: "
                         f"{type(exc).__name__}: {first_line(exc, 200)}") from None
    unique = list({e["question"]: e for e in entries}.values())
    order = np.random.default_rng(spec.seed).permutation(len(unique))
    unique = [unique[i] for i in order]
    n_train = len(unique) if spec.test_size == 0 else max(1, round(len(unique) * spec.train_size / size))
    train, test = unique[:n_train], unique[n_train:]

    def prompts(rows: Sequence[dict]) -> tuple[str, ...]:
        return tuple(f"{e['question']}\n{spec.instruction}".strip() for e in rows)

    def reward(completion: str, row: int, test_rows: bool) -> float:
        entry = (test if test_rows else train)[row]
        return float(data.score_answer(read_answer(completion, str(entry["answer"])), entry))

    return Task(f"reasoning_gym:{name}", prompts(train), tuple(str(e["answer"]) for e in train),
                test_prompts=prompts(test), test_answers=tuple(str(e["answer"]) for e in test), row_reward=reward)

"""Prompt data in TRL's formats, loaded with ``datasets``.

A row holds a ``prompt``, either a string (TRL's standard format) or a list of ``{"role", "content"}``
messages (TRL's conversational format), and any other columns. ``answer``, when present, is the reference
the single-completion rewards and the default math check compare with; every column but ``prompt`` and
``completion`` is passed to reward functions by name (``answer`` included), as TRL passes them.

GSM8K rows (``question``, ``answer`` ending in "#### N") are one mapping onto this format: the prompt is
``GSM8K_TEMPLATE`` filled with the question and the answer is N.

Sources: a ``.json``/``.jsonl``/``.parquet``/``.csv`` file, a directory written by ``save_to_disk`` (a
``DatasetDict`` gives its ``train`` split for training and its ``test`` split for testing), or
``hf:<name>`` from the hub (same splits; needs the network).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runkit.cli import first_line

#: A prompt: a string, or a conversation (a list of messages with a role and a content).
Prompt = str | list[dict]

GSM8K_TEMPLATE = "Question: {question}\nAnswer:"

#: File formats ``datasets`` reads, by suffix.
FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

#: Columns never passed to reward functions (TRL leaves out the same two).
NOT_PASSED = ("prompt", "completion")


@dataclass(frozen=True)
class PromptData:
    """Prompts, their reference answers (empty when the data has no ``answer`` column) and every other column."""

    prompts: tuple[Prompt, ...]
    answers: tuple[str, ...] = ()
    columns: dict[str, tuple] = field(default_factory=dict)

    @property
    def conversational(self) -> bool:
        return any(isinstance(p, list) for p in self.prompts)


def is_conversation(value) -> bool:
    """TRL's conversational prompt: a non-empty list of dicts, each with a string role and a string content."""
    return (isinstance(value, list) and len(value) > 0 and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value))


def gsm8k_answer(answer_field: str) -> str:
    """The final answer of a GSM8K ``answer`` field: the text after the last '####'."""
    if not isinstance(answer_field, str) or "####" not in answer_field:
        raise ValueError("a GSM8K answer must be a string ending with '#### <number>'")
    answer = answer_field.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise ValueError("the GSM8K answer after '####' is empty")
    return answer


def load_prompt_data(source: str, split: str, template: str = GSM8K_TEMPLATE) -> PromptData:
    """The rows of ``source`` (``split`` of a hub data set or a saved ``DatasetDict``) in TRL's format; a data set
    in neither format, or a bad row, raises one line naming the source (and the row, counted from 1)."""
    table = read_columns(source, split)
    names = list(table)
    if "prompt" in table:
        return from_prompt_column(table, source)
    if {"question", "answer"} <= set(names):
        return from_gsm8k(table, source, template)
    raise ValueError(f"dataset: {source} has columns {names}; expected a 'prompt' column (TRL's format: a string or a "
                     "list of messages) or GSM8K's 'question' and 'answer'")


def from_prompt_column(table: dict[str, list], source: str) -> PromptData:
    prompts = table["prompt"]
    for i, p in enumerate(prompts, 1):
        if not (isinstance(p, str) or is_conversation(p)):
            raise ValueError(f"dataset: {source}: row {i}: the prompt must be a string or a non-empty list of "
                             f"messages with a string 'role' and 'content', got {first_line(repr(p), 120)}")
    answers = ()
    if "answer" in table:
        for i, a in enumerate(table["answer"], 1):
            if not isinstance(a, (str, int, float)) or isinstance(a, bool):
                raise ValueError(f"dataset: {source}: row {i}: the answer must be a string or a number, got {a!r}")
        answers = tuple(str(a) for a in table["answer"])
    columns = {k: tuple(v) for k, v in table.items() if k not in NOT_PASSED and k != "answer"}
    return PromptData(tuple(prompts), answers, columns)


def from_gsm8k(table: dict[str, list], source: str, template: str) -> PromptData:
    """GSM8K's rows mapped onto TRL's format: prompt = template(question), answer = the number after '####'."""
    prompts, answers = [], []
    for i, (q, a) in enumerate(zip(table["question"], table["answer"]), 1):
        if not isinstance(q, str):
            raise ValueError(f"dataset: {source}: row {i}: expected a 'question' string, got {q!r}")
        try:
            answers.append(gsm8k_answer(a))
        except ValueError as exc:
            raise ValueError(f"dataset: {source}: row {i}: {exc} (got {a!r})") from None
        prompts.append(template.format(question=q.strip()))
    columns = {k: tuple(v) for k, v in table.items() if k not in ("question", "answer", *NOT_PASSED)}
    return PromptData(tuple(prompts), tuple(answers), columns)


def read_columns(source: str, split: str) -> dict[str, list]:
    """The columns of a data file, a saved data set or a hub data set, read with ``datasets``."""
    try:
        import datasets  # noqa: PLC0415 - imported when a data set is read, not for the built-in task
    except ImportError:
        raise ValueError("dataset: reading data sets needs the datasets package (in the llm extra: pip install "
                         "'offpolicy-grpo[llm]')") from None
    datasets.disable_progress_bars()
    quiet = logging.getLogger("datasets")
    level, quiet.level = quiet.level, logging.CRITICAL  # its own error lines would repeat ours
    try:
        ds = _read(datasets, source, split)
    finally:
        quiet.level = level
    if len(ds) == 0:
        raise ValueError(f"dataset: {source} holds no rows")
    return ds.to_dict()


def _read(datasets, source: str, split: str):
    if source.startswith("hf:"):
        name = source[3:]
        config = "main" if name in ("gsm8k", "openai/gsm8k") else None
        try:
            return datasets.load_dataset(name, config, split=split)
        except Exception as exc:  # noqa: BLE001 - network, name or split: one line
            raise ValueError(f"dataset: cannot load {name!r} (split {split!r}) from the hub: "
                             f"{type(exc).__name__}: {first_line(exc, 200)}") from None
    path = Path(source)
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"dataset: {path} is not a directory written by save_to_disk "
                             f"({first_line(exc, 200)})") from None
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"dataset: {path} holds the splits {sorted(ds)}; the {split!r} split is read from it")
            ds = ds[split]
        return ds
    fmt = FILE_FORMATS.get(path.suffix)
    if fmt is None:
        raise ValueError(f"dataset: expected 'arithmetic', a {'/'.join(FILE_FORMATS)} file, a directory written by "
                         f"save_to_disk or 'hf:<name>', got {source!r}")
    if not path.is_file():
        raise ValueError(f"dataset: file not found: {path}")
    if path.stat().st_size < 4096 and not path.read_bytes().strip():
        raise ValueError(f"dataset: {path} holds no rows")
    try:
        return datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as exc:  # noqa: BLE001 - name the line when it is a JSON file
        where = first_bad_json_line(path) if fmt == "json" else None
        raise ValueError(f"dataset: {where or path}: cannot be read ({type(exc).__name__}: "
                         f"{first_line(exc.__cause__ or exc, 200)})") from None


def first_bad_json_line(path: Path) -> str | None:
    """'path:N: <what is wrong>' for the first line of a JSON-lines file that is not a JSON object, else None."""
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"{path}:{i}: not valid JSON ({exc.msg})"
            if not isinstance(row, dict):
                return f"{path}:{i}: expected a JSON object, got a {type(row).__name__}"
    return None


def rows_of(columns: dict[str, Sequence], idx: Sequence[int]) -> dict[str, list]:
    """The given rows of every column, column by column (the keyword arguments of a reward function call)."""
    return {k: [v[i] for i in idx] for k, v in columns.items()}

"""Where a run's task comes from: ``load_task`` (the built-in task, a procedural generator, or data in TRL's
formats) with its reward (the task's own, ``--reward-fn``, or ``--reward-funcs``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from llm.tasks.arithmetic_tools import arithmetic_tools_task
from llm.rewards import ANSWER_CHECKS, RewardContext, check_answers, import_reward_fn
from llm.rewards import reward_funcs as resolve_reward_funcs
from llm.tasks import Task, arithmetic_task
from llm.tasks.data import PromptData, load_prompt_data
from llm.tasks.procedural import PREFIX, GeneratorSpec, reasoning_gym_task


#: ``--dataset none``: the environment owns the data (TRL's ``train_dataset=None`` with an ``environment_factory``):
#: every episode's prompt is one empty user message to which its environment's ``reset`` appends the question.
NO_DATASET = "none"
OWNED_PROMPT = [{"role": "user", "content": ""}]

#: The built-in tasks, by their ``--dataset`` names.
BUILTIN_TASKS = {"arithmetic": arithmetic_task, "arithmetic_tools": arithmetic_tools_task}


def load_task(dataset: str, reward_fn: str = "", eval_dataset: str = "", reward_funcs: Sequence[str] = (),
              reward_weights: Sequence[float] = (), answer_check: str = "math_verify", generator=None,
              reward_context: RewardContext = RewardContext(), environment_reward: bool = False) -> Task:
    """``arithmetic`` (built in, with its own test split), ``reasoning_gym:<name>`` (a procedural generator,
    ``llm.tasks.procedural``, with ``generator``: a ``GeneratorSpec``), or data in TRL's format (``llm.tasks.data``: a file, a
    saved data set or ``hf:<name>``; GSM8K's rows are mapped onto it) with ``eval_dataset`` as its test split.
    ``reward_funcs`` (``llm.rewards.reward_funcs``, with ``reward_context``) replace the task's own reward;
    ``environment_reward`` (an ``--environment-factory``): the environments' reward sources are added, and without
    ``reward_funcs`` or ``reward_fn`` they are the whole reward (TRL's); ``none``: the environment owns the data.
    ``arithmetic_tools``: the built-in agent task (``llm.tasks.arithmetic_tools``).
    """
    if dataset in BUILTIN_TASKS or dataset.startswith(PREFIX):
        if eval_dataset:
            raise ValueError(f"eval_dataset: the task {dataset} has its own test split; leave it empty")
        task = (BUILTIN_TASKS[dataset]() if dataset in BUILTIN_TASKS
                else reasoning_gym_task(dataset[len(PREFIX):], generator or GeneratorSpec()))
        if reward_fn:
            task = task.with_reward(import_reward_fn(reward_fn))
        if reward_funcs:
            task = task.with_reward_funcs(resolve_reward_funcs(reward_funcs, reward_weights, reward_context))
        return replace(task, env_reward=environment_reward)
    if dataset == NO_DATASET:
        if not environment_reward:
            raise ValueError(f"dataset: {NO_DATASET!r} means the environment owns the data (its reset() returns each "
                             "prompt); give --environment-factory, or a data set")
        if eval_dataset:
            raise ValueError(f"eval_dataset: with --dataset {NO_DATASET} the environment makes every prompt; there is "
                             "no test split to read")
        prompts = (OWNED_PROMPT,)
        reward = ({"reward_funcs": tuple(resolve_reward_funcs(reward_funcs, reward_weights, reward_context))}
                  if reward_funcs else {})
        return Task("environment", prompts, (), env_reward=True, **reward)
    train = load_prompt_data(dataset, "train")
    test = load_prompt_data(eval_dataset, "test") if eval_dataset else PromptData(())
    if environment_reward and not (reward_funcs or reward_fn):  # TRL: the environments' get_reward alone
        name = dataset[3:] if dataset.startswith("hf:") else Path(dataset).name
        return Task(name, train.prompts, train.answers, test_prompts=test.prompts, test_answers=test.answers,
                    columns=train.columns, test_columns=test.columns, env_reward=True)
    if reward_funcs:
        reward = {"reward_funcs": tuple(resolve_reward_funcs(reward_funcs, reward_weights, reward_context))}
    elif reward_fn:
        reward = {"reward_fn": import_reward_fn(reward_fn)}
    else:
        if answer_check == "math_verify":
            try:
                import math_verify  # noqa: F401
            except ImportError:
                raise ValueError("answer_check: math_verify needs the math-verify package (pip install math-verify); "
                                 "--answer-check last_number uses the last number instead") from None
        check_answers(train.answers, dataset, answer_check)
        check_answers(test.answers, eval_dataset, answer_check)
        reward = {"reward_fn": ANSWER_CHECKS[answer_check]}
    name = dataset[3:] if dataset.startswith("hf:") else Path(dataset).name
    return Task(name, train.prompts, train.answers, test_prompts=test.prompts, test_answers=test.answers,
                columns=train.columns, test_columns=test.columns, env_reward=environment_reward, **reward)

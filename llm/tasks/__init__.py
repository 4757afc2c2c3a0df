"""Verifiable tasks: prompts with reference answers, a reward in [0, 1], and a train/test split.

- ``arithmetic``: the built-in task, "a+b=" with a in 0..19, b in 0..9 (200 prompts, a fixed split of
  160 for training and 40 for testing). Its reward is defined on tokens: 1 iff the completion's tokens
  are exactly the answer's tokens followed by EOS. Because its accepted completions form a finite set,
  its expected reward J(pi | x) is computable exactly (``Task.accepted``; docs/theory.md, §8.1).
- Data in TRL's formats (``llm.tasks.data``: a ``prompt`` column holding text or a conversation, other columns passed
  to reward functions; GSM8K's ``question``/``answer`` rows mapped onto it), read with ``datasets`` from files,
  saved data sets or the hub. Default reward: 1 iff the completion's answer equals the ``answer`` column, as
  ``math-verify`` decides, or by the last number in the completion (``llm.rewards.functions``). ``eval_dataset`` is
  its test split.
- A user reward function ``module:function`` with signature ``(completion: str, answer: str) -> float``, or reward
  functions with TRL's signature, several with weights, reward models and the built-in ones (``llm.rewards``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from llm.rewards.functions import BatchReward, RewardFn, batch_rewards, require_scored, text_reward
from llm.tasks.data import Prompt, rows_of


#: A reward that reads its prompt's own record (a procedural generator's entry): (completion, row, test) -> [0, 1].
RowRewardFn = Callable[[str, int, bool], float]

#: The exact expected-reward hook: the completions (text before EOS) that score 1 for an answer.
AcceptedFn = Callable[[str], Sequence[str]]





@dataclass(frozen=True)
class Task:
    """A finite pool of training prompts with answers, an optional test pool, and a verifiable reward.

    Exactly one of ``reward_fn`` (a text reward), ``row_reward`` (a text reward that reads the prompt's own record,
    as a procedural generator's scorer does), ``reward_funcs`` (functions with TRL's signature, weighted) and
    ``accepted`` (a finite set of accepted completions per answer: the reward is then 1 iff the completion's tokens
    are one of them followed by EOS) is set. A prompt is a string or a conversation (a list of messages);
    ``answers`` is empty for data without an ``answer`` column (only reward functions can score it then), and
    ``columns`` holds the data's other columns, passed to reward functions by name.
    """

    name: str
    prompts: tuple[Prompt, ...]
    answers: tuple[str, ...]
    reward_fn: RewardFn | None = None
    accepted: AcceptedFn | None = None
    test_prompts: tuple[Prompt, ...] = ()
    test_answers: tuple[str, ...] = ()
    reward_funcs: tuple[BatchReward, ...] = ()
    columns: dict[str, tuple] = field(default_factory=dict)
    test_columns: dict[str, tuple] = field(default_factory=dict)
    row_reward: RowRewardFn | None = None
    accepted_scripts: tuple = ()
    """An agent task's exact-J hook (``llm.tasks.arithmetic_tools``): per prompt, the accepted episodes as scripts of tool
    calls, each followed by the last tool's answer as the final turn; the reward is then 1 iff the episode's tokens are
    one of them (``TokenizedTask.accepted_ids``, built by the episode loop itself)."""
    test_accepted_scripts: tuple = ()
    tools: tuple = ()
    """The task's own tools (an agent task's): a user's tool of the same name replaces one."""
    env_reward: bool = False
    """Episodes run in environments (``--environment-factory``): their reward sources (``get_reward``, TRL's) are added
    to the reward, weight 1 each; without reward functions they are the whole reward."""

    def __post_init__(self):
        if len(self.prompts) == 0:
            raise ValueError(f"dataset: task {self.name!r} has no prompts")
        for prompts, answers, columns in ((self.prompts, self.answers, self.columns),
                                          (self.test_prompts, self.test_answers, self.test_columns)):
            if answers and len(answers) != len(prompts) or any(len(c) != len(prompts) for c in columns.values()):
                raise ValueError("dataset: prompts and their answers or columns differ in number")
        kinds = (self.reward_fn is not None) + (self.row_reward is not None) + (self.accepted is not None)
        if kinds + bool(self.reward_funcs) + bool(self.accepted_scripts) != (0 if self.base_free else 1):
            raise ValueError("reward_fn: a task needs exactly one of a text reward, reward functions and an "
                             "accepted-completions hook (none only when environments score it)")
        if self.needs_answers and (not self.answers or (self.test_prompts and not self.test_answers)):
            raise ValueError(f"dataset: {self.name} has no 'answer' column, which the default reward and --reward-fn "
                             "compare completions with; score it with --reward-funcs (TRL's signature) instead")

    @property
    def base_free(self) -> bool:
        """True when environments alone score the episodes (no reward of the task's own)."""
        return self.env_reward and self.reward_fn is None and self.row_reward is None and self.accepted is None \
            and not self.reward_funcs and not self.accepted_scripts

    @property
    def needs_answers(self) -> bool:
        """True when the reward compares completions with the 'answer' column."""
        return not (self.reward_funcs or self.base_free)

    @property
    def conversational(self) -> bool:
        """True when the prompts are conversations (TRL's conversational format)."""
        return any(isinstance(p, list) for p in self.prompts + self.test_prompts)

    @property
    def has_exact_j(self) -> bool:
        """True when J(pi | x) is computable exactly (the accepted completions form a finite set)."""
        return self.accepted is not None or bool(self.accepted_scripts)

    def rows(self, idx, test: bool = False) -> list[dict]:
        """The data rows of prompts ``idx``: the prompt, its answer and its other columns (an environment's
        ``reset(**row)``)."""
        prompts, answers, columns = ((self.test_prompts, self.test_answers, self.test_columns) if test
                                     else (self.prompts, self.answers, self.columns))
        return [{"prompt": prompts[i], **({"answer": answers[i]} if answers else {}),
                 **{k: v[i] for k, v in columns.items()}} for i in idx]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Indices of n training prompts drawn uniformly with replacement."""
        return rng.integers(0, len(self.prompts), size=n)

    def with_reward(self, reward_fn: RewardFn) -> "Task":
        """The same prompts scored by a user's text reward (no exact J any more)."""
        return replace(self, reward_fn=reward_fn, accepted=None, reward_funcs=(), row_reward=None, accepted_scripts=(),
                       test_accepted_scripts=(), env_reward=False)

    def with_reward_funcs(self, funcs: Sequence[BatchReward]) -> "Task":
        """The same prompts scored by reward functions with TRL's signature (no exact J any more)."""
        return replace(self, reward_fn=None, accepted=None, reward_funcs=tuple(funcs), row_reward=None,
                       accepted_scripts=(), test_accepted_scripts=(), env_reward=False)

    def with_env_reward(self) -> "Task":
        """The same prompts scored by their environments' reward sources alone (no exact J any more)."""
        return replace(self, reward_fn=None, accepted=None, reward_funcs=(), row_reward=None, accepted_scripts=(),
                       test_accepted_scripts=(), env_reward=True)

    def bind(self, tokenizer, chat_template: bool = False, agent=None) -> "TokenizedTask":
        return TokenizedTask(self, tokenizer, chat_template, agent)


class TokenizedTask:
    """A task bound to a tokenizer: prompt tokens (computed once) and rewards of generated completions.

    For a task with an ``accepted`` hook the reward and the exact J use the same accepted token sequences
    (``accepted_ids``), so they agree on every completion by construction: a completion scores 1 iff its
    token ids equal one of them, EOS included (a completion cut at the length limit, one with extra
    whitespace or with special tokens inside scores 0, and J counts none of them either).
    """

    def __init__(self, task: Task, tokenizer, chat_template: bool = False, agent=None):
        self.task, self.tokenizer, self.chat_template = task, tokenizer, chat_template
        self.agent = agent  # ``llm.agents.episodes.Agent``: prompts carry the tools; episodes for accepted scripts
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat_template: the model's tokenizer has no chat template (tokenizer_config.json or "
                             "chat_template.jinja); drop --chat-template to use the prompts as they are")
        self.eos = tokenizer.eos_token_id
        self.conversational = task.conversational  # once: ``score`` asks at every batch
        self.prompt_ids = self._encode(task.prompts)
        self.test_prompt_ids = self._encode(task.test_prompts)
        self.accepted_masks = self.test_accepted_masks = None  # an agent task's: 1 on the policy's tokens
        if task.accepted_scripts:  # built by the agent's own episode loop (``llm.agents.episodes.scripted_episodes``)
            if agent is None:
                raise ValueError(f"dataset: {task.name} is an agent task; it needs its tools (llm.agents)")
            self.accepted_ids, self.accepted_masks = agent.accepted_episodes(self.prompt_ids, task.accepted_scripts)
            self.test_accepted_ids, self.test_accepted_masks = agent.accepted_episodes(self.test_prompt_ids,
                                                                                       task.test_accepted_scripts)
        else:
            self.accepted_ids = self._accepted_ids(task.answers)
            self.test_accepted_ids = self._accepted_ids(task.test_answers)

    def _encode(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Prompt token ids: a text as it is, or (``chat_template``) as one user message; a conversation always
        through the tokenizer's chat template, with its generation prompt (or, when it ends with an assistant
        message, continuing that message, as TRL does). The template supplies any special tokens."""
        if not prompts:
            return []
        if self.agent is not None:  # the template with each row's tools' schemas (and the generation prompt)
            rows = self.task.rows(range(len(prompts)), test=prompts is self.task.test_prompts)
            return [self.agent.prompt_ids(p, row) for p, row in zip(prompts, rows)]
        if not self.chat_template and all(isinstance(p, str) for p in prompts):
            return self.tokenizer(list(prompts)).input_ids
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("dataset: the prompts are conversations (lists of messages), which need a chat template, "
                             "and the model's tokenizer has none; use a model with a template or text prompts")
        rendered = [self._render([{"role": "user", "content": p}] if isinstance(p, str) else p) for p in prompts]
        return self.tokenizer(rendered, add_special_tokens=False).input_ids

    def _render(self, messages: list[dict]) -> str:
        cont = messages[-1]["role"] == "assistant"
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not cont,
                                                  continue_final_message=cont)

    def _accepted_ids(self, answers: Sequence[str]) -> list[list[list[int]]] | None:
        if self.task.accepted is None:
            return None
        enc = lambda s: self.tokenizer(s, add_special_tokens=False).input_ids + [self.eos]  # noqa: E731
        return [[enc(a) for a in self.task.accepted(answer)] for answer in answers]

    @property
    def max_accepted_length(self) -> int:
        """Tokens of the longest accepted completion (EOS included); 0 without exact J."""
        pools = (self.accepted_ids or []) + (self.test_accepted_ids or [])
        return max((len(ids) for acc in pools for ids in acc), default=0)

    def texts(self, completion_ids: Sequence[Sequence[int]], messages: Sequence[list[dict]] | None = None) -> list[str]:
        """The text a text reward reads of each completion: its decoded tokens, or for an agent's episode
        (``messages``) the content of its last turn (the calls and the tools' answers before it are not the
        answer)."""
        if messages is None:
            return self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return [next((m["content"] for m in reversed(ms) if m["role"] == "assistant"), "") for ms in messages]

    def score_rollout(self, prompt_idx: Sequence[int], roll, test: bool = False) \
            -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """A rollout's texts (``texts``), rewards and reward parts (``score_parts``): its completions, an agent's
        episodes with their messages, their environments and their environments' rewards included; ``prompt_idx`` per
        completion."""
        texts = self.texts(roll.completion_ids, roll.messages)
        rewards, parts = self.score_parts(prompt_idx, texts, roll.completion_ids, test, roll)
        return texts, rewards, parts

    def score(self, prompt_idx: Sequence[int], texts: Sequence[str], completion_ids: Sequence[Sequence[int]],
              test: bool = False) -> np.ndarray:
        """Rewards (float64) of completions of the given prompts (training pool, or test pool with ``test``).

        Text rewards must lie in [0, 1] (the bound needs it); anything else raises naming the completion.
        """
        return self.score_parts(prompt_idx, texts, completion_ids, test)[0]

    def score_parts(self, prompt_idx: Sequence[int], texts: Sequence[str], completion_ids: Sequence[Sequence[int]],
                    test: bool = False, episodes=None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``score`` and each reward source's values (nan where it returned None): the reward functions' and the
        environments' (an empty dict for the other rewards). ``episodes``: an agent's rollout, whose messages are the
        completions reward functions get (TRL's), whose environments they get as ``environments=``, and whose
        environments' reward sources are added, weight 1 each (TRL's), and whose prompts as shown (reset's observation
        appended) are the prompts reward functions get (TRL's); an episode whose environment failed scores 0."""
        try:
            rewards, parts = self._own_reward(prompt_idx, texts, completion_ids, test, episodes)
        finally:
            if episodes is not None:  # reward functions have read the environments: their instances are free again
                episodes.release()
        if episodes is not None and episodes.env_rewards is not None:
            for source in episodes.env_rewards[0] if episodes.env_rewards else ():
                values = np.array([r[source] for r in episodes.env_rewards], dtype=np.float64)
                parts[source] = values
                rewards = rewards + np.nan_to_num(values)
        failed = episodes.env_failed if episodes is not None else None
        if self.task.reward_funcs or self.task.base_free:
            require_scored(parts, list(texts), failed)
        if failed is not None:
            rewards = np.where(np.asarray(failed, dtype=bool), 0.0, rewards)
        return rewards, parts

    def _own_reward(self, prompt_idx, texts, completion_ids, test, episodes) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The task's own reward (``score_parts``), zeros when environments alone score it."""
        if self.task.base_free:
            return np.zeros(len(completion_ids)), {}
        if self.task.accepted is not None or self.task.accepted_scripts:
            accepted = self.test_accepted_ids if test else self.accepted_ids
            return np.array([float(list(ids) in accepted[i]) for i, ids in zip(prompt_idx, completion_ids)]), {}
        answers = self.task.test_answers if test else self.task.answers
        if self.task.reward_funcs:
            t = self.task
            prompts, columns = (t.test_prompts, t.test_columns) if test else (t.prompts, t.columns)
            columns = ({"answer": answers} if answers else {}) | columns
            messages = episodes.messages if episodes is not None else None
            completions = (list(messages) if messages is not None else
                           [[{"role": "assistant", "content": c}] for c in texts] if self.conversational
                           else list(texts))
            extra = ({"environments": list(episodes.environments)}
                     if episodes is not None and episodes.environments is not None else {})
            shown = episodes.prompts_shown if episodes is not None else None  # with reset's observations (TRL's)
            given = list(shown) if shown is not None else [prompts[i] for i in prompt_idx]
            return batch_rewards(t.reward_funcs, given, completions, [list(c) for c in completion_ids],
                                 rows_of(columns, prompt_idx) | extra)
        if self.task.row_reward is not None:
            row_reward = self.task.row_reward
            return np.array([text_reward(lambda c, _a, i=i: row_reward(c, i, test), t, answers[i])
                             for i, t in zip(prompt_idx, texts)], dtype=np.float64), {}
        return np.array([text_reward(self.task.reward_fn, t, answers[i]) for i, t in zip(prompt_idx, texts)],
                        dtype=np.float64), {}


# ----------------------------------------------------------------------------------------------
# Built-in arithmetic task
# ----------------------------------------------------------------------------------------------

ARITH_A = range(20)
ARITH_B = range(10)
#: Prompts of the built-in task held out for evaluation: a fixed random 20% (seed 0), the same in every run.
ARITH_TEST_FRACTION = 0.2


def arithmetic_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, equals the answer (a text reward)."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


def exact_answer(answer: str) -> tuple[str, ...]:
    """The built-in task's accepted completions: the answer itself, nothing else."""
    return (answer,)


def arithmetic_split() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The built-in tasks' (a, b) pairs, training and test: a fixed random ARITH_TEST_FRACTION (seed 0) held out,
    each part in the pairs' order (the arithmetic task's and the agent task's, ``llm.tasks.arithmetic_tools``)."""
    pairs = [(a, b) for a in ARITH_A for b in ARITH_B]
    order = np.random.default_rng(0).permutation(len(pairs))
    n_test = round(ARITH_TEST_FRACTION * len(pairs))
    return [pairs[i] for i in sorted(order[n_test:])], [pairs[i] for i in sorted(order[:n_test])]


def arithmetic_task() -> Task:
    train, test = arithmetic_split()
    prompts = lambda part: tuple(arithmetic_prompt(a, b) for a, b in part)  # noqa: E731
    answers = lambda part: tuple(str(a + b) for a, b in part)  # noqa: E731
    return Task("arithmetic", prompts(train), answers(train), accepted=exact_answer,
                test_prompts=prompts(test), test_answers=answers(test))

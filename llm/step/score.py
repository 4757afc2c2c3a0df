"""A step's score stage: the verifiable rewards of its completions (``score``), dynamic sampling's kept groups
(``VariedGroups``), the batch of a step's sequences (``group_batch``) and the advantages with the zero-variance mask
(``advantages``). Each takes what it reads; ``llm.step.step.run_step`` calls them in order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import grpo_theory as gt

from llm.tensors.batch import Batch, make_batch
from llm.models.distributed import Ranks
from llm.sampling import Rollout
from llm.tasks import TokenizedTask


@dataclass
class Scored:
    """Rewards of the P x G completions (P, G), their decoded texts, and each reward function's values (nan where it
    gave None; empty for the other rewards)."""

    rewards: np.ndarray
    texts: list[str]
    parts: dict[str, np.ndarray]


def score(task: TokenizedTask, prompt_idx: list[int], roll: Rollout, G: int, ranks: Ranks) -> Scored:
    """The rewards, scored on rank 0 (reward functions run once per completion), the result on every rank."""

    def on_rank0() -> Scored:
        texts, rewards, parts = task.score_rollout([i for i in prompt_idx for _ in range(G)], roll)
        return Scored(rewards.reshape(len(prompt_idx), G), texts, parts)

    return ranks.from_main(on_rank0)


@dataclass
class VariedGroups:
    """Dynamic sampling (DAPO; verl's ``filter_groups``): the groups whose rewards vary, gathered over generation
    rounds until there are ``want`` of them. ``take`` adds a round; ``result`` gives the first ``want`` kept groups
    as one rollout and its scores, and ``metrics`` the rounds, the kept share, and the reward and all-equal share of
    the first round's groups. The first round is drawn whatever the rewards, so its reward is unbiased for J(alpha);
    the later rounds are drawn only when the earlier ones fell short, so the reward pooled over every round is a
    ratio with a random denominator, biased (tests/llm/test_rollout.py measures both)."""

    want: int
    G: int
    prompt_idx: list[int] = field(default_factory=list)
    rollouts: list[Rollout] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rewards: list[np.ndarray] = field(default_factory=list)
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    drawn: list[np.ndarray] = field(default_factory=list)
    rounds: int = 0

    @property
    def enough(self) -> bool:
        return len(self.prompt_idx) >= self.want

    def take(self, prompt_idx: list[int], roll: Rollout, scored: Scored) -> None:
        G = self.G
        self.rounds += 1
        self.drawn.append(scored.rewards)
        for g, i in enumerate(prompt_idx):
            r = scored.rewards[g]
            if np.ptp(r) == 0 or self.enough:
                continue
            cols = slice(g * G, (g + 1) * G)
            self.prompt_idx.append(i)
            self.rollouts.append(roll.slice(cols.start, cols.stop))
            self.texts += scored.texts[cols]
            self.rewards.append(r)
            for name, values in scored.parts.items():
                self.parts.setdefault(name, []).append(values.reshape(-1, G)[g])

    def result(self) -> tuple[list[int], Rollout, Scored]:
        G = self.G
        rewards = np.array(self.rewards).reshape(-1, G)
        parts = {name: np.concatenate(v) for name, v in self.parts.items()}
        return self.prompt_idx, Rollout.concat(self.rollouts), Scored(rewards, self.texts, parts)

    def metrics(self) -> dict[str, float]:
        drawn, first = np.concatenate(self.drawn), self.drawn[0]
        return {"sampling/gen_rounds": float(self.rounds),
                "sampling/kept_group_share": len(self.prompt_idx) / max(len(drawn), 1),
                "sampling/reward_drawn": float(first.mean()),
                "sampling/frac_reward_zero_std_drawn": float(np.mean(np.ptp(first, axis=1) == 0))}


def group_batch(task: TokenizedTask, prompt_idx: list[int], roll: Rollout, G: int, device) -> Batch:
    """The batch of the P x G sequences: each prompt's tokens before each of its G completions (an episode's own
    prompt where its environment's ``reset`` added to it)."""
    prompts = roll.prompt_ids or [task.prompt_ids[i] for i in prompt_idx for _ in range(G)]
    return make_batch(prompts, roll.completion_ids, task.tokenizer.pad_token_id, device, roll.tool_mask)


def reward_metrics(parts: dict[str, np.ndarray]) -> dict[str, float]:
    """``rewards/<name>/mean|std`` of each reward function over the completions it applied to (TRL's names and
    convention: None is left out; the standard deviation with n - 1)."""
    out = {}
    for name, values in parts.items():
        applied = values[~np.isnan(values)]
        out[f"rewards/{name}/mean"] = float(applied.mean()) if applied.size else float("nan")
        out[f"rewards/{name}/std"] = float(applied.std(ddof=1)) if applied.size > 1 else float("nan")
    return out


@dataclass
class Groups:
    """Per-group quantities of a step: advantages (P, G), all-equal-reward groups and the groups the loss keeps."""

    advantages: np.ndarray
    zero_std: np.ndarray
    keep: np.ndarray


def advantages(rewards: np.ndarray, eps: float, scale: bool | str, mask_zero_std: bool, drop_all: bool = False) -> Groups:
    """Group whitening with ``grpo_theory.group_advantages`` and the zero-variance mask (docs/theory.md, §5);
    ``drop_all``: the loss keeps no group (a step dropped for staleness, ``max_staleness``)."""
    adv = gt.group_advantages(rewards, eps, scale=scale)
    zero_std = np.ptp(rewards, axis=1) == 0
    keep = ~zero_std if mask_zero_std else np.ones(len(rewards), bool)
    if drop_all:
        keep = np.zeros(len(rewards), bool)
    return Groups(adv, zero_std, keep)

"""Evaluation of a policy on the task's test prompts (docs/theory.md, §8.3): ``evaluate``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llm.config.ranges import beyond_range, onto_range
from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.evaluation.exact import prompt_exact_j
from llm.evaluation.passk import exact_pass_at_k, ks_up_to, pass_and_maj
from llm.models.model import Precision
from llm.rewards import parse_number
from llm.sampling import TransformersSampler
from llm.tasks import TokenizedTask


@dataclass(frozen=True)
class EvalSpec:
    """How the test prompts are sampled: ``temperature`` and ``token_filter`` (the evaluation's own, which may differ
    from training's), ``generations`` completions per prompt (TRL's num_generations_eval), ``max_tokens`` each, the
    k of ``eval/pass@k`` and ``eval/maj@k`` (1, 2, 4, ... up to the generations)."""

    temperature: float = 1.0
    token_filter: TokenFilter = NO_FILTER
    generations: int = 8
    max_tokens: int = 16
    ks: tuple[int, ...] = field(default=())

    @property
    def pass_ks(self) -> tuple[int, ...]:
        return self.ks or tuple(ks_up_to(self.generations))


def answer_key(text: str) -> str:
    """What maj@k votes on: the completion's last number when it has one (math answers: '1,000' and '1000.0' are
    one answer), else its stripped text."""
    number = parse_number(text)
    return f"{number:g}" if number is not None else text.strip()


def evaluate(model, task: TokenizedTask, spec: EvalSpec, *, seed: int, pad: int, precision: Precision = Precision(),
             exact: bool = True, sampler=None, batch_size: int = 0,
             per_prompt: dict | None = None) -> dict[str, float]:
    """``eval/*`` metrics of the policy ``model`` on the task's test prompts, sampled as ``spec`` says: exact J and
    exact pass@k (when the task allows it), the sampled accuracy (the mean reward of ``spec.generations``
    completions per prompt), ``eval/pass@k`` and ``eval/maj@k`` from them, and the greedy accuracy. ``sampler``: a
    sampler holding ``model``'s weights (the run's vLLM engine or server; for an agent task one that runs episodes,
    ``llm.agents.AgentSampler``); None: ``generate`` on ``model`` itself, ``batch_size`` sequences at a time (0: all).
    ``per_prompt``: a dict that receives each test prompt's mean reward
    per accuracy (``accuracy_sampled``, ``accuracy_greedy``: arrays in test-prompt order), for the run's certificate
    (``improvement_bounds``)."""
    prompts = task.test_prompt_ids
    if not prompts:
        return {}
    out = {"eval/num_prompts": float(len(prompts))}
    if exact and task.task.has_exact_j:
        j = prompt_exact_j(model, task, spec.temperature, pad, precision, test=True, token_filter=spec.token_filter)
        out["eval/j"] = float(j.mean())
        out.update({f"eval/pass@{k}_exact": float(exact_pass_at_k(j, k).mean()) for k in spec.pass_ks})
    idx = list(range(len(prompts)))
    rows = {}
    if task.agent is not None:  # episodes, with each test prompt's row for its environment
        if getattr(sampler, "agent", None) is None:
            raise ValueError("evaluate: an agent task's test prompts are episodes; pass a sampler that runs them "
                             "(llm.agents.AgentSampler)")
        rows = {"rows": task.task.rows(idx, test=True)}
    sampler = sampler or TransformersSampler(model, task.eos, pad, copy=False, batch_size=batch_size)
    for name, n, greedy in (("accuracy_sampled", spec.generations, False), ("accuracy_greedy", 1, True)):
        roll = sampler.generate(prompts, n, spec.max_tokens, spec.temperature, seed, greedy=greedy,
                                token_filter=spec.token_filter, **rows)
        texts, rewards, _ = task.score_rollout([i for i in idx for _ in range(n)], roll, test=True)
        out[f"eval/{name}"] = float(rewards.mean())
        if per_prompt is not None:
            per_prompt[name] = np.asarray(rewards, dtype=np.float64).reshape(len(prompts), n).mean(axis=1)
        if not greedy:
            keys = [[answer_key(t) for t in texts[p * n:(p + 1) * n]] for p in idx]
            out.update(pass_and_maj(np.asarray(rewards).reshape(len(prompts), n), keys, spec.pass_ks))
    return out


#: The accuracies the run's certificate bounds, and the suffix of their metric (``eval/improvement_lcb<suffix>``).
CERTIFIED_ACCURACIES = {"accuracy_sampled": "", "accuracy_greedy": "_greedy"}


def certificate_level(level: float, claims: int = len(CERTIFIED_ACCURACIES)) -> float:
    """The level each of the run certificate's ``claims`` bounds is computed at so that all hold at once at ``level``:
    their misses add up (a union bound), so each is given 1 - (1 - level) / claims (0.975 each for 0.95 over the
    sampled and the greedy accuracy)."""
    return 1.0 - (1.0 - level) / claims


def improvement_bounds(now: dict, initial: dict, level: float, look: int, reward_range=None) -> dict[str, float]:
    """The run's certificate at its ``look``-th evaluation (1, 2, ...): for the sampled and the greedy accuracy, a lower
    confidence bound on the improvement since the first evaluation, from the test prompts' paired differences (each
    prompt's mean reward now minus before, in [-(hi - lo), hi - lo] for rewards in the declared ``reward_range``
    (lo, hi); divided by hi - lo they lie in [-1, 1]; a mean within float rounding of an edge is the edge), by the
    betting bound at the spent level ``grpo_theory.betting.spent_level(certificate_level(level), look)``, in units of
    the reward. Every evaluation's bounds, sampled and greedy, hold at once with probability >= ``level``, however many
    are read: a union bound over the looks and the two accuracies, whose misses add up to at most 1 - ``level``
    (docs/theory.md, §8.6). Assumes the test prompts are a sample of the task's prompts, drawn before the run, and
    rewards in the declared range; nan without a declared range."""
    from grpo_theory.betting import spent_level
    from grpo_theory.estimators import lower_confidence_bound

    out = {}
    for name, suffix in CERTIFIED_ACCURACIES.items():
        if name not in now or name not in initial or len(now[name]) != len(initial[name]):
            continue
        if reward_range is None:
            out[f"eval/improvement_lcb{suffix}"] = float("nan")
            continue
        lo, hi = reward_range
        a, b = np.asarray(now[name], dtype=np.float64), np.asarray(initial[name], dtype=np.float64)
        inside = not (beyond_range(a, lo, hi).any() or beyond_range(b, lo, hi).any())
        a, b = onto_range(a, lo, hi)[0], onto_range(b, lo, hi)[0]  # a mean at an edge by float rounding is the edge
        d = (a - b) / (hi - lo)
        out[f"eval/improvement_lcb{suffix}"] = ((hi - lo) * lower_confidence_bound(
            d, spent_level(certificate_level(level), look), low=-1.0, high=1.0)
                                                if inside and d.size else float("nan"))
    return out

"""Exact expected reward and evaluation on the test prompts (docs/theory.md, §8.1 and §8.3).

For a task whose accepted completions form a finite set (the built-in task: the answer's tokens
followed by EOS), J(pi | x) = sum over accepted completions y of pi(y | x), and pi(y | x) is the product
of the teacher-forced next-token probabilities softmax(logits / T): one forward pass gives J exactly
for every prompt, with no sampling error.
"""

from __future__ import annotations

import numpy as np
import torch

from .batch import make_batch
from .logprobs import completion_logprobs
from .model import Precision
from .sampling import TransformersSampler
from .tasks import TokenizedTask

#: Sequences per forward pass of the exact-J computation.
EXACT_J_BATCH = 512


@torch.no_grad()
def exact_j(model, prompt_ids: list[list[int]], accepted_ids: list[list[list[int]]], temperature: float,
            pad: int, precision: Precision = Precision()) -> np.ndarray:
    """J(pi | x) for every prompt: the total probability of its accepted completions, float64 (n_prompts,)."""
    pairs = [(i, ids) for i, acc in enumerate(accepted_ids) for ids in acc]
    device = next(model.parameters()).device
    j = np.zeros(len(prompt_ids))
    for start in range(0, len(pairs), EXACT_J_BATCH):
        chunk = pairs[start: start + EXACT_J_BATCH]
        batch = make_batch([prompt_ids[i] for i, _ in chunk], [ids for _, ids in chunk], pad, device)
        logp = completion_logprobs(model, batch, temperature, precision).logp
        seq = (logp.double() * batch.completion_mask.double()).sum(1).exp().cpu().numpy()
        np.add.at(j, [i for i, _ in chunk], seq)
    return j


def mean_exact_j(model, task: TokenizedTask, temperature: float, pad: int, precision: Precision = Precision(),
                 test: bool = False) -> float:
    """E_x J(pi | x) over the training prompts (uniform, as the trainer draws them) or the test prompts."""
    prompts, accepted = (task.test_prompt_ids, task.test_accepted_ids) if test else (task.prompt_ids, task.accepted_ids)
    return float(exact_j(model, prompts, accepted, temperature, pad, precision).mean())


def evaluate(model, task: TokenizedTask, *, temperature: float, max_tokens: int, generations: int, seed: int,
             pad: int, precision: Precision = Precision(), exact: bool = True, sampler=None) -> dict[str, float]:
    """``eval/*`` metrics of the policy ``model`` on the task's test prompts: exact J (when the task allows
    it), sampled accuracy (``generations`` completions per prompt at ``temperature``) and greedy accuracy.
    ``sampler``: a sampler holding ``model``'s weights (the run's vLLM engine or server); None: ``generate`` on
    ``model`` itself."""
    prompts = task.test_prompt_ids
    if not prompts:
        return {}
    out = {"eval/num_prompts": float(len(prompts))}
    if exact and task.task.has_exact_j:
        out["eval/j"] = mean_exact_j(model, task, temperature, pad, precision, test=True)
    sampler = sampler or TransformersSampler(model, task.eos, pad, copy=False)
    idx = list(range(len(prompts)))
    for name, n, greedy in (("accuracy_sampled", generations, False), ("accuracy_greedy", 1, True)):
        roll = sampler.generate(prompts, n, max_tokens, temperature, seed, greedy=greedy)
        texts = task.tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=True)
        out[f"eval/{name}"] = float(task.score([i for i in idx for _ in range(n)], texts, roll.completion_ids,
                                               test=True).mean())
    return out

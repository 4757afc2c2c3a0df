"""Exact expected reward (docs/theory.md, §8.1).

For a task whose accepted completions form a finite set (the built-in task: the answer's tokens
followed by EOS), J(pi | x) = sum over accepted completions y of pi(y | x), and pi(y | x) is the product
of the teacher-forced next-token probabilities softmax(logits / T) (filtered by top-k, top-p, min-p when the run
samples that way: the policy is the filtered distribution): one forward pass gives J exactly for every prompt, with
no sampling error.
"""

from __future__ import annotations

import numpy as np
import torch

from llm.tensors.batch import make_batch
from llm.tensors.logprobs import completion_logprobs
from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.models.model import Precision
from llm.tasks import TokenizedTask

#: Sequences per forward pass of the exact-J computation.
EXACT_J_BATCH = 512


@torch.no_grad()
def exact_j(model, prompt_ids: list[list[int]], accepted_ids: list[list[list[int]]], temperature: float,
            pad: int, precision: Precision = Precision(), token_filter: TokenFilter = NO_FILTER,
            accepted_masks: list[list[list[int]]] | None = None) -> np.ndarray:
    """J(pi | x) for every prompt: the total probability of its accepted completions, float64 (n_prompts,).
    ``accepted_masks`` (an agent's episodes): 1 on the policy's tokens; the environment's tokens, the same under
    every policy, contribute no factor (docs/theory.md, §8.8)."""
    pairs = [(i, ids) for i, acc in enumerate(accepted_ids) for ids in acc]
    masks = None if accepted_masks is None else [m for acc in accepted_masks for m in acc]
    device = next(model.parameters()).device
    j = np.zeros(len(prompt_ids))
    for start in range(0, len(pairs), EXACT_J_BATCH):
        chunk = pairs[start: start + EXACT_J_BATCH]
        batch = make_batch([prompt_ids[i] for i, _ in chunk], [ids for _, ids in chunk], pad, device,
                           None if masks is None else masks[start: start + EXACT_J_BATCH])
        logp = completion_logprobs(model, batch, temperature, precision, token_filter=token_filter).logp
        seq = (logp.double() * batch.policy_mask.double()).sum(1).exp().cpu().numpy()
        np.add.at(j, [i for i, _ in chunk], seq)
    return j


def prompt_exact_j(model, task: TokenizedTask, temperature: float, pad: int, precision: Precision = Precision(),
                   test: bool = False, token_filter: TokenFilter = NO_FILTER) -> np.ndarray:
    """J(pi | x) of every training prompt, or (``test``) every test prompt."""
    prompts, accepted, masks = ((task.test_prompt_ids, task.test_accepted_ids, task.test_accepted_masks) if test
                                else (task.prompt_ids, task.accepted_ids, task.accepted_masks))
    return exact_j(model, prompts, accepted, temperature, pad, precision, token_filter, masks)


def mean_exact_j(model, task: TokenizedTask, temperature: float, pad: int, precision: Precision = Precision(),
                 test: bool = False, token_filter: TokenFilter = NO_FILTER) -> float:
    """E_x J(pi | x) over the training prompts (uniform, as the trainer draws them) or the test prompts."""
    return float(prompt_exact_j(model, task, temperature, pad, precision, test, token_filter).mean())

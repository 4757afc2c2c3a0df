"""VCPO's off-policy optimal baseline in the trainer: each completion's own gradient g_i at unit advantage, whose
norms weigh the baseline b* = sum W R / sum W (``grpo_theory.vcpo``, where the formula and the shift of the
advantages are stated and computed).

The authors accumulate each trajectory's gradient twice (scaled by R_i, and by 1) and subtract b* times the second
sum; the step's gradient is sum_i (R_i - b*) g_i / sigma. Here the baseline moves the advantages instead, and the
optimiser steps on them as on any advantage (``norm_by_std`` is this trainer's ``scale_rewards``). The two gradients
are equal wherever the objective is linear in the advantage at the step's weights, as every objective is at
pi = pi_k where no clip binds (the first optimiser step of each batch); with ``num_iterations`` > 1 the later steps'
clips act on the shifted advantages. g_i is the objective's gradient of completion i alone at A = 1, summed over its
tokens (the authors' "unscaled" norm: their aggregation's 1/length and 1/batch undone), without the KL and entropy
terms; it needs one backward pass per completion, as the authors' actor takes with micro-batches of one.
"""

from __future__ import annotations

import numpy as np
import torch

from llm.tensors.batch import Batch
from llm.tensors.loss import Clip, grpo_loss
from llm.tensors.passes import Passes

def completion_gradient_norms(passes: Passes, clip: Clip, policy: torch.nn.Module, batch: Batch,
                              logp_alpha: torch.Tensor | None, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """||g_i|| and log w_i = sum_t log pi_k/alpha for each row i of ``batch`` where ``live`` (B,): g_i the gradient
    of the objective's ``clip`` term of completion i alone at advantage 1, summed over its loss tokens, at the
    current weights (pi_k); one forward and backward pass per completion. The parameters' gradients are left
    unset (None). Rows not live, or with no loss token, get norm 0 and log w 0."""
    norms, log_w = np.zeros(len(live)), np.zeros(len(live))
    params = [p for p in policy.parameters() if p.requires_grad]
    for i in np.flatnonzero(live):
        rows = torch.tensor([int(i)])
        mb = batch.take(rows)
        t = mb.completion_ids.shape[1]
        fwd = passes.forward(policy, mb, entropy=False)
        logp_k = fwd.logp.detach()
        alpha = logp_k if logp_alpha is None else logp_alpha[rows, :t].to(logp_k.device)
        mask = batch.policy_mask[rows, :t].to(logp_k.device)
        loss, stats = grpo_loss(fwd.logp, logp_k, alpha, torch.ones(1, device=logp_k.device), mask, clip=clip)
        if not stats.tokens:
            continue
        loss.backward()  # (not autograd.grad: reentrant checkpointing supports backward only)
        norms[i] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)))
        policy.zero_grad(set_to_none=True)
        log_w[i] = float(((logp_k - alpha).double() * mask).sum())
    return norms, log_w

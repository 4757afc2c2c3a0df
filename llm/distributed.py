"""Several trainer processes: ``torchrun --nproc-per-node N -m llm.train ...`` (torch.distributed: gloo on CPU,
NCCL on CUDA), data-parallel over the prompts of a step.

Every rank holds the whole policy and the same optimiser state (the same initial weights, the same updates).
Rank 0 alone talks to the sampler (generation and weight syncs), scores the completions, and writes metrics,
checkpoints and the final model; the step's prompts, completions and rewards are broadcast to every rank. Each rank
runs the forward and backward passes of its share of the prompts (contiguous, by prompt, so a group never spans
two ranks), with the loss weights computed from the whole step, so the sum of the ranks' gradients (all-reduced)
is the one-process gradient of the whole step. Per-token results of no-gradient passes (log pi_k, log alpha, pi_ref,
pi_{k+1}, entropies) are summed over ranks into whole-batch tensors, so every metric is computed over the global
batch, never rank 0's share; hidden states stay with their rank and the token-level TV sums are reduced as numbers.
With one process (no torchrun) nothing here runs: ``SINGLE`` does no communication.

Faults: a rank that dies leaves the others in a collective, which fails (gloo: the peer's connection closes) or times
out after ``COLLECTIVE_TIMEOUT_S``; each surviving rank then stops with one line (``RunError``), and torchrun ends
the job. Rank 0 writes checkpoints atomically, so the last one is intact; the same command resumes. A different
number of ranks may resume it too: the global batch and its gradient do not depend on the split.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch

from runkit.cli import RunError, first_line

#: Seconds a rank waits in a collective before giving up (a rank that died leaves the others waiting).
COLLECTIVE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Ranks:
    """This process's rank among ``world`` trainer processes."""

    rank: int = 0
    world: int = 1

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def prompts(self, n: int) -> range:
        """This rank's share of ``n`` prompts: a contiguous range, sizes differing by at most one."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def rows(self, n_sequences: int, group: int) -> torch.Tensor | None:
        """Row indices of this rank's share of a batch of ``n_sequences`` = prompts x ``group`` sequences (prompt-
        major); None with one process (every row)."""
        if not self.active:
            return None
        share = self.prompts(n_sequences // group)
        return torch.arange(share.start * group, share.stop * group)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks (in place)."""
        if self.active:
            with self.collective():
                torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    @contextlib.contextmanager
    def collective(self):
        """A collective operation; its failure (another rank died or timed out) becomes one line."""
        try:
            yield
        except RuntimeError as exc:
            raise RunError(f"rank {self.rank} of {self.world}: another trainer process stopped or stalled "
                           f"({type(exc).__name__}: {first_line(exc, 160)}); this run ends; the last checkpoint in "
                           "output_dir is intact and the same command resumes from it") from None

    def sum_float(self, value: float) -> float:
        if not self.active:
            return value
        return float(self.sum(torch.tensor([value], dtype=torch.float64)))

    def max_float(self, value: float) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        with self.collective():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t)

    def sum_grads(self, parameters) -> None:
        """Sum the gradients over ranks; a parameter without a gradient on this rank (no loss token here)
        contributes zeros."""
        if not self.active:
            return
        for p in parameters:
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                with self.collective():
                    torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (pickled; small objects: prompts, completions, rewards)."""
        if not self.active:
            return obj
        box = [obj if self.main else None]
        with self.collective():
            torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            with self.collective():
                torch.distributed.barrier()


SINGLE = Ranks()


def init_ranks(device: torch.device) -> Ranks:
    """The ranks torchrun started (WORLD_SIZE, RANK in the environment), with the process group initialised:
    gloo on CPU, NCCL on CUDA (each rank on cuda:LOCAL_RANK). Without torchrun: ``SINGLE``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    rank = int(os.environ["RANK"])
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return Ranks(rank, world)


def close_ranks(ranks: Ranks) -> None:
    if ranks.active and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


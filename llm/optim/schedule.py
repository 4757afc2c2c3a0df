"""The optimiser and its learning-rate schedule (TRL's and transformers' names: ``lr_scheduler_type``,
``warmup_ratio``, ``warmup_steps``, ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``).

The schedule runs over the run's optimiser steps, i = ``num_iterations`` per training step: the optimiser step
``t = k i + j`` (step k, inner step j) takes the rate ``learning_rate x m(t)``, with m transformers' multiplier for
the schedule (``transformers.get_scheduler``), ``max_steps x i`` steps long, warming up over ``warmup_steps``
optimiser steps (or ``warmup_ratio`` of them). The rate is set from t itself before every optimiser step, so it is a
function of the step and the inner step alone: a resumed run continues the schedule exactly, and an inner step
skipped for a non-finite loss does not shift the later ones. The checkpoint records the schedule and the number of
optimiser steps it had reached (``Schedule.state``), and a resume with another schedule is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


#: Schedules whose rate does not depend on the run's length.
CONSTANT_SCHEDULES = ("constant", "constant_with_warmup")


def make_optimizer(optim, params) -> torch.optim.Optimizer:
    """AdamW with the optim group's rate, betas, epsilon and weight decay (``OptimConfig``). Where some parameters are FSDP's DTensors (the
    sharded blocks) and others plain tensors (embeddings, final norm), the per-tensor update: the multi-tensor one
    torch picks for CUDA tensors refuses the mix ("got mixed torch.Tensor and DTensor", on an H200, 2026-11-26);
    CPU tensors take the per-tensor update either way."""
    from torch.distributed.tensor import DTensor

    params = list(params)
    mixed = len({isinstance(p, DTensor) for p in params}) > 1
    return torch.optim.AdamW(params, lr=optim.learning_rate, betas=(optim.adam_beta1, optim.adam_beta2),
                             eps=optim.adam_epsilon, weight_decay=optim.weight_decay,
                             foreach=False if mixed else None)


@dataclass
class Schedule:
    """The learning rate of every optimiser step of a run (module docstring)."""

    kind: str
    base: float
    total: int
    warmup: int
    iterations: int = 1

    @classmethod
    def from_config(cls, optim, max_steps: int) -> "Schedule":
        """The schedule of an ``OptimConfig`` (``config.optim``) over ``max_steps`` x num_iterations steps."""
        total = max_steps * optim.num_iterations
        warmup = optim.warmup_steps if optim.warmup_steps > 0 else math.ceil(optim.warmup_ratio * total)
        return cls(optim.lr_scheduler_type, optim.learning_rate, total, warmup, optim.num_iterations)

    def multiplier(self, t: int) -> float:
        """transformers' multiplier of the schedule at optimiser step t (0-based)."""
        if not hasattr(self, "_lambda"):
            from transformers import get_scheduler

            probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
            scheduler = get_scheduler(self.kind, probe, num_warmup_steps=self.warmup, num_training_steps=self.total)
            self._lambda = scheduler.lr_lambdas[0]
        return float(self._lambda(t))

    def rate(self, step: int, inner: int = 0) -> float:
        """The learning rate of inner step ``inner`` of training step ``step``."""
        return self.base * self.multiplier(step * self.iterations + inner)

    def apply(self, optimizer: torch.optim.Optimizer, step: int, inner: int = 0) -> float:
        """Set the optimiser's rate for this optimiser step; returns it."""
        lr = self.rate(step, inner)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state(self, next_step: int) -> dict:
        """What the checkpoint records: the schedule and the optimiser steps taken before ``next_step``."""
        return {"kind": self.kind, "base": self.base, "total": self.total, "warmup": self.warmup,
                "optimizer_steps": next_step * self.iterations}

    def check_resume(self, saved: dict | None) -> None:
        """Refuse to continue a checkpoint written with another schedule (``None``: a checkpoint of before schedules,
        which ran at a constant rate)."""
        saved = saved or {"kind": "constant", "base": self.base, "total": self.total, "warmup": 0}
        # a schedule that decays over the run depends on its length; the constant ones do not (max_steps may grow)
        keys = ("kind", "base", "warmup") if self.kind in CONSTANT_SCHEDULES else ("kind", "base", "warmup", "total")
        mine = {k: v for k, v in self.state(0).items() if k in keys}
        theirs = {k: saved.get(k) for k in keys}
        if mine != theirs:
            raise ValueError(f"lr_scheduler_type: the checkpoint's schedule {theirs} is not this run's {mine}; resume "
                             "with the same schedule settings (learning_rate, lr_scheduler_type, warmup, max_steps)")

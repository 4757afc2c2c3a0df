"""The weights a run holds, and where they go: ``Weights``.

- the policy pi_theta (float32 master weights) and its optimiser;
- alpha, the sampler's weights, and the trainer's own copy of them (recomputed log-probs, the sync check, the TV
  diagnostics, checkpoints; the transformers sampler's own model serves when it is not running ahead);
- with asynchronous generation, alpha's successor: the weights the sampler generates the next window from;
- pi_ref (beta > 0);
- under FSDP, rank 0's whole copy in CPU memory (``staging``), into which every rank gathers a sharded model for the
  sampler, the evaluation and the saved model (``unsharded``).

The sync (``Weights.sync``) is the one place where alpha changes. Rank 0 alone holds the sampler; on the other ranks
``sampler`` is None and the calls that reach it do nothing there (they still take part in FSDP's gathers).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from llm.tensors.sync_probe import sync_check
from llm.models.distributed import (Ranks, gather_into, load_whole_optimizer_state, load_whole_state_dict, shard_blocks,
                          whole_optimizer_state, whole_state_dict)
from llm.models.model import Precision, copy_weights, frozen_copy
from llm.optim.schedule import make_optimizer
from llm.sampling import Sampler, SamplerSpec, TransformersSampler, make_sampler, probe_sync

@dataclass
class Weights:
    """The policy, its optimiser, alpha (the sampler's and the trainer's copy), alpha's successor and pi_ref."""

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sampler: Sampler | None
    alpha: torch.nn.Module
    ref: torch.nn.Module | None
    ranks: Ranks
    alpha_next: torch.nn.Module | None = None
    staging: torch.nn.Module | None = None

    @classmethod
    def build(cls, config, ranks: Ranks, policy: torch.nn.Module, tokenizer, model_path: str,
              probe_prompts: list[list[int]], longest_prompt: int, sampler_spec: SamplerSpec, agent=None) -> "Weights":
        """Start the sampler on rank 0 (alpha = the policy, proven to reach it for this architecture by
        ``probe_sync``), make the copies and the optimiser; under FSDP shard each copy as soon as it is made (one whole
        copy besides the policy at a time) and keep rank 0's whole copy in CPU memory."""
        sampler = make_sampler(sampler_spec, policy, tokenizer, model_path, longest_prompt) if ranks.main else None
        if sampler is not None and config.diagnostics.verify_sync and sampler.holds_own_weights:
            temperature = config.sampling.temperature
            probe_sync(sampler, policy, probe_prompts, tokenizer.pad_token_id, temperature,
                       Precision.of(config.machine.dtype), sync_check(config.machine.dtype, temperature),
                       config.sampling.token_filter)  # ends with the policy's
        elif sampler is not None and sampler.runs_server:  # a server's weights may be anyone's
            sampler.load_weights(policy)
        own = isinstance(sampler, TransformersSampler) and not config.sync.async_generation and not ranks.active
        if sampler is not None and agent is not None:  # every completion an episode (``llm.agents``)
            from llm.agents.episodes import AgentSampler

            sampler = AgentSampler(sampler, agent)
        copy = (lambda: shard_blocks(frozen_copy(policy))) if ranks.fsdp else (lambda: frozen_copy(policy))
        alpha = sampler.model if own else copy()  # asynchronous: the sampler runs ahead of alpha
        alpha_next = copy() if config.sync.async_generation else None
        ref = copy() if config.objective.beta > 0 else None
        staging = frozen_copy(policy).to("cpu") if ranks.fsdp and ranks.main else None
        if ranks.fsdp:
            shard_blocks(policy)
        trainable = [p for p in policy.parameters() if p.requires_grad]  # all, or the LoRA adapters
        optimizer = make_optimizer(config.optim, trainable)
        return cls(policy, optimizer, sampler, alpha, ref, ranks, alpha_next, staging)

    # ---- the sampler's weights ------------------------------------------------------------------
    def unsharded(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model``'s weights where rank 0 can hand them to the sampler, evaluate or save them: ``model`` itself, or
        under FSDP rank 0's whole copy after every rank has taken part in gathering them into it (so every rank
        calls this; ranks other than 0 get ``model`` back, for calls that do nothing there)."""
        if not self.ranks.fsdp:
            return model
        gather_into(self.staging, model)
        return self.staging if self.ranks.main else model

    def serve(self, model: torch.nn.Module) -> None:
        """The sampler <- ``model``'s weights (every rank calls it; rank 0's sampler gets them)."""
        whole = self.unsharded(model)
        if self.sampler is not None:
            self.sampler.load_weights(whole)

    @property
    def served(self) -> torch.nn.Module:
        """The copy whose weights the sampler holds between syncs: alpha's, or with asynchronous generation alpha's
        successor's (the next window is generated from them)."""
        return self.alpha if self.alpha_next is None else self.alpha_next

    def sync(self) -> None:
        """alpha <- pi_k: the sampler and the trainer's copy. With asynchronous generation the sampler's new weights
        serve the next window: alpha <- alpha's successor <- pi_k."""
        self.serve(self.policy)
        if self.alpha_next is not None:
            copy_weights(self.alpha, self.alpha_next)
            copy_weights(self.alpha_next, self.policy)
        elif self.alpha is not getattr(self.sampler, "model", None):
            copy_weights(self.alpha, self.policy)

    def advance(self) -> None:
        """alpha <- alpha's successor, without a sync: the divergence policy one step ahead, at the first step the
        weights synced at the previous step generated."""
        copy_weights(self.alpha, self.alpha_next)

    @contextlib.contextmanager
    def policy_in_sampler(self, engine: bool, swap: bool = True):
        """For the duration, a vLLM engine or server (``engine``) holds the policy's weights (``swap``: False when it
        holds them already, before the first update) and afterwards the weights it held before. Yields the policy's
        weights where rank 0 can evaluate them (``unsharded``)."""
        policy = self.unsharded(self.policy)
        swap = engine and swap
        if swap:
            self.serve(self.policy)
        try:
            yield policy
        finally:
            if swap:
                self.serve(self.served)

    def reset_ref(self, mix: float = 1.0) -> None:
        """pi_ref <- mix pi_theta + (1 - mix) pi_ref, weight by weight (1: a copy; TRL's ref_model_mixup_alpha)."""
        if mix == 1.0:
            copy_weights(self.ref, self.policy)
            return
        with torch.no_grad():
            before = {name: p.detach().clone() for name, p in self.ref.named_parameters()}
            copy_weights(self.ref, self.policy)
            for name, p in self.ref.named_parameters():
                p.mul_(mix).add_(before[name], alpha=1.0 - mix)

    # ---- checkpoints -----------------------------------------------------------------------------
    def state(self) -> dict:
        """Everything of the weights a resumed run needs, in the one-process layout (under FSDP gathered whole by
        every rank, kept by rank 0)."""
        keep = self.ranks.main

        def whole(model: torch.nn.Module | None) -> dict | None:
            return None if model is None else whole_state_dict(model, keep)

        return {"policy": whole(self.policy), "optimizer": whole_optimizer_state(self.optimizer, keep),
                "alpha": whole(self.alpha), "alpha_next": whole(self.alpha_next), "ref": whole(self.ref),
                "world_size": self.ranks.world, "fsdp": self.ranks.fsdp}

    def restore(self, ckpt: dict) -> None:
        """Load a checkpoint (any of the run's, with or without FSDP) and hand alpha's weights to the sampler."""
        load_whole_state_dict(self.policy, ckpt["policy"])
        load_whole_optimizer_state(self.optimizer, ckpt["optimizer"])
        load_whole_state_dict(self.alpha, ckpt["alpha"])  # the transformers sampler's own model, when alpha is it
        self.serve(self.alpha)
        if self.alpha_next is not None:  # asynchronous generation: the weights of the window after this one
            load_whole_state_dict(self.alpha_next, ckpt["alpha_next"])
        if self.ref is not None:
            load_whole_state_dict(self.ref, ckpt["ref"])

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()

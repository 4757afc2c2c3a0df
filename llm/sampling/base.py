"""Samplers hold the behaviour policy alpha and generate groups of completions (docs/theory.md, §1 and §7).

The interface is small: ``generate`` returns completion token ids and the behaviour log-probs of
the sampled tokens: log of the distribution sampled, softmax(logits / temperature) restricted by the
``token_filter`` (top-k, top-p, min-p; none by default) and renormalised, the same distribution the trainer
recomputes, so the importance weights are exact; ``load_weights`` copies the trainer's current weights in
(alpha <- pi_theta).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

import torch

from llm.tensors.token_filter import NO_FILTER, TokenFilter


@dataclass
class Rollout:
    """Completions for a list of prompts, ``n`` per prompt, prompt-major (prompt 0's n first)."""

    completion_ids: list[list[int]]
    """Token ids of each completion, ending with EOS when one was generated."""
    logprobs: list[list[float]] | None
    """Sampler's log alpha of each completion token (None if the sampler does not report them; 0.0 on an agent
    episode's environment tokens, which alpha did not draw)."""
    tool_mask: list[list[int]] | None = None
    """An agent's episodes (``llm.agents``): 1 on each completion token the policy drew, 0 on the environment's."""
    tool_calls: list[int] | None = None
    """An agent's episodes: the tool calls each one made."""
    tool_failures: list[int] | None = None
    """An agent's episodes: its calls that failed (raised, timed out, called a tool it does not have)."""
    messages: list[list[dict]] | None = None
    """An agent's episodes as messages: each turn of the policy as parsed (content, tool calls), each tool's answer.
    Text rewards read the last turn's content; reward functions with TRL's signature get the whole list."""
    env_rewards: list[dict[str, float]] | None = None
    """An agent's episodes with environments that score them (``get_reward``): each environment reward source's
    value by its name (nan where it does not apply)."""
    environments: list | None = None
    """An agent's episodes with environments: each episode's environment (None where it failed), for reward
    functions' ``environments=`` (TRL's)."""
    prompt_ids: list[list[int]] | None = None
    """Each completion's own prompt, where an environment's ``reset`` changed some (None: its prompt's tokens)."""
    env_failed: list[bool] | None = None
    """An agent's episodes: whether its environment failed (reset or get_reward raised, hung or returned something
    else): the episode scores 0."""
    malformed: list[int] | None = None
    """An agent's episodes: the turns the parser could not read (each ended its episode as a final answer)."""
    leases: list | None = None
    """An agent's episodes with environments: each one's pooled instance (``llm.agents.environments.Lease``; None
    where it failed), given back to the pool by ``release`` once the episodes are scored."""
    prompts_shown: list | None = None
    """Each completion's prompt as its episode saw it, where an environment's ``reset`` appended an observation (None:
    the rows' prompts as they are): what samples and the completions table show."""

    def release(self) -> None:
        """Give the episodes' environment instances back to their pool (their reward functions have run): the next
        episodes reset them again, as TRL reuses its instances. Once; nothing without environments."""
        for lease in self.leases or ():
            if lease is not None:
                lease.give_back()
        self.leases = None

    def select(self, rows) -> "Rollout":
        """The completions at ``rows`` (indices, in that order)."""
        rows = list(rows)
        return Rollout(**{f.name: None if getattr(self, f.name) is None else [getattr(self, f.name)[j] for j in rows]
                          for f in fields(self)})

    def slice(self, start: int, stop: int) -> "Rollout":
        return self.select(range(start, stop))

    @staticmethod
    def concat(parts: list["Rollout"]) -> "Rollout":
        """The completions of ``parts`` one after the other (a field None in any part is None)."""
        joined = {}
        for f in fields(Rollout):
            values = [getattr(p, f.name) for p in parts]
            joined[f.name] = None if any(v is None for v in values) else [x for v in values for x in v]
        return Rollout(**joined)


class Sampler(Protocol):
    """What a sampler is, declared as class attributes the trainer reads (no comparison of names outside
    ``llm.sampling``), and what it does."""

    name: str
    holds_own_weights: bool
    """It holds its own copy of the weights, reached only through ``load_weights`` (an engine, a server): the trainer
    proves the sync at start-up (``probe_sync``) and hands it the policy's weights to evaluate with."""
    runs_server: bool
    """Its weights live in another process and may be anyone's when the run starts: the trainer sends the policy's
    before the first step."""
    returns_logprobs: bool
    """``generate`` reports log alpha of every drawn token (the certificates need the sampler's own)."""
    owns_torch_distributed: bool
    """It sets up ``torch.distributed`` for itself in the trainer's process (an in-process vLLM engine): it cannot
    share torchrun's process group."""

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        ...

    def load_weights(self, model: torch.nn.Module) -> None:
        ...

    def close(self) -> None:
        ...

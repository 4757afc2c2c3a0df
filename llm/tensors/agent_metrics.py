"""An agent's episodes in numbers: its tool calls (TRL 1.16's ``tools/*`` names and definitions, and this package's) and
its importance ratios per episode and per turn (``episode/*``; docs/agents.md)."""

from __future__ import annotations

import numpy as np
import torch


def tool_metrics(tool_mask: list[list[int]], calls: list[int], failures: list[int], malformed: list[int] | None = None,
                 env_failed: list[bool] | None = None) -> dict[str, float]:
    """An agent's episodes: ``tools/call_frequency`` (calls per episode) and ``tools/failure_frequency`` (failed calls
    per call, at most 1; 0 without calls), TRL 1.16's names and definitions; this package's: the turns the parser could
    not read per episode (``tools/malformed_frequency``), the episodes whose environment failed
    (``tools/env_failure_frequency``: scored 0), the environment's share of the completion tokens and the policy's
    turns per episode."""
    n_calls, n = float(sum(calls)), max(len(calls), 1)
    tokens = sum(len(m) for m in tool_mask)
    return {"tools/call_frequency": n_calls / n,
            "tools/failure_frequency": float(sum(failures)) / n_calls if n_calls else 0.0,
            "tools/malformed_frequency": float(sum(malformed or [])) / n,
            "tools/env_failure_frequency": float(sum(env_failed or [])) / n,
            "tools/env_token_frac": float(sum(len(m) - sum(m) for m in tool_mask)) / max(tokens, 1),
            "tools/turns_mean": float(np.mean([len(turn_spans(m)) for m in tool_mask]))}


def turn_spans(policy: list[int]) -> list[tuple[int, int]]:
    """The policy's turns in an episode's mask (1: the policy's token): [start, stop) of each run of ones."""
    spans, start = [], None
    for t, m in enumerate(list(policy) + [0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            spans.append((start, t))
            start = None
    return spans


@torch.no_grad()
def episode_metrics(logp_k: torch.Tensor, logp_alpha: torch.Tensor, policy_mask: torch.Tensor) -> dict[str, float]:
    """An agent's episodes, per episode and per turn: the log of pi_k/alpha over each episode's own tokens (the
    sequence ratio the sequence-level modes and ``ess/pi_k_alpha`` use; it collapses on long episodes) and over each
    turn's, ``episode/log_ratio_min|max``, ``episode/turn_log_ratio_min|max``, and the effective sample size of the
    turns' ratios as a share of the turns, ``episode/turn_ess``: beside ``ess/pi_k_alpha``, it shows whether a
    collapsed episode ratio is one turn's or every turn's."""
    lw = ((logp_k - logp_alpha) * policy_mask).double().cpu().numpy()
    masks = policy_mask.cpu().numpy()
    episodes = lw.sum(axis=1)
    turns = np.array([lw[b, a:c].sum() for b in range(len(lw)) for a, c in turn_spans(masks[b].astype(int).tolist())])
    if not turns.size:
        return {}
    w = np.exp(turns - turns.max())
    return {"episode/log_ratio_min": float(episodes.min()), "episode/log_ratio_max": float(episodes.max()),
            "episode/turn_log_ratio_min": float(turns.min()), "episode/turn_log_ratio_max": float(turns.max()),
            "episode/turn_ess": float(w.sum() ** 2 / (w ** 2).sum() / len(w))}

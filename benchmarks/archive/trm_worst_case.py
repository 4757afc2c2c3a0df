"""The worst case of Trust Region Masking's bounds read off sampled prefixes: ``python benchmarks/archive/trm_worst_case.py``.

A token tree (V = 2, T = 3) where the first token is 1 with probability 0.02 under mu = pi_k, and pi = pi_{k+1} ruins
that rare branch (its second token, which alone pays there, goes from 0.95 to 0.05), while it improves the common
branch a little (0.5 to 0.505). The exact improvement is negative, and the exact unified bound says nothing (its lower bound is
below it). The estimates of ``llm.tensors.diagnostics.trm_estimates`` from batches of n sequences read the largest
per-token divergence off the prefixes the batch sampled: a batch that misses the rare branch sees only the small
divergences of the common one, and its estimated lower bound can lie above the exact improvement. Printed: the exact
quantities, then per batch size the share of 4,000 batches whose estimated max TV is below the true max and whose
estimated lower bound exceeds the exact improvement. docs/theory.md, §8.7 quotes the output.
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from grpo_theory import trm  # noqa: E402
from llm.tensors.diagnostics import trm_estimates  # noqa: E402


def tree_pair():
    """(pi, mu, reward) of the module docstring."""
    logit = lambda p: np.array([np.log(1 - p), np.log(p)])  # noqa: E731  next-token logits giving token 1 prob p
    mu = [logit(0.02)[None], np.stack([logit(0.5), logit(0.95)]), np.stack([logit(0.5)] * 4)]
    pi = [logit(0.02)[None], np.stack([logit(0.505), logit(0.05)]), np.stack([logit(0.5)] * 4)]
    reward = np.zeros(8)
    reward[0b010] = reward[0b011] = 1.0  # common branch: second token 1 pays
    reward[0b110] = reward[0b111] = 1.0  # rare branch: second token 1 pays
    return trm.TokenTree.from_logits(pi), trm.TokenTree.from_logits(mu), reward


def main() -> None:
    pi, mu, reward = tree_pair()
    exact = trm.exact_bounds(pi, mu, reward)
    div = trm.exact_divergences(pi, mu)
    print(f"exact: improvement {exact['improvement']:+.4f}, surrogate gain {exact['surrogate_gain']:+.4f}, "
          f"max token TV {div.eps:.3f}, unified bound {exact['bound/unified']:.4f}, "
          f"its lower bound {exact['lower/unified']:+.4f}")
    rng = np.random.default_rng(0)
    for n in (16, 64, 256):
        low = above = 0
        for _ in range(4000):
            ys = trm.sample_sequences(mu, n, rng)
            tv, kl = trm.sampled_divergences(pi, mu, ys)
            est = trm_estimates(tv, kl, torch.ones(n, mu.T), torch.tensor(trm.token_logprobs(mu, ys)),
                                torch.tensor(trm.token_logprobs(pi, ys)), np.zeros((n // 8, 8)),
                                reward[trm.sequence_index(mu, ys)].reshape(n // 8, 8), mu.T)
            low += est["tv/token_max"] < div.eps - 1e-9
            above += est["bound_est/trm_lower"] > exact["improvement"]
        print(f"batches of {n:>3} sequences: estimated max TV below the true max on {low / 4000:.1%}, estimated "
              f"lower bound above the exact improvement on {above / 4000:.1%}")


if __name__ == "__main__":
    main()

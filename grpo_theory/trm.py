"""Trust Region Masking's bounds, exact on a tabular autoregressive model (docs/theory.md, §8.7).

Li, Liu, Xu, Tong, Li, Liu and Wang, "Trust Region Masking for Long-Horizon LLM Reinforcement Learning" (arXiv
2512.23075) bound the error of the token-level surrogate of a rollout policy mu = pi_roll,

    L_mu(pi) = J(mu) + sum_{t=1}^T E_{c_t ~ d_t^mu} E_{a ~ pi(.|c_t)} A^mu(c_t, a),

against the true J(pi), for sequences of T tokens and rewards in [0, 1], by the largest per-token divergence over
every context, eps = max_c TV(mu(.|c), pi(.|c)) and delta = max_c KL(mu(.|c) || pi(.|c)), the sequence-level
D_seq = KL(mu || pi) over whole sequences, and the mean per-token TV at each position under mu,
Dbar_t = E_{c_t ~ d_t^mu} TV(mu(.|c_t), pi(.|c_t)). Its bounds on |J(pi) - L_mu(pi)|, with the constants the paper
states (``trm_bounds``):

    classical          2 T (T - 1) eps^2                                      O(T^2)
    pinsker_marginal   (4/3) T^{3/2} delta                                    O(T^{3/2})
    mixed              2 T sqrt(delta D_seq)                                  O(T)
    coupling           4 min(1, eps) sum_t min(1, (t - 1) eps)
    adaptive           4 sum_t Dbar_t min(1, (T - t) eps, sqrt((T - t) delta / 2))

and the unified bound is their minimum. Each gives a lower bound on the improvement,
J(pi) - J(mu) >= L_mu(pi) - J(mu) - B. Here a policy over sequences of T tokens from a vocabulary of V is a table of
next-token distributions per prefix (``TokenTree``), small enough (V^T sequences) to compute every quantity above
by enumeration: the tests check that no bound ever exceeds the exact |J(pi) - L_mu(pi)|.

The surrogate gain L_mu(pi) - J(mu) has an unbiased sample estimate from sequences drawn from mu with rewards R:
E_mu[sum_t (rho_t - 1)(R - b)], rho_t = pi(y_t|c_t)/mu(y_t|c_t), for any b that does not depend on the sequence
(``surrogate_gain_samples``; the tests check it against the exact gain).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .core import softmax

#: The bounds of arXiv 2512.23075 that ``trm_bounds`` returns, in order, before their minimum ("unified").
BOUND_NAMES = ("classical", "pinsker_marginal", "mixed", "coupling", "adaptive")


@dataclass(frozen=True)
class TokenTree:
    """An autoregressive policy over sequences of ``T`` tokens from a vocabulary of ``V``: ``levels[t]`` (V^t, V) holds
    the next-token distribution after each prefix of t tokens (prefix index: the tokens as base-V digits, first
    token most significant), for t = 0, ..., T - 1."""

    levels: tuple[np.ndarray, ...]

    @property
    def T(self) -> int:
        return len(self.levels)

    @property
    def V(self) -> int:
        return self.levels[0].shape[-1]

    @classmethod
    def from_logits(cls, logits) -> "TokenTree":
        return cls(tuple(softmax(np.asarray(z, dtype=np.float64)) for z in logits))

    def prefix_probs(self) -> list[np.ndarray]:
        """d_t for t = 0, ..., T: the probability of each prefix of t tokens (d_T: of each whole sequence)."""
        d = [np.ones(1)]
        for p in self.levels:
            d.append((d[-1][:, None] * p).reshape(-1))
        return d

    def sequence_probs(self) -> np.ndarray:
        """The probability of each of the V^T sequences."""
        return self.prefix_probs()[-1]

    def values(self, reward: np.ndarray) -> list[np.ndarray]:
        """V_t for t = 0, ..., T: the expected reward after each prefix of t tokens, continuing with this policy
        (V_T = ``reward``, V_0 = J)."""
        v = [np.asarray(reward, dtype=np.float64)]
        for p in reversed(self.levels):
            v.append((p * v[-1].reshape(p.shape)).sum(axis=1))
        return v[::-1]


def random_tree(rng: np.random.Generator, V: int, T: int, scale: float = 1.0) -> tuple[np.ndarray, ...]:
    """Logits of a random policy: every prefix's next-token logits ``scale`` x N(0, 1)."""
    return tuple(scale * rng.standard_normal((V ** t, V)) for t in range(T))


def exact_improvement(pi: TokenTree, mu: TokenTree, reward) -> float:
    """J(pi) - J(mu), exactly."""
    return float(pi.values(reward)[0][0] - mu.values(reward)[0][0])


def exact_surrogate_gain(pi: TokenTree, mu: TokenTree, reward) -> float:
    """L_mu(pi) - J(mu) = sum_t E_{c_t ~ d_t^mu} sum_a pi(a|c_t) A^mu(c_t, a), exactly."""
    d, v = mu.prefix_probs(), mu.values(reward)
    gain = 0.0
    for t, p in enumerate(pi.levels):
        adv = v[t + 1].reshape(p.shape) - v[t][:, None]  # A^mu(c, a) = V^mu(c a) - V^mu(c)
        gain += float(np.sum(d[t][:, None] * p * adv))
    return gain


@dataclass(frozen=True)
class Divergences:
    """The divergences TRM's bounds read, between a rollout policy mu and pi: ``eps`` (max per-token TV over every
    prefix), ``delta`` (max per-token KL(mu || pi)), ``seq_kl`` (KL(mu || pi) over whole sequences) and ``mean_tv``
    (T,): E_{c_t ~ d_t^mu} TV(mu(.|c_t), pi(.|c_t)) at each position."""

    eps: float
    delta: float
    seq_kl: float
    mean_tv: np.ndarray


def divergence_tables(pi: TokenTree, mu: TokenTree) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per position t, TV(mu(.|c), pi(.|c)) and KL(mu(.|c) || pi(.|c)) of every prefix c of t tokens, (V^t,) each."""
    out = []
    for p, q in zip(mu.levels, pi.levels):
        kl = np.sum(np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(q)), 0.0), axis=1)
        out.append((0.5 * np.abs(p - q).sum(axis=1), kl))
    return out


def sampled_divergences(pi: TokenTree, mu: TokenTree, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-token TV and KL(mu || pi) at each prefix of sequences ``ys`` (n, T): what a language-model run computes
    at its sampled prefixes (``llm.tensors.diagnostics.token_divergences``), exactly, two (n, T) arrays."""
    tv, kl = np.zeros(ys.shape), np.zeros(ys.shape)
    prefix = np.zeros(ys.shape[0], dtype=np.int64)
    for t, (tv_t, kl_t) in enumerate(divergence_tables(pi, mu)):
        tv[:, t], kl[:, t] = tv_t[prefix], kl_t[prefix]
        prefix = prefix * mu.V + ys[:, t]
    return tv, kl


def exact_divergences(pi: TokenTree, mu: TokenTree) -> Divergences:
    """``Divergences`` by enumeration of every prefix."""
    d = mu.prefix_probs()
    eps = delta = seq_kl = 0.0
    mean_tv = np.zeros(mu.T)
    for t, (tv, kl) in enumerate(divergence_tables(pi, mu)):
        eps, delta = max(eps, float(tv.max())), max(delta, float(kl.max()))
        seq_kl += float(d[t] @ kl)  # the chain rule: KL over sequences is the d^mu-mean of the per-token KLs
        mean_tv[t] = float(d[t] @ tv)
    return Divergences(eps, delta, seq_kl, mean_tv)


def trm_bounds(div: Divergences, T: int | None = None) -> dict[str, float]:
    """The bounds on |J(pi) - L_mu(pi)| of arXiv 2512.23075 with the paper's constants (module docstring), for
    sequences of ``T`` tokens (default: ``div.mean_tv``'s length; positions past it have mean TV 0), and
    ``unified``, their minimum."""
    T = len(div.mean_tv) if T is None else int(T)
    eps, delta = min(1.0, div.eps), div.delta
    t = np.arange(1, T + 1, dtype=np.float64)
    mean_tv = np.zeros(T)
    mean_tv[:min(T, len(div.mean_tv))] = np.asarray(div.mean_tv, dtype=np.float64)[:T]
    future = T - t
    out = {
        "classical": 2.0 * T * (T - 1) * eps ** 2,
        "pinsker_marginal": 4.0 / 3.0 * T ** 1.5 * delta,
        "mixed": 2.0 * T * float(np.sqrt(delta * max(div.seq_kl, 0.0))),
        "coupling": 4.0 * eps * float(np.minimum(1.0, (t - 1) * eps).sum()),
        "adaptive": 4.0 * float(np.sum(mean_tv * np.minimum.reduce(
            [np.ones(T), future * eps, np.sqrt(future * delta / 2.0)]))),
    }
    out["unified"] = min(out.values())
    return out


def exact_bounds(pi: TokenTree, mu: TokenTree, reward) -> dict[str, float]:
    """Every TRM bound's lower bound on J(pi) - J(mu) (``lower/<name>``: the exact surrogate gain minus the bound),
    the bounds themselves, the exact gain (``surrogate_gain``) and the exact improvement (``improvement``)."""
    gain = exact_surrogate_gain(pi, mu, reward)
    bounds = trm_bounds(exact_divergences(pi, mu))
    out = {"improvement": exact_improvement(pi, mu, reward), "surrogate_gain": gain}
    out.update({f"bound/{k}": v for k, v in bounds.items()})
    out.update({f"lower/{k}": gain - v for k, v in bounds.items()})
    return out


def sample_sequences(tree: TokenTree, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequences (n, T) of token ids drawn from ``tree``."""
    ys = np.zeros((n, tree.T), dtype=np.int64)
    prefix = np.zeros(n, dtype=np.int64)
    for t, p in enumerate(tree.levels):
        cdf = np.cumsum(p[prefix], axis=1)
        ys[:, t] = np.minimum((rng.random(n)[:, None] > cdf).sum(axis=1), tree.V - 1)
        prefix = prefix * tree.V + ys[:, t]
    return ys


def sequence_index(tree: TokenTree, ys: np.ndarray) -> np.ndarray:
    """The index of each sequence of ``ys`` (n, T) among the V^T (its tokens as base-V digits, first most
    significant): the position of its probability in ``sequence_probs`` and of its reward in a reward table."""
    return (ys * tree.V ** np.arange(tree.T - 1, -1, -1)).sum(axis=1)


def token_logprobs(tree: TokenTree, ys: np.ndarray) -> np.ndarray:
    """log tree(y_t | y_<t) of every token of sequences ``ys`` (n, T)."""
    out = np.zeros(ys.shape)
    prefix = np.zeros(ys.shape[0], dtype=np.int64)
    for t, p in enumerate(tree.levels):
        out[:, t] = np.log(p[prefix, ys[:, t]])
        prefix = prefix * tree.V + ys[:, t]
    return out


def surrogate_gain_samples(logp_new, logp_roll, rewards, baseline, mask=None) -> np.ndarray:
    """Per-sequence terms whose mean is unbiased for the surrogate gain L_mu(pi) - J(mu) over sequences drawn from mu:
    sum_t (rho_t - 1) (R - b), rho_t = exp(``logp_new`` - ``logp_roll``) per token (n, T; ``mask`` (n, T): the
    tokens that exist), R = ``rewards`` (n,), b = ``baseline`` (n,), which must not depend on the sequence's own
    tokens (a leave-one-out group mean is fine; a mean that includes the sequence itself biases it by O(1/G)).
    Unbiased because E_mu[(rho_t - 1) | c_t] = 0 and E_mu[(rho_t - 1) R | c_t] = E_pi A^mu(c_t, .)."""
    lp_new, lp_roll = np.asarray(logp_new, dtype=np.float64), np.asarray(logp_roll, dtype=np.float64)
    m = np.ones_like(lp_new) if mask is None else np.asarray(mask, dtype=np.float64)
    rho_minus_one = np.expm1(np.clip(lp_new - lp_roll, -50.0, 50.0)) * m
    return rho_minus_one.sum(axis=1) * (np.asarray(rewards, dtype=np.float64) - np.asarray(baseline, dtype=np.float64))


def leave_one_out_baseline(rewards) -> np.ndarray:
    """Each sample's group mean without itself, rewards (P, G) -> (P, G); G = 1 gives 0."""
    r = np.asarray(rewards, dtype=np.float64)
    G = r.shape[-1]
    return (r.sum(axis=-1, keepdims=True) - r) / (G - 1) if G > 1 else np.zeros_like(r)

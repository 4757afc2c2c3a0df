"""Trust Region Masking's bounds (arXiv 2512.23075) on a tabular autoregressive model: never above the exact error,
their quantities against hand computations, and the sample estimate of the surrogate gain against the exact one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_theory import improvement_lower_bound
from grpo_theory.trm import (
    BOUND_NAMES,
    Divergences,
    TokenTree,
    exact_bounds,
    exact_divergences,
    exact_improvement,
    exact_surrogate_gain,
    leave_one_out_baseline,
    random_tree,
    sample_sequences,
    sampled_divergences,
    sequence_index,
    surrogate_gain_samples,
    token_logprobs,
    trm_bounds,
)


def _pair(seed: int, V: int, T: int, scale: float, step: float):
    rng = np.random.default_rng(seed)
    base = random_tree(rng, V, T, scale)
    mu = TokenTree.from_logits(base)
    pi = TokenTree.from_logits([z + step * rng.standard_normal(z.shape) for z in base])
    reward = rng.random(V ** T) if seed % 2 else (rng.random(V ** T) < 0.3).astype(float)
    return pi, mu, reward


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), V=st.integers(2, 3), T=st.integers(1, 5),
       scale=st.floats(0.05, 4.0), step=st.floats(1e-3, 3.0))
def test_no_bound_exceeds_the_exact_error(seed, V, T, scale, step):
    """|J(pi) - L_mu(pi)| <= every bound, so every lower bound gain - B is <= the exact improvement."""
    pi, mu, reward = _pair(seed, V, T, scale, step)
    e = exact_bounds(pi, mu, reward)
    error = abs(e["improvement"] - e["surrogate_gain"])
    for name in BOUND_NAMES + ("unified",):
        assert error <= e[f"bound/{name}"] + 1e-12, (name, error, e)
        assert e[f"lower/{name}"] <= e["improvement"] + 1e-12


def test_a_point_mass_reward_at_the_end_of_the_range():
    """The worst case for a bound read off divergences: the whole reward on one sequence that mu almost never
    samples and pi moves towards; every bound still holds, and the surrogate's error is not zero."""
    V, T = 2, 4
    rng = np.random.default_rng(3)
    base = random_tree(rng, V, T, 0.5)
    base[0][0] = np.array([4.0, -4.0])  # a first token 1 is rare under mu ...
    base[-1][-1] = np.array([4.0, -4.0])  # ... and so is a last one after 111
    mu = TokenTree.from_logits(base)
    moved = [z.copy() for z in base]
    moved[0][0] = moved[-1][-1] = np.array([-1.0, 1.0])
    pi = TokenTree.from_logits(moved)
    reward = np.zeros(V ** T)
    reward[-1] = 1.0  # only the sequence 1111 pays
    e = exact_bounds(pi, mu, reward)
    error = abs(e["improvement"] - e["surrogate_gain"])
    assert error > 1e-4
    assert all(error <= e[f"bound/{n}"] for n in BOUND_NAMES)


def test_the_divergences_by_hand():
    """One token (T = 1): eps is the TV, delta and the sequence KL the KL, the error zero (the surrogate is exact)."""
    mu = TokenTree((np.array([[0.5, 0.5]]),))
    pi = TokenTree((np.array([[0.8, 0.2]]),))
    d = exact_divergences(pi, mu)
    kl = 0.5 * np.log(0.5 / 0.8) + 0.5 * np.log(0.5 / 0.2)
    assert d.eps == pytest.approx(0.3) and d.delta == pytest.approx(kl) and d.seq_kl == pytest.approx(kl)
    reward = np.array([1.0, 0.0])
    assert exact_improvement(pi, mu, reward) == pytest.approx(exact_surrogate_gain(pi, mu, reward))
    b = trm_bounds(d)
    assert b["classical"] == 0.0 and b["coupling"] == 0.0 and b["adaptive"] == 0.0  # T - 1 = 0, T - t = 0


def test_the_constants_and_their_scaling():
    """The paper's figures: T = 4096, delta = 1e-4 gives 1677 (classical in KL form, T (T-1) delta, which the TV form
    2 T (T-1) eps^2 meets at Pinsker's eps = sqrt(delta/2)) and 35.0 (Pinsker-marginal); the mixed bound is linear in
    T at fixed divergences."""
    delta = 1e-4
    d = Divergences(eps=np.sqrt(delta / 2), delta=delta, seq_kl=0.01, mean_tv=np.zeros(4096))
    b = trm_bounds(d)
    assert b["classical"] == pytest.approx(4096 * 4095 * delta)
    assert round(b["classical"]) == 1677 and round(b["pinsker_marginal"], 1) == 35.0
    assert trm_bounds(d, 8192)["mixed"] == pytest.approx(2 * b["mixed"])
    assert b["unified"] == min(b[n] for n in BOUND_NAMES)


def test_the_sample_gain_is_unbiased():
    """The mean of ``surrogate_gain_samples`` over sequences of mu is within 4 standard errors of the exact gain, with
    a constant baseline and with a leave-one-out group baseline; a baseline that includes the sample itself is
    not what the function asks for."""
    pi, mu, reward = _pair(11, 3, 4, 1.0, 0.4)
    rng = np.random.default_rng(0)
    exact = exact_surrogate_gain(pi, mu, reward)
    ys = sample_sequences(mu, 80_000, rng)
    index = sequence_index(mu, ys)
    lp_new, lp_roll, r = token_logprobs(pi, ys), token_logprobs(mu, ys), reward[index]
    for baseline in (np.full(len(ys), 0.5), leave_one_out_baseline(r.reshape(-1, 8)).reshape(-1)):
        terms = surrogate_gain_samples(lp_new, lp_roll, r, baseline)
        assert abs(terms.mean() - exact) < 4 * terms.std() / np.sqrt(len(terms)), (terms.mean(), exact)
    assert leave_one_out_baseline(np.array([[1.0, 0.0, 0.0]])).tolist() == [[0.0, 0.5, 0.5]]


def test_the_sampler_draws_the_tree():
    """Sequence frequencies of ``sample_sequences`` match ``sequence_probs`` (chi-square at the 1e-4 level)."""
    from scipy.stats import chisquare

    pi, _, _ = _pair(5, 2, 3, 1.0, 0.1)
    ys = sample_sequences(pi, 40_000, np.random.default_rng(1))
    counts = np.bincount(sequence_index(pi, ys), minlength=8)
    assert chisquare(counts, 40_000 * pi.sequence_probs()).pvalue > 1e-4


def test_sampled_divergences_are_the_tables_at_each_prefix():
    """``sampled_divergences`` reads each sequence's prefixes: at the first position every row has the root's TV and KL,
    and every value is one of its position's table entries."""
    pi, mu, _ = _pair(2, 3, 3, 1.0, 0.5)
    ys = sample_sequences(mu, 50, np.random.default_rng(0))
    tv, kl = sampled_divergences(pi, mu, ys)
    root = exact_divergences(pi, TokenTree(mu.levels[:1]))
    assert np.allclose(tv[:, 0], 0.5 * np.abs(mu.levels[0] - pi.levels[0]).sum()) and np.allclose(kl[:, 0], root.delta)
    second = 0.5 * np.abs(mu.levels[1] - pi.levels[1]).sum(axis=1)
    assert np.allclose(tv[:, 1], second[ys[:, 0]])


def test_theorem_1_and_the_unified_bound_on_one_table():
    """Both families hold on the same pair (Theorem 1 on the V^T sequences as a bandit, alpha = mu at lag 0)."""
    pi, mu, reward = _pair(8, 2, 4, 1.0, 0.05)
    e = exact_bounds(pi, mu, reward)
    theorem1 = float(improvement_lower_bound(pi.sequence_probs(), mu.sequence_probs(), mu.sequence_probs(),
                                             reward, 0.0))
    assert theorem1 <= e["improvement"] and e["lower/unified"] <= e["improvement"]

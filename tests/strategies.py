"""Hypothesis strategies for random bandits: 2 to 8 actions, near-deterministic to near-uniform
policies (softmax of logits times a temperature spanning 1e-2..30), continuous or binary rewards,
eps in [0, 3/4]."""

import numpy as np
from hypothesis import strategies as st

from grpo_theory.core import softmax

n_actions = st.integers(min_value=2, max_value=8)
eps_values = st.one_of(st.just(0.0), st.just(0.75), st.floats(min_value=0.0, max_value=0.75))


def policies(n: int):
    logits = st.lists(st.floats(-3, 3), min_size=n, max_size=n)
    scale = st.sampled_from([0.01, 0.3, 1.0, 3.0, 10.0, 30.0])
    return st.builds(lambda z, s: softmax(np.asarray(z) * s), logits, scale)


def rewards(n: int):
    cont = st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)
    binary = st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)
    return st.one_of(cont, binary).map(np.asarray)


@st.composite
def bandits(draw):
    """(pi, pi_k, alpha, r, eps) for one prompt."""
    n = draw(n_actions)
    return draw(policies(n)), draw(policies(n)), draw(policies(n)), draw(rewards(n)), draw(eps_values)

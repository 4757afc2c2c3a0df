"""Truncated sampling end to end on the built-in model (docs/theory.md, §1.1): alpha, pi_k and pi_{k+1} are the
filtered distributions of three nearby weights; completions sampled from alpha by the transformers sampler, weighed
with the trainer's filtered log-probs, give TV and improvement estimates whose values match the exact ones, computed
by enumerating every completion alpha can produce. With the full-softmax log-probs of pi (what a trainer that ignores
the sampler's filter computes) the TV estimate misses by many standard errors."""

import numpy as np
import pytest
import torch

from grpo_theory.estimators import improvement_estimate, tv_estimate
from llm.batch import make_batch
from llm.evaluation import exact_j
from llm.logprobs import completion_logprobs
from llm.model import frozen_copy, load_policy
from llm.sampling import TransformersSampler
from llm.sampling.token_filter import NO_FILTER, TokenFilter, filtered_log_softmax
from llm.tasks import arithmetic_task
from llm.tiny import tiny_model_dir
from tests.helpers import perturb

FILTER = TokenFilter(top_k=2, top_p=0.9)
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def case():
    """alpha (the policy perturbed), pi_k (the policy), pi_new (pi_k perturbed), four training prompts."""
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    alpha, pi_new = frozen_copy(policy), frozen_copy(policy)
    perturb(alpha, 1)
    perturb(pi_new, 2)
    bound = arithmetic_task().bind(tok)
    idx = [0, 40, 80, 120]
    return policy, alpha, pi_new, tok, bound, idx


@torch.no_grad()
def alphas_support(alpha, tok, prompt: list[int]) -> list[list[int]]:
    """Every completion the filtered alpha can produce from ``prompt``: a tree grown token by token through alpha's
    kept set, each branch ending at EOS or after MAX_TOKENS tokens."""
    done, frontier = [], [[]]
    for depth in range(MAX_TOKENS):
        if not frontier:
            break
        ids = torch.tensor([prompt + p for p in frontier])
        logits = alpha(input_ids=ids).logits[:, -1].float()
        kept = filtered_log_softmax(logits, FILTER) > -1e3
        grown = []
        for p, row in zip(frontier, kept):
            for t in torch.nonzero(row).flatten().tolist():
                (done if t == tok.eos_token_id or depth == MAX_TOKENS - 1 else grown).append(p + [t])
        frontier = grown
    return done


def seq_logp(model, tok, prompts, comps, token_filter=FILTER) -> np.ndarray:
    batch = make_batch(prompts, comps, tok.pad_token_id, "cpu")
    logp = completion_logprobs(model, batch, 1.0, token_filter=token_filter).logp
    return (logp.double() * batch.completion_mask.double()).sum(1).numpy()


def test_alphas_filtered_sequence_distribution_sums_to_one_and_the_exact_identities_hold(case):
    """Over alpha's whole support (enumerated), the trainer's filtered sequence probabilities of alpha add up to 1;
    E_alpha[(1 - w_k)^+] is TV(pi_k, alpha), and E_alpha[(w_new - w_k)(r - J(alpha))] is J(pi_new) - J(pi_k) less
    the part of the change on completions alpha cannot produce, exactly (float64 sums of the trainer's float32
    log-probs: 1e-6 for the total, 1e-5 for the gain)."""
    policy, alpha, pi_new, tok, bound, idx = case
    sizes = []
    for i in idx:
        p = bound.prompt_ids[i]
        ys = alphas_support(alpha, tok, p)
        sizes.append(len(ys))
        la, lk, ln = (seq_logp(m, tok, [p] * len(ys), ys) for m in (alpha, policy, pi_new))
        a, k, n = np.exp(la), np.exp(lk), np.exp(ln)
        assert a.sum() == pytest.approx(1.0, abs=1e-6)
        accepted = bound.accepted_ids[i]
        r = np.array([float(y in accepted) for y in ys])
        j = {name: float(exact_j(m, [p], [accepted], 1.0, tok.pad_token_id, token_filter=FILTER)[0])
             for name, m in (("alpha", alpha), ("k", policy), ("new", pi_new))}
        # TV over every sequence = sum over alpha's support of (alpha - pi_k)^+ (nothing else can be positive)
        assert float(np.sum(a * np.maximum(1 - k / a, 0))) == pytest.approx(float(np.sum(np.maximum(a - k, 0))), abs=1e-9)
        expected_gain = float(np.sum(a * (n / a - k / a) * (r - j["alpha"])))
        in_support = accepted[0] in ys
        missed = (0.0 if in_support else j["new"] - j["k"]) - j["alpha"] * ((1 - n.sum()) - (1 - k.sum()))
        assert expected_gain == pytest.approx(j["new"] - j["k"] - missed, abs=1e-5)
    assert sum(sizes) >= 8  # the filter leaves several completions: the sums are not trivial


def test_sampled_estimates_match_the_exact_values_and_the_full_softmax_ratio_does_not(case):
    """1,504 completions per prompt from alpha (the transformers sampler, top-k 2 and top-p 0.9): the mean TV and
    improvement estimates with the trainer's filtered log-probs lie within 4 standard errors of their exact values;
    with pi's full-softmax log-probs in the weights the TV estimate is more than 8 standard errors off."""
    policy, alpha, pi_new, tok, bound, idx = case
    sampler = TransformersSampler(alpha, tok.eos_token_id, tok.pad_token_id, copy=False)
    n, G = 1504, 8
    for i in idx:
        p = bound.prompt_ids[i]
        roll = sampler.generate([p], n, MAX_TOKENS, 1.0, seed=i, token_filter=FILTER)
        ys = alphas_support(alpha, tok, p)
        exact = {}
        la_all, lk_all = (seq_logp(m, tok, [p] * len(ys), ys) for m in (alpha, policy))
        exact["tv"] = float(np.sum(np.maximum(np.exp(la_all) - np.exp(lk_all), 0)))
        la = np.array([sum(x) for x in roll.logprobs])
        assert np.allclose(la, seq_logp(alpha, tok, [p] * n, roll.completion_ids), atol=1e-4)  # reported = trainer's
        w_k = np.exp(seq_logp(policy, tok, [p] * n, roll.completion_ids) - la)
        w_new = np.exp(seq_logp(pi_new, tok, [p] * n, roll.completion_ids) - la)
        texts = tok.batch_decode(roll.completion_ids, skip_special_tokens=True)
        r = bound.score([i] * n, texts, roll.completion_ids)
        tv = tv_estimate(w_k.reshape(-1, G))
        assert abs(tv.mean() - exact["tv"]) <= 4 * tv.std(ddof=1) / np.sqrt(tv.size), (tv.mean(), exact["tv"])
        j = {name: float(exact_j(m, [p], [bound.accepted_ids[i]], 1.0, tok.pad_token_id, token_filter=FILTER)[0])
             for name, m in (("alpha", alpha), ("k", policy), ("new", pi_new))}
        gain = improvement_estimate(r.reshape(-1, G), w_new.reshape(-1, G), w_k.reshape(-1, G))
        k_mass, new_mass = (float(np.exp(seq_logp(m, tok, [p] * len(ys), ys)).sum()) for m in (policy, pi_new))
        missed = (0.0 if bound.accepted_ids[i][0] in ys else j["new"] - j["k"]) - j["alpha"] * (k_mass - new_mass)
        want = j["new"] - j["k"] - missed
        se = gain.std(ddof=1) / np.sqrt(gain.size)
        assert abs(gain.mean() - want) <= 4 * se + 1e-12, (gain.mean(), want, se)
        full_k = np.exp(seq_logp(policy, tok, [p] * n, roll.completion_ids, NO_FILTER) - la)
        tv_full = tv_estimate(full_k.reshape(-1, G))
        assert abs(tv_full.mean() - exact["tv"]) > 8 * tv_full.std(ddof=1) / np.sqrt(tv_full.size)

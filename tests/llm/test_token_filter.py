"""Truncated sampling end to end on the built-in model (docs/theory.md, §1.1): alpha, pi_k and pi_{k+1} are the
filtered distributions of three nearby weights; completions sampled from alpha by the transformers sampler, weighed
with the trainer's filtered log-probs, give TV and improvement estimates whose values match the exact ones, computed
by enumerating every completion alpha can produce. With the full-softmax log-probs of pi (what a trainer that ignores
the sampler's filter computes) the TV estimate misses by many standard errors."""

import numpy as np
import pytest
import torch

from grpo_theory.estimators import improvement_estimate, tv_estimate
from llm.tensors.batch import make_batch
from llm.tensors.logprobs import completion_logprobs
from llm.tensors.token_filter import NO_FILTER, TokenFilter, filtered_log_softmax
from llm.evaluation import exact_j
from llm.models.model import frozen_copy, load_policy
from llm.models.tiny import tiny_model_dir
from llm.sampling import TransformersSampler
from llm.tasks import arithmetic_task
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


@pytest.mark.slow
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


# ---- ties at the boundary: the samplers' own functions on bf16 logits ----------------------------------------------

#: Filters of the ties test, each in vLLM's order (min-p, top-k, top-p). The top-p values are binary fractions, so that
#: 1 - top_p is the same number in vLLM's float32 arithmetic (ours) and in transformers' double one: at 0.9 the two
#: thresholds differ by 2.2e-8, and a row whose cumulative mass fell between them would be cut apart by the two
#: libraries themselves on some host.
TIE_FILTERS = [TokenFilter(top_p=0.875), TokenFilter(top_p=0.5), TokenFilter(top_k=20),
               TokenFilter(top_k=50, top_p=0.75), TokenFilter(min_p=0.05), TokenFilter(top_k=40, top_p=0.9375, min_p=0.02)]


def _bf16_rows(n: int = 1000, vocab: int = 8192, seed: int = 0) -> torch.Tensor:
    """Logits rounded to bfloat16 (then held in float32, as both samplers compute): ties are common."""
    g = torch.Generator().manual_seed(seed)
    return (2.5 * torch.randn(n, vocab, generator=g)).bfloat16().float()


def vllms_kept(z: torch.Tensor, f: TokenFilter) -> torch.Tensor:
    """vLLM's own functions: its min-p logits processor's ``apply`` and ``apply_top_k_top_p_pytorch`` (the CPU path)."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    z = z.clone()
    n = z.shape[0]
    if f.min_p > 0:
        proc = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
        proc.min_p_count, proc.min_p = n, torch.full((n, 1), f.min_p, dtype=torch.float32)
        z = proc.apply(z)
    k = torch.full((n,), f.top_k, dtype=torch.long) if f.top_k else None
    p = torch.full((n,), f.top_p, dtype=torch.float32) if f.top_p < 1 else None
    return torch.isfinite(apply_top_k_top_p_pytorch(z, k, p, allow_cpu_sync=True))


def transformers_kept(z: torch.Tensor, f: TokenFilter) -> torch.Tensor:
    """transformers' own warpers, in vLLM's order: MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper."""
    from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    ids = torch.zeros(z.shape[0], 1, dtype=torch.long)
    for on, warper in ((f.min_p > 0, lambda: MinPLogitsWarper(f.min_p)), (f.top_k > 0, lambda: TopKLogitsWarper(f.top_k)),
                       (f.top_p < 1, lambda: TopPLogitsWarper(f.top_p))):
        if on:
            z = warper()(ids, z)
    return torch.isfinite(z)


def column_order_kept(z: torch.Tensor, f: TokenFilter) -> torch.Tensor:
    """The rule before 2026-11-27: the same cut, ties at the top-p boundary ordered by column (a stable sort), which
    keeps as many tied tokens as the samplers but not always the same ones."""
    from llm.tensors.token_filter import _min_p

    masked = _min_p(z, f)
    if f.top_k:
        masked = masked.masked_fill(masked < masked.topk(f.top_k, dim=-1).values[..., -1:], -float("inf"))
    if f.top_p >= 1:
        return ~torch.isneginf(masked)
    srt, idx = masked.sort(dim=-1, stable=True)
    drop = srt.softmax(dim=-1).cumsum(dim=-1) <= 1 - torch.tensor(f.top_p, dtype=z.dtype)
    drop[..., -1] = False
    return ~drop.scatter(-1, idx, drop)


@pytest.mark.slow
@pytest.mark.parametrize("token_filter", TIE_FILTERS)
def test_the_kept_sets_are_vllms_and_transformers_on_bf16_logits_with_ties(token_filter):
    """1,000 rows of 8,192 bf16-rounded logits: the kept set is vLLM's own, row for row, tied tokens at the boundary
    included, whether the rows come in one batch or in chunks of 7, and transformers' warpers' too except with top-k
    and top-p together (transformers sorts the top-k-masked logits, vLLM the unmasked ones, so the two samplers order
    ties otherwise: there the same count); with top-p some rows split a tie there (where the whole tie, {z >= tau},
    would keep more tokens than the samplers), and ordering the tie by column keeps other tied tokens than the
    samplers on some rows."""
    from llm.tensors.token_filter import boundary_value, kept_mask

    z = _bf16_rows()
    ours = kept_mask(z, token_filter)
    assert torch.equal(torch.cat([kept_mask(z[s:s + 7], token_filter) for s in range(0, len(z), 7)]), ours)
    assert torch.equal(ours, vllms_kept(z, token_filter))
    theirs = transformers_kept(z, token_filter)
    if token_filter.top_k and token_filter.top_p < 1:
        assert torch.equal(ours.sum(-1), theirs.sum(-1))
    else:
        assert torch.equal(ours, theirs)
    whole_tie = z >= boundary_value(z, ours)[:, None]
    split = (whole_tie.sum(-1) > ours.sum(-1)).float().mean()
    by_column = (column_order_kept(z, token_filter) != ours).any(-1).float().mean()
    if token_filter.top_p < 1:
        assert split > 0.05 and by_column > 0.05, (split, by_column)  # the case matters: many rows split a tie
    else:
        assert split == 0 and by_column == 0  # top-k and min-p keep ties whole, as the samplers do


def test_log_probs_of_vllms_samples_equal_vllms_on_bf16_logits():
    """Tokens sampled from vLLM's filtered distribution (top-p 0.9 on bf16 rows of 2,048 logits): the trainer's
    log-probability of each (``llm.tensors.logprobs``' chunked head, the logits fed through an identity output layer; a target
    tied at the boundary counts as kept) equals vLLM's processed log-probability to float32 rounding, so log
    pi_k/alpha at lag 0 has no bias from the rule; the earlier rule's normaliser (the whole tie at the boundary) put it
    below vLLM's, on average by more than 1e-4 nats a token here."""
    from llm.tensors.logit_head import _ScaledHeadLogprobs
    from llm.tensors.token_filter import boundary_value, kept_mask
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    f = TokenFilter(top_p=0.9)
    z = _bf16_rows(400, vocab=2048)
    n = z.shape[0]
    logq = apply_top_k_top_p_pytorch(z.clone(), None, torch.full((n,), 0.9), allow_cpu_sync=True).log_softmax(dim=-1)
    y = torch.multinomial(logq.exp(), 1, generator=torch.Generator().manual_seed(1))[:, 0]
    vllm_logp = logq.gather(-1, y[:, None])[:, 0]
    got, _ = _ScaledHeadLogprobs.apply(z, torch.eye(z.shape[1]), y, 1.0, 64, False, f)
    assert torch.allclose(got, vllm_logp, atol=1e-5), (got - vllm_logp).abs().max()
    tau = boundary_value(z, kept_mask(z, f))[:, None]
    whole_tie = z.masked_fill(z < tau, -float("inf")).log_softmax(dim=-1).gather(-1, y[:, None])[:, 0]
    assert float((whole_tie - vllm_logp).mean()) < -1e-4


def test_a_target_tied_at_the_boundary_gets_the_gradient_of_a_set_that_kept_it():
    """A sampled token tied with the boundary value but outside the trainer's cut (its logits rounded otherwise than
    the sampler's): the filtered head swaps it in for a tied token of the same value, so its log-probability and its
    gradient are those of log softmax over a kept set holding it (autograd, the set held fixed), and no column keeps
    the -p term of a token the distribution does not hold."""
    from llm.tensors.logit_head import _ScaledHeadLogprobs
    from llm.tensors.token_filter import boundary_value, kept_mask, swap_in_targets

    f = TokenFilter(top_p=0.9)
    z = _bf16_rows(400, vocab=2048).double()
    keep = kept_mask(z, f)
    tau = boundary_value(z, keep)
    tied_out = (z == tau[:, None]) & ~keep
    rows = torch.nonzero(tied_out.any(-1)).squeeze(-1)
    assert rows.numel() > 20  # rows where the cut splits a tie
    y = torch.zeros(len(z), dtype=torch.long)
    y[rows] = tied_out[rows].to(torch.uint8).argmax(-1)  # a tied token the cut left out
    y[~tied_out.any(-1)] = z[~tied_out.any(-1)].argmax(-1)
    x = z.clone().requires_grad_(True)
    got, _ = _ScaledHeadLogprobs.apply(x, torch.eye(z.shape[1], dtype=torch.float64), y, 1.0, 64, False, f)
    got.sum().backward()
    swapped = keep.clone()
    on, _ = swap_in_targets(z, swapped, y)
    assert bool(on.all()) and torch.equal(swapped.sum(-1), keep.sum(-1))
    ref = z.clone().requires_grad_(True)
    want = ref.masked_fill(~swapped, -float("inf")).log_softmax(-1).gather(-1, y[:, None])[:, 0]
    want.sum().backward()
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(x.grad, ref.grad, atol=1e-12)
    assert bool((x.grad[rows].gather(-1, y[rows, None]) > 0).all())  # the drawn token's own column: 1 - p > 0

"""Memory bounded by a micro-batch and a logit chunk, with the same numbers as the unsplit step.

- The chunked log-probs (output layer on the real completion tokens, a chunk at a time) equal the model's own
  logits for every model family, with gradients; a family whose output transform is unknown is refused.
- ``optimise`` accumulating gradients over micro-batches gives the gradient, loss statistics, entropy and TV of
  the unsplit step, for every loss type, with and without the zero-variance mask, with unequal completion
  lengths, with and without gradient checkpointing.
- A whole run split into micro-batches logs the same metrics as the unsplit run.
- Passes over sequences of similar length (``group_by_length``): the cheapest grouping (brute force over every
  partition), each pass trimmed to its longest sequence with the same log-probs, and the same gradient.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from llm import GRPOConfig, train

from .helpers_exact import same
from llm.batch import length_groups, make_batch
from llm.distributed import SINGLE, shard_blocks
from llm.logprobs import Forward, LogitHead, check_head, completion_logprobs, forward_completions
from llm.model import Precision, frozen_copy, load_policy
from llm.rundir import read_metrics
from llm.tiny import FAMILIES, build_family_model, tiny_model_dir
from llm.trainer import Models, advantages, dists, optimise

#: float32 agreement of two summation orders of the same quantities (gradients, log-probs).
RTOL, ATOL = 1e-4, 1e-6
#: float64 agreement of a step split into micro-batches and the unsplit step (measured: ~1e-14).
RTOL64 = 1e-10
#: Metrics of two float32 runs: per-token log-probs differ by ~1e-6 with the batch's composition; the TV and bound
#: estimates (exp of summed log-ratios, times weights up to 100) carry that, and after one Adam step (which scales
#: near-zero gradient entries up to the learning rate) so do the weights. Measured: up to 2.4e-3 relative at
#: step 0 and 6e-3 at step 1. A wrong split (a normaliser or a statistic per micro-batch) is off by order one.
RUN_RTOL, RUN_ATOL = 1e-2, 1e-4
#: Gradients of a float64 model through shared prompts against whole sequences: transformers' RMSNorm computes its
#: variance in float32 whatever the model's dtype, so the two summation orders agree to float32 rounding (measured
#: 4e-8 to 6e-8 relative); a prompt's gradient counted once instead of G times is off by order one.
SHARED_GRAD_RTOL = 1e-6


def _sequences(tok, n: int, seed: int = 0):
    """n prompts of the arithmetic kind and random completions of unequal lengths (1 to 6 tokens)."""
    g = np.random.default_rng(seed)
    prompts = [tok(f"{a}+{b}=").input_ids for a, b in g.integers(0, 50, size=(n, 2))]
    comps = [g.integers(3, len(tok), size=int(g.integers(1, 7))).tolist() for _ in range(n)]
    return prompts, comps


def _same_gradient(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> bool:
    """Equal up to summation order: ||a - b|| <= rtol ||b|| (elementwise tests fail on entries that are sums of
    cancelling terms)."""
    return float((a - b).norm()) <= rtol * float(b.norm()) + 1e-30


def _plain_full(model, batch, temperature=1.0):
    """log softmax of the model's own logits at the completion positions, (B, T, V) (the unchunked reference)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                   use_cache=False).logits
    T, lp = batch.completion_ids.shape[1], batch.prompt_width
    return torch.log_softmax(logits[:, lp - 1: lp - 1 + T].to(torch.promote_types(logits.dtype, torch.float32))
                             / temperature, dim=-1)


def _plain_logprobs(model, batch, temperature=1.0):
    full = _plain_full(model, batch, temperature)
    logp = full.gather(-1, batch.completion_ids[..., None]).squeeze(-1) * batch.completion_mask
    entropy = -(full.exp() * full).sum(-1) * batch.completion_mask
    return logp, entropy


@pytest.mark.parametrize("family", ["builtin"] + sorted(FAMILIES))
def test_chunked_logprobs_equal_the_models_own_logits_with_gradients(family, tmp_path):
    path = tiny_model_dir() if family == "builtin" else build_family_model(family, tmp_path / family)
    model, tok = load_policy(str(path), torch.device("cpu"))
    batch = make_batch(*_sequences(tok, 5), tok.pad_token_id, "cpu")
    plain, plain_entropy = _plain_logprobs(model, batch, 0.7)
    (plain * batch.completion_mask).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    fwd = forward_completions(model, batch, 0.7, chunk_tokens=3, entropy=True)  # 3 tokens per chunk: many chunks
    fwd.logp.sum().backward()
    assert torch.allclose(fwd.logp, plain.detach(), rtol=RTOL, atol=ATOL)
    assert torch.allclose(fwd.entropy, plain_entropy.detach(), rtol=RTOL, atol=ATOL)
    for p, g in zip(model.parameters(), plain_grads):
        assert _same_gradient(p.grad, g)
    assert check_head(model, batch) <= 1e-4


def test_an_output_transform_the_chunked_path_lacks_is_refused(tmp_path, monkeypatch):
    """Gemma 2 soft-caps its logits; a LogitHead without the cap would give other log-probs, and check_head
    (run at start-up) says so instead of training on them."""
    model, tok = load_policy(str(build_family_model("gemma2", tmp_path / "g")), torch.device("cpu"))
    with torch.no_grad():  # logits of the random model are far below the cap of 30: scale them up to it
        model.get_output_embeddings().weight.mul_(300.0)
    batch = make_batch(*_sequences(tok, 3), tok.pad_token_id, "cpu")
    check_head(model, batch)
    real = LogitHead.__init__

    def without_softcap(self, *a, **kw):
        real(self, *a, **kw)
        self.softcap = None

    monkeypatch.setattr(LogitHead, "__init__", without_softcap)
    with pytest.raises(ValueError, match="Gemma2ForCausalLM's output layer"):
        check_head(model, batch)


def test_a_model_without_a_reachable_output_layer_is_refused_in_one_line():
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    model.get_output_embeddings = lambda: None
    with pytest.raises(ValueError, match="does not expose its decoder and output layer"):
        check_head(model, make_batch(*_sequences(tok, 2), tok.pad_token_id, "cpu"))


def test_no_logits_larger_than_a_chunk_exist(monkeypatch):
    """The output layer only ever sees ``chunk_tokens`` rows, in the gradient pass and in the TV diagnostics."""
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    batch = make_batch(*_sequences(tok, 6), tok.pad_token_id, "cpu")
    seen, real = [], LogitHead.logits
    monkeypatch.setattr(LogitHead, "logits", lambda self, h: seen.append(h.shape[0]) or real(self, h))
    fwd = forward_completions(model, batch, 1.0, chunk_tokens=4, keep_hidden=True)
    fwd.logp.sum().backward()
    from llm.diagnostics import chain_tv_sum
    d = dists(GRPOConfig(), Models(model, None, None, None, None, None, "cpu", Precision()), model, fwd.hidden)
    assert chain_tv_sum(d, d, batch.completion_mask, chunk_tokens=4) == 0.0
    n_tokens = int(batch.completion_mask.sum())
    assert max(seen) == 4 and sum(seen) >= 3 * n_tokens  # forward, recomputation in backward, the TV pass


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradient of every step it takes."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


CASES = [("grpo", "token", True), ("grpo", "token", False), ("grpo", "sequence", True), ("dapo", "token", True),
         ("dapo", "token", False), ("dr_grpo", "token", True), ("dr_grpo", "token", False)]


def _optimise(loss_type, ratio_level, mask, micro_batch, checkpointing=False, by_length=False, ranks=SINGLE):
    """One step of 3 prompts x G = 3 (one group with equal rewards) with alpha != pi_k, beta > 0 and i = 2, in
    float64, so that any difference between two splits above 1e-10 is an error, not rounding. ``ranks``: this
    process's share of the prompts among several (tests/test_distributed.py)."""
    torch.manual_seed(0)
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    policy.double()
    if checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.train()
    alpha, ref = frozen_copy(policy), frozen_copy(policy)
    with torch.no_grad():  # alpha and pi_ref away from pi_k (at pi_ref = pi_k the KL gradient is rounding noise)
        for p, q in zip(alpha.parameters(), ref.parameters()):
            p.add_(0.005 * torch.randn_like(p))
            q.add_(0.005 * torch.randn_like(q))
    if ranks.fsdp:  # tests/test_distributed.py: the three copies sharded as the trainer shards them
        for model in (policy, alpha, ref):
            shard_blocks(model)
    G = 3
    prompts, comps = _sequences(tok, 3 * G, seed=1)
    batch = make_batch([p for p in prompts[:3] for _ in range(G)], comps, tok.pad_token_id, "cpu")
    config = GRPOConfig(prompts_per_step=3, num_generations=G, loss_type=loss_type, ratio_level=ratio_level,
                        mask_zero_std_groups=mask, beta=0.1, num_iterations=2, epsilon=0.1, max_completion_length=6,
                        per_device_train_batch_size=micro_batch, logit_chunk_tokens=5, group_by_length=by_length,
                        tv_diagnostics=True, share_prompts=False)  # exact float64 sums (sharing: its own test)
    models = Models(policy, RecordingSGD(policy.parameters(), lr=0.5), None, alpha, ref, tok, torch.device("cpu"),
                    Precision(), ranks=ranks)
    groups = advantages(np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]), config)
    a = completion_logprobs(alpha, batch, 1.0, keep_hidden=True)
    logp_ref = completion_logprobs(ref, batch, 1.0).logp
    with torch.no_grad():  # the chain-rule TV of pi_k (the policy before the update) and alpha, from full logits
        tv = 0.5 * (_plain_full(policy, batch).exp() - _plain_full(alpha, batch).exp()).abs().sum(-1)
        chain_tv_k = float((tv * batch.completion_mask).sum(1).mean())
    out = optimise(config, models, batch, groups, a.logp, logp_ref, dists(config, models, alpha, a.hidden))
    assert math.isclose(out.chain_tv_k, chain_tv_k, rel_tol=1e-6)  # tv_rows sums in float32
    return out, models.optimizer.grads


@pytest.mark.parametrize("loss_type,ratio_level,mask", CASES)
def test_accumulated_gradient_equals_the_unsplit_step(loss_type, ratio_level, mask):
    whole, whole_grads = _optimise(loss_type, ratio_level, mask, micro_batch=0)
    assert len(whole_grads) == 2 and whole.stats.tokens > 0
    # 4 + 4 + 1 rows; one per pass; checkpointed; rows grouped by length, trimmed to each pass's longest
    for micro_batch, ckpt, by_length in ((4, False, False), (1, False, False), (4, True, False), (0, False, True),
                                         (4, False, True), (2, True, True)):
        split, split_grads = _optimise(loss_type, ratio_level, mask, micro_batch, checkpointing=ckpt,
                                       by_length=by_length)
        for step_w, step_s in zip(whole_grads, split_grads, strict=True):
            for gw, gs in zip(step_w, step_s, strict=True):
                assert _same_gradient(gs, gw, RTOL64), (micro_batch, ckpt, by_length)
        mw, ms = whole.stats.metrics(), split.stats.metrics()
        assert mw.keys() == ms.keys() and "kl" in mw
        for key in mw:
            assert math.isclose(mw[key], ms[key], rel_tol=RTOL64, abs_tol=1e-12), key
        assert math.isclose(whole.grad_norm, split.grad_norm, rel_tol=RTOL64)
        assert math.isclose(whole.chain_tv_k, split.chain_tv_k, rel_tol=RTOL64) and whole.chain_tv_k > 0
        assert torch.allclose(whole.logp_k, split.logp_k, rtol=RTOL64, atol=1e-12)
        assert torch.allclose(whole.entropy_k, split.entropy_k, rtol=RTOL64, atol=1e-12)


def test_the_cases_exercise_clipping():
    """The second inner step of the equality cases moves far enough that the clip acts (else the clip
    statistics would be compared only as zeros)."""
    out, _ = _optimise("dapo", "token", True, micro_batch=4)
    assert out.stats.metrics()["clip_ratio/region_mean"] > 0


@pytest.mark.slow
def test_a_run_in_micro_batches_logs_the_unsplit_runs_metrics(tmp_path):
    """Two steps (lag 0 and lag 1), held-out prompts, KL, TV and in-sample diagnostics: every logged number of a run
    in micro-batches of 5 completions and logit chunks of 7 tokens equals the unsplit run's."""
    kw = dict(sampler="transformers", progress=False, max_steps=2, sync_period=2, heldout_prompts=2, prompts_per_step=4,
              num_generations=4, num_iterations=2, beta=0.04, seed=3, logging_steps=1000, tv_diagnostics=True,
              insample_diagnostics=True)
    whole = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "whole"), **kw), log=lambda *a: None))
    split = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "split"), per_device_train_batch_size=5,
                                          logit_chunk_tokens=7, **kw), log=lambda *a: None))
    for rw, rs in zip(whole, split, strict=True):
        keys = [k for k in rw if not k.startswith("time/")]
        assert keys == [k for k in rs if not k.startswith("time/")]
        assert "tv/pi_k_alpha_chain_ub_est" in keys and "insample/tv/pi_new_alpha_chain_ub_est" in keys
        for k in keys:
            assert same(rw[k], rs[k], RUN_RTOL, RUN_ATOL), (rw["step"], k, rw[k], rs[k])
    assert split[1]["tv/pi_k_alpha_chain_ub_est"] > 0


def _partitions(items):
    """Every partition of ``items`` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield part[:i] + [[first, *part[i]]] + part[i + 1:]


def _padded_cost(groups, lengths, overhead):
    return sum(len(g) * max(lengths[i] for i in g) + overhead for g in groups)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=7), st.integers(0, 7), st.sampled_from([0, 0.25, 1, 2, 9]))
@example([5, 5, 5, 5], 0, 0).via("equal lengths: one pass")
@example([1, 40, 1, 40, 1], 2, 100).via("the row cap binds over a huge per-pass cost")
def test_length_groups_are_the_cheapest_grouping(lengths, max_rows, overhead_rows):
    """Every row in exactly one pass, no pass above ``max_rows`` rows, and no partition of the rows (not only
    contiguous runs of the sorted lengths) pads fewer positions plus a pass's cost (``overhead_rows`` x the longest
    length) per pass."""
    groups = length_groups(lengths, max_rows, overhead_rows)
    overhead = overhead_rows * max(lengths)
    assert sorted(int(i) for g in groups for i in g) == list(range(len(lengths)))
    cap = max_rows or len(lengths)
    assert all(1 <= len(g) <= cap for g in groups)
    best = min(_padded_cost(p, lengths, overhead) for p in _partitions(list(range(len(lengths))))
               if all(len(g) <= cap for g in p))
    assert _padded_cost([list(g) for g in groups], lengths, overhead) == best


def test_passes_by_length_pad_fewer_positions_with_the_same_logprobs():
    """Sequences of unequal prompt and completion lengths (float64 model): each pass of ``Batch.passes`` trimmed by
    ``Batch.take`` holds fewer positions than the rectangle, and its log-probs, entropies and hidden states, put back
    by ``Forward.assemble``, are the whole batch's."""
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    model.double()
    prompts = [tok(f"{i}+{i}=" if i < 4 else f"{i}+{10 * i}=").input_ids for i in range(12)]  # 4, 6 or 7 tokens
    g = np.random.default_rng(4)
    comps = [g.integers(3, len(tok), size=n).tolist() for n in (1, 2, 2, 3, 20, 21, 22, 22, 40, 41, 41, 42)]
    batch = make_batch(prompts, comps, tok.pad_token_id, "cpu")
    with torch.no_grad():  # the rectangle in one pass
        whole = forward_completions(model, batch, 0.7, entropy=True, keep_hidden=True)
    rows = batch.passes(0, by_length=True)
    parts = [batch.take(r) for r in rows]
    assert len(parts) > 1 and sum(p.input_ids.numel() for p in parts) < batch.input_ids.numel()
    assert any(p.prompt_width < batch.prompt_width for p in parts)  # left padding trimmed too
    for r, p in zip(rows, parts):
        assert torch.equal(p.completion_mask.sum(1), batch.completion_mask[r].sum(1))
    with torch.no_grad():
        grouped = Forward.assemble(batch, rows, [forward_completions(model, p, 0.7, entropy=True, keep_hidden=True)
                                                 for p in parts])
    assert torch.allclose(grouped.logp, whole.logp, rtol=RTOL64, atol=1e-12)
    assert torch.allclose(grouped.entropy, whole.entropy, rtol=RTOL64, atol=1e-12)
    m = batch.completion_mask[..., None] > 0
    assert torch.allclose(grouped.hidden * m, whole.hidden * m, rtol=RTOL64, atol=1e-12)
    same = completion_logprobs(model, batch, 0.7, micro_batch=5, by_length=True)
    assert torch.allclose(same.logp, whole.logp, rtol=RTOL64, atol=1e-12)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_attention_kernel_asked_for_is_used_and_gives_the_same_logprobs(attn):
    """--attn-implementation reaches the model, and both kernels give the same log-probs and gradients (float32
    rounding), so the choice is one of speed and memory only."""
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"), attn_implementation=attn)
    assert model.config._attn_implementation == attn
    ref, _ = load_policy(str(tiny_model_dir()), torch.device("cpu"), attn_implementation="sdpa" if attn == "eager"
                         else "eager")
    batch = make_batch(*_sequences(tok, 6), tok.pad_token_id, "cpu")
    a, b = forward_completions(model, batch, 1.0), forward_completions(ref, batch, 1.0)
    assert torch.allclose(a.logp, b.logp, rtol=RTOL, atol=1e-5)
    a.logp.sum().backward()
    b.logp.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert _same_gradient(p.grad, q.grad, 1e-3)


@pytest.mark.parametrize("family", ["builtin"] + sorted(FAMILIES))
def test_a_groups_prompt_runs_once_with_the_same_logprobs_and_gradients(family, tmp_path):
    """Sequences that share a prompt (a group's completions): each distinct prompt runs through the decoder once and
    its completions on its cached keys and values (``llm.logprobs.completion_hidden``). In float64, for every family,
    log-probs, entropies and hidden states equal the plain pass over every whole sequence to 1e-10, gradients to
    ``SHARED_GRAD_RTOL``."""
    from llm.logprobs import shared_prompts

    path = tiny_model_dir() if family == "builtin" else build_family_model(family, tmp_path / family)
    model, tok = load_policy(str(path), torch.device("cpu"))
    model.double()
    g = np.random.default_rng(1)
    prompts = [tok("+".join(map(str, g.integers(0, 99, size=k))) + "=").input_ids for k in (3, 5, 4)]  # unequal
    comps = [g.integers(3, len(tok), size=int(g.integers(1, 9))).tolist() for _ in range(12)]
    batch = make_batch([prompts[j // 4] for j in range(12)], comps, tok.pad_token_id, "cpu")
    first, inverse = shared_prompts(batch)
    assert len(first) == 3 and inverse.tolist() == [int(inverse[4 * i]) for i in range(3) for _ in range(4)]
    results = []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        fwd = forward_completions(model, batch, 0.7, entropy=True, keep_hidden=True, share_prompts=share)
        (fwd.logp * torch.linspace(0.5, 1.5, 12, dtype=torch.float64)[:, None]).sum().backward()
        results.append((fwd, [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (shared, shared_grads) = results
    m = batch.completion_mask > 0
    assert torch.allclose(shared.logp, plain.logp, rtol=RTOL64, atol=1e-12)
    assert torch.allclose(shared.entropy, plain.entropy, rtol=RTOL64, atol=1e-12)
    assert torch.allclose(shared.hidden[m], plain.hidden[m], rtol=RTOL64, atol=1e-12)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert _same_gradient(a, b, SHARED_GRAD_RTOL)

"""llm.tensors.logprobs: log-probs without full-vocabulary tensors, equal to the model's own for every family, with gradients;
shared prompts; output transforms it does not know are refused."""

import numpy as np
import pytest
import torch

from grpo_theory.truncation import filtered_log_softmax
from grpo_theory.truncation import kept_mask as gt_kept_mask
from llm.tensors.batch import make_batch
from llm.tensors.logit_head import LogitHead
from llm.tensors.logprobs import check_head, forward_completions
from llm.tensors.passes import Passes
from llm.tensors.token_filter import NO_FILTER, OFF_SET_LOGP, TokenFilter, kept_mask
from llm.tensors.token_filter import filtered_log_softmax as torch_filtered_log_softmax
from llm.models.model import compile_blocks, load_policy
from llm.models.tiny import FAMILIES, build_family_model, tiny_model_dir
from tests.helpers import ATOL, RTOL, RTOL64, SHARED_GRAD_RTOL, plain_logprobs, same_gradient, sequences


@pytest.mark.parametrize("family", ["builtin"] + sorted(FAMILIES))
def test_chunked_logprobs_equal_the_models_own_logits_with_gradients(family, tmp_path):
    path = tiny_model_dir() if family == "builtin" else build_family_model(family, tmp_path / family)
    model, tok = load_policy(str(path), torch.device("cpu"))
    batch = make_batch(*sequences(tok, 5), tok.pad_token_id, "cpu")
    plain, plain_entropy = plain_logprobs(model, batch, 0.7)
    (plain * batch.completion_mask).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    fwd = forward_completions(model, batch, 0.7, chunk_tokens=3, entropy=True)  # 3 tokens per chunk: many chunks
    fwd.logp.sum().backward()
    assert torch.allclose(fwd.logp, plain.detach(), rtol=RTOL, atol=ATOL)
    assert torch.allclose(fwd.entropy, plain_entropy.detach(), rtol=RTOL, atol=ATOL)
    for p, g in zip(model.parameters(), plain_grads):
        assert same_gradient(p.grad, g)
    assert check_head(model, batch) <= 1e-4


def test_an_output_transform_the_chunked_path_lacks_is_refused(tmp_path, monkeypatch):
    """Gemma 2 soft-caps its logits; a LogitHead without the cap would give other log-probs, and check_head
    (run at start-up) says so instead of training on them."""
    model, tok = load_policy(str(build_family_model("gemma2", tmp_path / "g")), torch.device("cpu"))
    with torch.no_grad():  # logits of the random model are far below the cap of 30: scale them up to it
        model.get_output_embeddings().weight.mul_(300.0)
    batch = make_batch(*sequences(tok, 3), tok.pad_token_id, "cpu")
    check_head(model, batch)
    real = LogitHead.__init__

    def without_softcap(self, *a, **kw):
        real(self, *a, **kw)
        self.softcap = None

    monkeypatch.setattr(LogitHead, "__init__", without_softcap)
    for temperature in (1.0, 0.01):  # the tolerance widened for a low temperature still finds the missing cap
        with pytest.raises(ValueError, match="Gemma2ForCausalLM's output layer"):
            check_head(model, batch, temperature)


def test_the_start_up_checks_read_rounding_at_a_low_temperature_as_rounding():
    """At temperature 0.01 the logits' float32 rounding is multiplied by 100 in the log-probs: the built-in agent
    model's chunked and plain paths differed there by 2.4e-4 on an AVX-512 host and the run refused to start. The
    tolerance is divided by the temperature; the gap itself is still of rounding's size (1e-4 times 1/T)."""
    from llm.tensors.logit_head import HEAD_CHECK_TOLERANCE, head_tolerance
    from llm.models.tiny import agent_model_dir

    assert head_tolerance(1.0) == head_tolerance(3.0) == HEAD_CHECK_TOLERANCE
    assert head_tolerance(0.01) == pytest.approx(100 * HEAD_CHECK_TOLERANCE)
    model, tok = load_policy(str(agent_model_dir()), torch.device("cpu"))
    batch = make_batch(*sequences(tok, 5), tok.pad_token_id, "cpu")
    assert check_head(model, batch, 0.01) <= head_tolerance(0.01)


def test_a_model_without_a_reachable_output_layer_is_refused_in_one_line():
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    model.get_output_embeddings = lambda: None
    with pytest.raises(ValueError, match="does not expose its decoder and output layer"):
        check_head(model, make_batch(*sequences(tok, 2), tok.pad_token_id, "cpu"))


def test_no_logits_larger_than_a_chunk_exist(monkeypatch):
    """The output layer only ever sees ``chunk_tokens`` rows, in the gradient pass and in the TV diagnostics."""
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    batch = make_batch(*sequences(tok, 6), tok.pad_token_id, "cpu")
    import llm.tensors.logit_head as lp

    seen, real, wide = [], LogitHead.logits, lp._wide_logits
    monkeypatch.setattr(LogitHead, "logits", lambda self, h: seen.append(h.shape[0]) or real(self, h))
    monkeypatch.setattr(lp, "_wide_logits", lambda h, *a: seen.append(h.shape[0]) or wide(h, *a))  # the scaled head
    fwd = forward_completions(model, batch, 1.0, chunk_tokens=4, keep_hidden=True)
    fwd.logp.sum().backward()
    from llm.tensors.diagnostics import chain_tv_sum
    d = Passes(1.0).dists(model, fwd.hidden)
    assert chain_tv_sum(d, d, batch.completion_mask, chunk_tokens=4) == 0.0
    n_tokens = int(batch.completion_mask.sum())
    assert max(seen) == 4 and sum(seen) >= 3 * n_tokens  # forward, recomputation in backward, the TV pass


@pytest.mark.parametrize("family", ["builtin"] + sorted(FAMILIES))
def test_a_groups_prompt_runs_once_with_the_same_logprobs_and_gradients(family, tmp_path):
    """Sequences that share a prompt (a group's completions): each distinct prompt runs through the decoder once and
    its completions on its cached keys and values (``llm.tensors.logprobs.completion_hidden``). In float64, for every family,
    log-probs, entropies and hidden states equal the plain pass over every whole sequence to 1e-10, gradients to
    ``SHARED_GRAD_RTOL``."""
    from llm.tensors.logprobs import shared_prompts

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
        assert same_gradient(a, b, SHARED_GRAD_RTOL)


def _head(V: int, H: int, dtype: torch.dtype, temperature: float, token_filter: TokenFilter = NO_FILTER) -> LogitHead:
    """A bare output layer (seeded) as the trainer's head sees a model."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(H, V, bias=False).to(dtype)

    class Model(torch.nn.Module):
        config = type("Config", (), {})()

        def __init__(self):
            super().__init__()
            self.out = layer

        def get_output_embeddings(self):
            return self.out

    return LogitHead(Model(), temperature, token_filter)


def _grads(head: LogitHead, hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, rows: int,
           plain: bool, autocast: bool = False, entropy_weights: torch.Tensor | None = None):
    """log-probs, entropies and the gradients of sum w log p (+ sum u H with ``entropy_weights`` u: an entropy
    bonus) with respect to hidden and the output layer, through the scaled head (``token_logprobs``) or autograd
    through the plain head (``plain``)."""
    from torch.utils.checkpoint import checkpoint

    from llm.tensors.logit_head import _token_stats, token_logprobs

    head.layer.weight.grad = None
    h = hidden.clone().requires_grad_()
    grad_h = entropy_weights is not None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if plain:
            parts = [checkpoint(_token_stats, head, h[s:s + rows], targets[s:s + rows], True, grad_h,
                                use_reentrant=False) for s in range(0, h.shape[0], rows)]
            logp, ent = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        else:
            logp, ent = token_logprobs(head, h, targets, rows, entropy=True, entropy_grad=grad_h)
    objective = (logp * weights.to(logp.dtype)).sum()
    if grad_h:
        objective = objective + (ent * entropy_weights.to(ent.dtype)).sum()
    objective.backward()
    return logp.detach(), ent.detach(), h.grad, head.layer.weight.grad.clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1000, 70])  # one chunk (probabilities kept), several (recomputed)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_scaled_head_equals_autograd_through_the_plain_head(dtype, rows, temperature):
    head = _head(3000, 48, dtype, temperature)
    hidden, targets = torch.randn(300, 48, dtype=dtype), torch.randint(0, 3000, (300,))
    weights = torch.randn(300, dtype=torch.float64)
    got, want = (_grads(head, hidden, targets, weights, rows, plain) for plain in (False, True))
    rtol = RTOL64 if dtype == torch.float64 else RTOL
    for a, b in zip(got, want, strict=True):
        assert same_gradient(a, b, rtol)


@pytest.mark.slow
@pytest.mark.parametrize("token_filter", [TokenFilter(top_p=0.5), TokenFilter(top_k=40),
                                          TokenFilter(top_k=200, top_p=0.9, min_p=0.01)])
@pytest.mark.parametrize("rows", [1000, 70])
@pytest.mark.parametrize("bonus", [False, True])
def test_the_filtered_scaled_head_equals_autograd_through_the_filtered_plain_head(token_filter, rows, bonus):
    """top-k, top-p, min-p in the head with its own backward: the log-probs of the filtered distribution (targets off
    the kept set at OFF_SET_LOGP, with no gradient), its entropies and, with an entropy bonus, the entropy's gradient,
    equal to autograd through log_softmax of the masked logits, in float64."""
    head = _head(3000, 48, torch.float64, 0.7, token_filter)
    g = torch.Generator().manual_seed(1)
    hidden, targets = 3 * torch.randn(300, 48, dtype=torch.float64, generator=g), torch.randint(0, 3000, (300,))
    weights, bonus_w = torch.randn(300, dtype=torch.float64), torch.randn(300, dtype=torch.float64)
    got, want = (_grads(head, hidden, targets, weights, rows, plain, entropy_weights=bonus_w if bonus else None)
                 for plain in (False, True))
    off = got[0] == OFF_SET_LOGP
    assert 0 < int(off.sum()) < 300  # both kinds of target are exercised
    for a, b in zip(got, want, strict=True):
        assert same_gradient(a, b, RTOL64)


@pytest.mark.parametrize("seed", range(3))
def test_the_torch_filter_keeps_grpo_theorys_set(seed):
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(50, 300, dtype=torch.float64, generator=g)
    for f in (TokenFilter(top_p=0.7), TokenFilter(top_k=7), TokenFilter(min_p=0.1), TokenFilter(5, 0.9, 0.05)):
        assert torch.equal(torch.from_numpy(gt_kept_mask(z.numpy(), f)), kept_mask(z, f))  # no ties: any order
        want = torch.from_numpy(filtered_log_softmax(z.numpy(), f)).clamp(min=OFF_SET_LOGP)
        assert torch.allclose(torch_filtered_log_softmax(z, f), want, rtol=1e-12, atol=1e-12)


def test_the_scaled_head_under_bf16_autocast_is_as_accurate_as_autograd():
    """Against a float64 reference: the log-probs and the hidden states' gradient as accurate as autograd's through
    the plain head (the same bf16 matmuls), the output layer's gradient more (its chunks summed in float32)."""
    head, head64 = _head(3000, 48, torch.float32, 1.0), _head(3000, 48, torch.float64, 1.0)
    hidden, targets = torch.randn(2000, 48), torch.randint(0, 3000, (2000,))
    weights = torch.randn(2000, dtype=torch.float64)
    ref = _grads(head64, hidden.double(), targets, weights, 70, plain=False)
    err = {plain: [float((a.double() - r).norm() / r.norm()) for a, r in
                   zip(_grads(head, hidden, targets, weights, 70, plain, autocast=True), ref, strict=True)]
           for plain in (False, True)}
    new, old = err[False], err[True]
    assert max(new) < 1e-2  # bf16 rounding
    assert new[0] <= 1.01 * old[0] and new[2] <= 1.01 * old[2] and new[3] <= old[3], (new, old)


def test_per_token_divergences_are_exact_across_an_update():
    """``Passes.frozen_dists`` keeps pi_k's output layer: after the weights move (output layer included), the per-token
    TV and KL(pi_k || pi_new) at every completion position equal those of the two models' own full logits, and are 0
    off the completions."""
    from tests.helpers import plain_full

    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    batch = make_batch(*sequences(tok, 6), tok.pad_token_id, "cpu")
    passes = Passes(0.7, chunk_tokens=3)
    before = passes.logprobs(model, batch, keep_hidden=True)
    dists_k = passes.frozen_dists(model, before.hidden)
    full_k = plain_full(model, batch, 0.7).detach()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = passes.logprobs(model, batch, keep_hidden=True)
    tv, kl = passes.token_divergences(dists_k, passes.dists(model, after.hidden), batch.completion_mask)
    full_new = plain_full(model, batch, 0.7).detach()
    on = batch.completion_mask.bool()
    want_tv = 0.5 * (full_k.exp() - full_new.exp()).abs().sum(-1)
    want_kl = (full_k.exp() * (full_k - full_new)).sum(-1)
    assert np.allclose(tv[on.numpy()], want_tv[on].double().numpy(), atol=1e-5)
    assert np.allclose(kl[on.numpy()], want_kl[on].double().numpy(), atol=1e-5)
    assert tv[~on.numpy()].sum() == 0 and kl[~on.numpy()].sum() == 0 and tv[on.numpy()].min() > 0


def test_the_sync_check_reads_rounding_at_a_low_temperature_as_rounding():
    """A synced sampler at temperature 0.01 differed from the trainer by 7.2e-4 nats on the built-in agent model (the
    float32 tolerance is 1e-3); the check's tolerance is divided by the temperature as the start-up check's is, and
    a stale engine (off by a nat or more at temperature 1, a hundred at 0.01) is still told apart."""
    from llm.tensors.sync_probe import SYNC_CHECKS, sync_check
    from llm.step.monitors import Warnings

    assert sync_check("float32", 1.0) == SYNC_CHECKS["float32"] == sync_check("float32", 2.0)
    assert sync_check("float32", 0.01).tolerance == pytest.approx(0.1)
    assert sync_check("bfloat16", 0.5).floor_factor == SYNC_CHECKS["bfloat16"].floor_factor
    for temperature, gap, warned in ((1.0, 2e-3, True), (0.01, 2e-3, False), (0.01, 50.0, True)):
        said = []
        Warnings("float32", temperature).see({"step": 0, "sampling/logp_diff_max": gap}, True, said.append)
        assert bool(said) == warned, (temperature, gap, said)

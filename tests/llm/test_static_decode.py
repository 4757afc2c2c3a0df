"""The static-cache decode loop (``llm.sampling.static_decode``, ``--cache-implementation static``) against
transformers' own ``generate`` with a static cache and the transformers sampler's logits processor: the same draws and
log alpha from the same stream, and what each reads back from the device per token, counted op by op (the step run
eagerly, so every aten op of the model's forward is seen; compiled, ``fullgraph=True`` refuses a host read outright,
which ``tests/llm/test_generation_paths.py`` exercises)."""

import pytest
import torch

from fixtures.static_decode import HostReads, generate_static
from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from llm.sampling.static_decode import CHECK_EVERY, Draw, StaticDecoder, inverse_cdf
from llm.tensors.token_filter import TokenFilter


@pytest.fixture(scope="module")
def setup():
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    prompts = [tok(f"{a}+{b}=").input_ids for a, b in [(12, 3), (5, 7), (19, 9), (3, 0)]]
    width = 8
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return model, tok, ids, mask


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("token_filter", [TokenFilter(), TokenFilter(top_k=8, top_p=0.95)])
def test_the_loop_draws_what_generate_with_a_static_cache_draws(setup, greedy, token_filter):
    """Same prompts, seed, temperature and kept set: the same tokens (padding after EOS) and log alpha within 1e-5,
    over calls that stop early (the model's EOS) and calls that run their 24 steps (an EOS never drawn)."""
    model, tok, ids, mask = setup
    decoder = StaticDecoder(model, compile=False)
    for eos in (tok.eos_token_id, model.config.vocab_size - 1):
        for seed in (0, 1, 2):
            want, want_lp = generate_static(model, ids, mask, 24, 1.3, eos, tok.pad_token_id, seed, token_filter, greedy)
            got, got_lp = decoder(ids, mask, 24, Draw(1.3, token_filter, greedy, eos, tok.pad_token_id),
                                  torch.Generator().manual_seed(seed))
            steps = want.shape[1]
            assert got.shape[1] >= steps and (got[:, steps:] == tok.pad_token_id).all()
            assert torch.equal(got[:, :steps], want)
            live = torch.cat([torch.ones_like(want[:, :1], dtype=torch.bool), want[:, :-1] != eos], dim=1)
            assert torch.where(live, (got_lp[:, :steps] - want_lp).abs(), 0.0).max() < 1e-5


def test_the_loop_reads_the_device_once_every_check_every_steps_and_generate_every_step(setup):
    """40 steps with an EOS never drawn: the loop reads back once per ``CHECK_EVERY`` steps plus the prefill's mask
    check; ``generate`` with a static cache reads back at least once per step (its stopping criteria), which is what
    keeps a GPU waiting on the host in its loop."""
    model, tok, ids, mask = setup
    eos, steps = model.config.vocab_size - 1, 40
    decoder = StaticDecoder(model, compile=False)
    with HostReads() as ours:
        got, _ = decoder(ids, mask, steps, Draw(1.5, eos=eos, pad=tok.pad_token_id), torch.Generator().manual_seed(0))
    assert got.shape[1] == steps and decoder.host_reads == (steps - 1) // CHECK_EVERY
    assert ours.count <= 2 + steps // CHECK_EVERY, ours.ops
    with HostReads() as theirs:
        want, _ = generate_static(model, ids, mask, steps, 1.5, eos, tok.pad_token_id, 0)
    assert want.shape[1] == steps and theirs.count >= steps, theirs.ops
    assert torch.equal(got, want)


def test_the_loop_stops_at_the_first_check_after_every_row_finished(setup):
    """Rows that all end early: the call returns at the next check, not after ``max_tokens`` steps, and each row is
    padding after its EOS."""
    model, tok, ids, mask = setup
    decoder = StaticDecoder(model, compile=False, check_every=4)
    got, lp = decoder(ids, mask, 64, Draw(1.0, greedy=True, eos=tok.eos_token_id, pad=tok.pad_token_id))
    assert got.shape[1] < 64 and got.shape[1] % 4 == 0
    for row, row_lp in zip(got.tolist(), lp.tolist()):
        end = row.index(tok.eos_token_id)
        assert all(t == tok.pad_token_id for t in row[end + 1:]) and all(x == 0.0 for x in row_lp[end + 1:])
    with pytest.raises(ValueError, match="check_every must be at least 1"):
        StaticDecoder(model, check_every=0)


def test_the_inverse_cdf_never_draws_a_token_of_probability_zero():
    """u = 0 and u just under 1 on rows with zeros at both ends: the first and last tokens of positive mass."""
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    logp = p.log()
    assert inverse_cdf(logp, torch.tensor([0.0, 0.0], dtype=torch.float64)).tolist() == [1, 2]
    assert inverse_cdf(logp, torch.tensor([1 - 1e-12, 1 - 1e-12], dtype=torch.float64)).tolist() == [3, 2]
    assert inverse_cdf(logp, torch.tensor([0.49, 0.51], dtype=torch.float64)).tolist() == [1, 2]


def test_prompt_widths_in_one_bucket_share_one_compiled_step(setup):
    """Each shape of the compiled step is a compilation of its own (seconds on a CPU, a CUDA graph on a GPU), and an
    agent's later turns are prompts of a new width at every call. Widths 8, 11 and 13 are left-padded to one bucket
    of 32: one shape, one graph, and the same tokens and log alpha as the unbucketed loop."""
    from torch._dynamo.utils import counters

    model, tok, ids, mask = setup
    draw = Draw(1.3, eos=tok.eos_token_id, pad=tok.pad_token_id)
    bucketed, plain = StaticDecoder(model), StaticDecoder(model, compile=False, width_bucket=1)
    graphs = counters["stats"]["unique_graphs"]
    for extra in (0, 3, 5):
        wide_ids = torch.cat([ids.new_full((len(ids), extra), tok.pad_token_id), ids], dim=1)
        wide_mask = torch.cat([mask.new_zeros(len(ids), extra), mask], dim=1)
        got, got_lp = bucketed(wide_ids, wide_mask, 12, draw, torch.Generator().manual_seed(extra))
        want, want_lp = plain(wide_ids, wide_mask, 12, draw, torch.Generator().manual_seed(extra))
        assert torch.equal(got, want) and (got_lp - want_lp).abs().max() < 1e-5
    assert bucketed.shapes == {(len(ids), 32 + 12)} and plain.shapes == {(len(ids), w + 12) for w in (8, 11, 13)}
    assert counters["stats"]["unique_graphs"] - graphs == 1
    with pytest.raises(ValueError, match="width_bucket must be at least 1"):
        StaticDecoder(model, width_bucket=0)

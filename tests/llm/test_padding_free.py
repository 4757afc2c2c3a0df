"""--padding-free: each pass's sequences packed into one row without padding, position ids restarting per sequence
(``llm.tensors.logprobs.packed_completion_hidden``). The packed pass gives the padded pass's log-probs, entropies,
hidden states and gradients for every model family of the suite, an optimiser step on it gives the padded step's
gradient and statistics, and a model whose attention lets packed sequences see each other is refused at start-up."""

import math

import numpy as np
import pytest
import torch

from llm import GRPOConfig, train
from llm.tensors import logprobs
from llm.tensors.batch import make_batch
from llm.tensors.logprobs import check_packing, forward_completions, pack_rows
from llm.models.model import load_policy
from llm.models.tiny import FAMILIES, build_family_model, tiny_model_dir
from llm.run.rundir import read_metrics
from tests.helpers import CASES, LEARNING_MARGIN, RTOL64, SHARED_GRAD_RTOL, optimise_case, same_gradient


def _ragged_batch(tok, rng):
    """Six sequences: prompts of 2-5 numbers, completions of 1-8 tokens (one of a single token)."""
    prompts = [tok("+".join(map(str, rng.integers(0, 99, size=k))) + "=").input_ids for k in (2, 5, 3, 4, 2, 3)]
    comps = [rng.integers(3, len(tok), size=n).tolist() for n in (4, 1, 8, 6, 3, 7)]
    return make_batch(prompts, comps, tok.pad_token_id, "cpu")


@pytest.mark.parametrize("family", ["builtin"] + sorted(FAMILIES))
@pytest.mark.parametrize("row_tokens", [1024, 12])
def test_the_packed_pass_equals_the_padded_pass_for_every_family(family, row_tokens, tmp_path, monkeypatch):
    """In float64: log-probs, entropies and hidden states of the packed pass equal the padded pass's to 1e-10,
    gradients to ``SHARED_GRAD_RTOL`` (Gemma's own float32 constants differ at 1e-7 between any two layouts,
    each sequence alone included); in one row, and in rows of about 12 tokens with filler (sdpa's rows)."""
    monkeypatch.setattr(logprobs, "PACK_ROW_TOKENS", row_tokens)
    path = tiny_model_dir() if family == "builtin" else build_family_model(family, tmp_path / family)
    model, tok = load_policy(str(path), torch.device("cpu"))
    model.double()
    batch = _ragged_batch(tok, np.random.default_rng(2))
    weights = torch.linspace(0.5, 1.5, batch.size, dtype=torch.float64)[:, None]
    results = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        fwd = forward_completions(model, batch, 0.7, entropy=True, keep_hidden=True, share_prompts=False,
                                  packed=packed)
        (fwd.logp * weights).sum().backward()
        results.append((fwd, [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (packed, packed_grads) = results
    m = batch.completion_mask > 0
    assert torch.allclose(packed.logp, plain.logp, rtol=RTOL64, atol=1e-12)
    assert torch.allclose(packed.entropy, plain.entropy, rtol=RTOL64, atol=1e-12)
    assert torch.allclose(packed.hidden[m], plain.hidden[m], rtol=RTOL64, atol=1e-12)
    assert not packed.logp[~m].any() and not packed.hidden[~m].any()
    for a, b in zip(packed_grads, plain_grads, strict=True):
        assert same_gradient(a, b, SHARED_GRAD_RTOL)
    assert check_packing(model, batch) <= 1e-10


def test_the_packed_row_restarts_positions_and_keeps_no_padding(monkeypatch):
    """What the decoder receives: one row of the real tokens only, positions 0.. for each sequence in turn, and no
    attention mask (transformers reads the packing from the positions)."""
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    batch = _ragged_batch(tok, np.random.default_rng(3))
    decoder, seen = model.get_decoder(), {}
    forward = decoder.forward

    def spy(*args, **kw):
        seen.update(kw)
        return forward(*args, **kw)

    monkeypatch.setattr(decoder, "forward", spy)
    forward_completions(model, batch, 1.0, packed=True)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    assert seen["input_ids"].shape == (1, sum(lengths)) and seen.get("attention_mask") is None
    assert seen["position_ids"][0].tolist() == [i for n in lengths for i in range(n)]
    assert seen["input_ids"][0].tolist() == batch.input_ids[batch.attention_mask > 0].tolist()


def test_rows_of_the_dense_mask_fallback_hold_every_sequence_once_and_are_balanced(monkeypatch):
    """sdpa's packed rows: every sequence once, in batch order within a row, rows of at least the longest sequence,
    their widths within the longest sequence of each other; what the decoder receives: each sequence's tokens and
    positions 0.. contiguous in its row, the rest of a row a filler sequence counting from 0."""
    lengths = [5, 17, 3, 9, 9, 1, 12, 4]
    rows = pack_rows(lengths, 20)
    assert sorted(i for r in rows for i in r) == list(range(8)) and all(r == sorted(r) for r in rows)
    loads = [sum(lengths[i] for i in r) for r in rows]
    assert len(rows) == 3 and max(loads) - min(loads) <= max(lengths)
    assert len(pack_rows(lengths, 1)) == 4 and pack_rows(lengths, 10**6) == [list(range(8))]  # rows >= 17 tokens

    monkeypatch.setattr(logprobs, "PACK_ROW_TOKENS", 12)
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    batch = _ragged_batch(tok, np.random.default_rng(5))
    decoder, seen = model.get_decoder(), {}
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **kw: seen.update(kw) or forward(*a, **kw))
    forward_completions(model, batch, 1.0, packed=True)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    ids, pos = seen["input_ids"], seen["position_ids"]
    assert seen.get("attention_mask") is None
    rows = pack_rows(lengths, 12)
    assert ids.shape[0] == len(rows) > 1
    for r, members in enumerate(rows):
        col = 0
        for i in members:
            real = batch.attention_mask[i] > 0
            assert ids[r, col:col + lengths[i]].tolist() == batch.input_ids[i][real].tolist()
            assert pos[r, col:col + lengths[i]].tolist() == list(range(lengths[i]))
            col += lengths[i]
        assert pos[r, col:].tolist() == list(range(ids.shape[1] - col))


@pytest.mark.slow
@pytest.mark.parametrize("loss_type,ratio_level,mask", CASES[:4])
def test_a_packed_optimiser_step_equals_the_padded_step(loss_type, ratio_level, mask):
    """``optimise`` over packed passes (in micro-batches of 4 and in one pass): the two inner steps' gradients, the
    loss statistics, the gradient norm and the chain-rule TV of the padded step, in float64."""
    padded, padded_grads = optimise_case(loss_type, ratio_level, mask, micro_batch=0)
    for micro_batch in (0, 4):
        packed, packed_grads = optimise_case(loss_type, ratio_level, mask, micro_batch, padding_free=True)
        for step_p, step_q in zip(padded_grads, packed_grads, strict=True):
            for a, b in zip(step_p, step_q, strict=True):
                assert same_gradient(b, a, RTOL64), micro_batch
        mp, mq = padded.stats.metrics(), packed.stats.metrics()
        assert mp.keys() == mq.keys()
        for key in mp:
            assert math.isclose(mp[key], mq[key], rel_tol=RTOL64, abs_tol=1e-12), key
        assert math.isclose(padded.grad_norm, packed.grad_norm, rel_tol=RTOL64)
        assert math.isclose(padded.chain_tv_k, packed.chain_tv_k, rel_tol=RTOL64)


def test_padding_free_turns_prompt_sharing_off():
    assert GRPOConfig().machine.prompts_shared
    assert not GRPOConfig(padding_free=True).machine.prompts_shared


def test_an_attention_that_lets_packed_sequences_meet_is_refused_at_start_up(tmp_path, monkeypatch):
    """Simulated by transformers never seeing the packing (every row one sequence): the run stops before step 0 with
    one line naming the architecture and the attention."""
    import transformers.masking_utils as mu

    monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)
    config = GRPOConfig(sampler="transformers", padding_free=True, output_dir=str(tmp_path / "run"), progress=False,
                        max_steps=1)
    with pytest.raises(ValueError, match=r"padding_free: Qwen2ForCausalLM with attention sdpa does not keep sequences "
                                         r"packed into one row apart"):
        train(config, log=lambda *a: None)


@pytest.mark.slow
def test_the_builtin_task_learns_with_both_speed_paths(tmp_path):
    """40 steps at v = 4 with --padding-free and --use-transformers-continuous-batching together: the exact J over
    the training prompts rises by the learning margin (measured, seed 0, 2-core AVX2 host: +0.071 at 40 steps, +0.091 at
    50, +0.122 at 80; +0.076 at 40 with the manager's passes cut to 512 tokens on a CPU), and every window's sync
    check holds."""
    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", padding_free=True,
                                         use_transformers_continuous_batching=True, max_steps=40, sync_period=4,
                                         exact_j_steps=40, progress=False, logging_steps=1000), log=lambda *a: None))
    assert rows[-1]["j/pi_new"] - rows[0]["j/pi_k"] >= LEARNING_MARGIN, (rows[0]["j/pi_k"], rows[-1]["j/pi_new"])
    checked = [r["sampling/logp_diff_max"] for r in rows if "sampling/logp_diff_max" in r]
    assert len(checked) == 10 and max(checked) < 1e-4

"""--use-transformers-continuous-batching: the transformers sampler through transformers' own continuous batching
(``llm.sampling.hf_continuous``). Every drawn token's reported log alpha equals the trainer's recomputation under
temperature, top-k, top-p and min-p; the draws follow the reported distribution; the call's seed fixes the sample
and leaves the trainer's generator alone; syncs reach it (the start-up probe and the per-window check); the option
is TRL's, under its name and its older alias."""

import pytest
import torch

from llm import GRPOConfig
from llm.config.trl import from_trl, translate_trl_args
from llm.tensors.batch import make_batch, padded
from llm.tensors.sync_probe import SyncCheck
from llm.tensors.logprobs import completion_logprobs
from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.models.model import Precision, load_policy
from llm.models.tiny import tiny_model_dir
from llm.sampling import probe_sync, resolve_sampler
from llm.sampling.hf_continuous import ContinuousBatchingSampler
from llm.sampling.hf_generate import TransformersSampler
from tests.helpers import (SYNC_ATOL, first_tokens_match_reported_probabilities, max_logp_gap,
                           model_dir_with_stored_generation_config, perturb)


@pytest.fixture(scope="module")
def policy():
    return load_policy(str(tiny_model_dir()), torch.device("cpu"))


def _prompts(tok):
    return [tok(f"{a}+{b}=").input_ids for a, b in [(12, 34), (5, 7), (40, 41), (3, 99)]]


@pytest.mark.slow
@pytest.mark.parametrize("temperature,token_filter", [(1.0, NO_FILTER), (0.7, TokenFilter(top_k=5)),
                                                      (1.3, TokenFilter(top_p=0.8)),
                                                      (0.9, TokenFilter(top_k=6, top_p=0.9, min_p=0.05))])
def test_every_drawn_tokens_log_alpha_equals_the_trainers_recomputation(policy, temperature, token_filter):
    model, tok = policy
    sampler = ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    prompts = _prompts(tok)
    roll = sampler.generate(prompts, 8, 6, temperature, 1, token_filter=token_filter)
    assert len(roll.completion_ids) == 32 and all(1 <= len(c) <= 6 for c in roll.completion_ids)
    assert all(len(c) == len(lp) for c, lp in zip(roll.completion_ids, roll.logprobs))
    assert all(tok.eos_token_id not in c[:-1] for c in roll.completion_ids)  # a completion ends at its EOS
    batch = make_batch([p for p in prompts for _ in range(8)], roll.completion_ids, tok.pad_token_id, "cpu")
    logp = completion_logprobs(model, batch, temperature, token_filter=token_filter).logp
    gap = ((padded(roll.logprobs, logp.shape[1], "cpu") - logp) * batch.completion_mask).abs().max()
    assert float(gap) <= SYNC_ATOL
    assert len({tuple(c) for c in roll.completion_ids}) > 4  # sampled, not one completion repeated


@pytest.mark.slow
@pytest.mark.parametrize("token_filter,cells", [(NO_FILTER, 4), (TokenFilter(top_p=0.9), 4),
                                                (TokenFilter(top_k=3, min_p=0.05), 3)])
def test_the_draws_follow_the_reported_distribution(policy, token_filter, cells):
    """First tokens of "3+4=" pass a chi-square test against the reported (filtered) probabilities, which equal the
    trainer's; none is drawn off the kept set (the filters' kept sets: tests/llm/test_evaluation.py)."""
    model, tok = policy
    sampler = ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    first_tokens_match_reported_probabilities(sampler, model, tok, "3+4=", token_filter=token_filter,
                                              min_cells=cells)


def test_a_stored_generation_config_does_not_act(tmp_path):
    """A model directory whose generation_config.json sets a repetition penalty and top-k 3: the manager still
    samples the distribution the sampler reports and the trainer recomputes."""
    path = model_dir_with_stored_generation_config(tiny_model_dir(), tmp_path / "model")
    model, tok = load_policy(str(path), torch.device("cpu"))
    sampler = ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    first_tokens_match_reported_probabilities(sampler, model, tok, "3+4=")
    assert model.generation_config.top_k == 3


@pytest.mark.slow
def test_the_seed_fixes_the_sample_and_leaves_the_trainers_generator_alone(policy):
    model, tok = policy
    sampler = ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    state = torch.get_rng_state()
    a = sampler.generate(_prompts(tok), 4, 6, 1.0, 7)
    assert torch.equal(torch.get_rng_state(), state)
    assert sampler.generate(_prompts(tok), 4, 6, 1.0, 7).completion_ids == a.completion_ids
    assert sampler.generate(_prompts(tok), 4, 6, 1.0, 8).completion_ids != a.completion_ids


def test_greedy_takes_the_plain_samplers_tokens(policy):
    model, tok = policy
    cb = ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    plain = TransformersSampler(model, tok.eos_token_id, tok.pad_token_id)
    a = cb.generate(_prompts(tok), 1, 6, 0.8, 0, greedy=True)
    b = plain.generate(_prompts(tok), 1, 6, 0.8, 0, greedy=True)
    assert a.completion_ids == b.completion_ids
    for x, y in zip(a.logprobs, b.logprobs):
        assert max(abs(u - v) for u, v in zip(x, y)) <= SYNC_ATOL


@pytest.mark.slow
def test_syncs_reach_it(policy):
    """A perturbed policy is stale in the sampler until synced, then matches; the start-up probe passes."""
    model, tok = policy
    model = type(model)(model.config)
    model.load_state_dict(policy[0].state_dict())
    sampler = ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    assert max_logp_gap(sampler, model, tok) <= SYNC_ATOL
    perturb(model, 0)
    assert max_logp_gap(sampler, model, tok) > 100 * SYNC_ATOL
    sampler.load_weights(model)
    assert max_logp_gap(sampler, model, tok) <= SYNC_ATOL
    assert probe_sync(sampler, model, _prompts(tok)[:2], tok.pad_token_id, 1.0, Precision(),
                      SyncCheck("sampling/logp_diff_max", SYNC_ATOL)) <= SYNC_ATOL


def test_the_option_is_trls_and_is_refused_beside_another_sampler():
    assert resolve_sampler(GRPOConfig(use_transformers_continuous_batching=True).sampling)[0] == "transformers-continuous"
    assert translate_trl_args(["--use-transformers-paged"]) == ["--use-transformers-continuous-batching"]
    assert translate_trl_args(["--no-use-transformers-paged"]) == ["--no-use-transformers-continuous-batching"]
    assert from_trl(use_transformers_paged=True).use_transformers_continuous_batching
    with pytest.raises(ValueError, match=r"^use_transformers_continuous_batching: is a mode of the transformers "
                                         r"sampler, but the sampler is 'vllm'"):
        GRPOConfig(use_transformers_continuous_batching=True, sampler="vllm")


def test_a_policy_loaded_with_flex_attention_samples_through_sdpa():
    """--padding-free on a GPU loads the policy with flex_attention (the packing kernel); transformers' continuous
    batching has no paged flex (it raised on an H200): each sampler's copy decodes with sdpa, the policy keeps flex,
    and the reported log alpha still equals the trainer's recomputation."""
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"), attn_implementation="flex_attention")
    plain, _ = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    prompts = _prompts(tok)
    for kind in (ContinuousBatchingSampler, TransformersSampler):
        sampler = kind(policy, tok.eos_token_id, tok.pad_token_id)
        assert sampler.model.config._attn_implementation == "sdpa"
        assert policy.config._attn_implementation == "flex_attention"
        roll = sampler.generate(prompts, 3, 5, 1.0, 0)
        sampler.close()
        batch = make_batch([p for p in prompts for _ in range(3)], roll.completion_ids, tok.pad_token_id, "cpu")
        with torch.no_grad():  # recomputed through sdpa: inductor's CPU flex kernel fails to compile here
            logp = completion_logprobs(plain, batch, 1.0).logp
        gap = ((padded(roll.logprobs, logp.shape[1], "cpu") - logp) * batch.completion_mask).abs().max()
        assert float(gap) <= SYNC_ATOL


def test_cuda_graphs_are_off_whatever_the_attention():
    """transformers turns CUDA graphs on by itself where the attention needs no mask; under them its sampling hit a
    device-side assert with this sampler's processor on an H200. The config pins them off, and transformers' own
    decision keeps that on a CUDA device with a mask-free attention."""
    from transformers.generation.continuous_batching.initialization import decide_use_cuda_graphs

    from llm.sampling.hf_continuous import cache_config

    cb = cache_config(64, 20, 128, 0, "cuda")
    assert cb.use_cuda_graph is False
    decide_use_cuda_graphs(cb, is_attn_mask_needed=False, cuda_graph_requested=False)
    assert cb.use_cuda_graph == (False, False)

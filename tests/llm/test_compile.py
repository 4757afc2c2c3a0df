"""--compile: each decoder block compiled in place by inductor computes the eager model's numbers (llm.models.model.
compile_blocks). Its own module: compiling keeps a core busy for minutes, so ``make test`` runs it on the worker of
the multi-process modules (tests/conftest.py), never beside them. Every test compiles the built-in model cut to its
first block (tests.helpers.one_block_model_dir): dynamo compiles each block's graphs on its own, and the tests below,
run in one process, reuse each other's graphs."""

import pytest
import torch

from llm import GRPOConfig, train
from llm.tensors.batch import make_batch
from llm.tensors.logprobs import forward_completions
from llm.models.model import compile_blocks, frozen_copy, load_policy
from llm.run.rundir import read_metrics
from tests.helpers import RTOL, one_block_model_dir, same_gradient, sequences

pytestmark = pytest.mark.slow  # a vLLM server or engine, torchrun or compiling: not in make test-fast


@pytest.fixture(scope="module")
def one_block(tmp_path_factory):
    return str(one_block_model_dir(tmp_path_factory.mktemp("one_block")))


def test_compiled_blocks_give_the_same_logprobs_and_gradients(one_block):
    """--compile: each decoder block compiled in place, on the default path (each prompt's keys and values computed once
    and shared by its completions: the graphs every test below reuses), gives the log-probs and gradients of the eager
    model run on whole sequences (float32 rounding), with and without gradients; the parameters keep their names, so
    the sync and checkpoints are unchanged; a copy (alpha's, pi_ref's) computes with its own weights, not the
    original's."""
    eager, tok = load_policy(one_block, torch.device("cpu"))
    compiled, _ = load_policy(one_block, torch.device("cpu"))
    compiled.train()  # as the trainer holds the policy (the graphs guard on the mode: the run below reuses them)
    names = list(compiled.state_dict())
    assert compile_blocks(compiled) == len(eager.get_decoder().layers)
    assert list(compiled.state_dict()) == names
    prompts, comps = sequences(tok, 12)
    batch = make_batch([prompts[j // 4] for j in range(12)], comps, tok.pad_token_id, "cpu")  # 3 groups of 4
    a = forward_completions(compiled, batch, 1.0, share_prompts=True)
    b = forward_completions(eager, batch, 1.0, share_prompts=False)
    assert torch.allclose(a.logp, b.logp, rtol=RTOL, atol=1e-5)
    a.logp.sum().backward()
    b.logp.sum().backward()
    for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert same_gradient(p.grad, q.grad, 1e-3)
    copy_ = frozen_copy(compiled)  # in eval mode, as alpha's and pi_ref's are
    compiled.eval()  # the original read through the copy's graphs (their guards name no weights)
    with torch.no_grad():
        copy_.get_decoder().layers[0].mlp.down_proj.weight.zero_()
        mine = forward_completions(copy_, batch, 1.0, share_prompts=True).logp
        again = forward_completions(compiled, batch, 1.0, share_prompts=True).logp
    assert not torch.allclose(mine, again, atol=1e-3)
    assert torch.allclose(again, b.logp, rtol=RTOL, atol=1e-5)


def test_the_completions_pass_gets_the_prompt_cache_in_one_memory_layout(one_block, monkeypatch):
    """The shared-prompt path hands the completions' pass its prompts' keys and values contiguous, whatever layout the
    prompt pass left them in (a compiled block leaves a transposed view, an eager one a contiguous tensor), with and
    without gradients. --compile's graphs guard on the strides of their inputs: on SmolLM2-135M, where both layouts
    reached the completions' pass, every decoder block compiled again within the timed steps (docs/benchmarks.md)."""
    from llm.tensors.logprobs import completion_hidden

    model, tok = load_policy(one_block, torch.device("cpu"))
    compile_blocks(model)
    model.train()  # the test above's graphs: gradients in training mode, none in eval mode
    prompts, comps = sequences(tok, 12)
    batch = make_batch([prompts[j // 4] for j in range(12)], comps, tok.pad_token_id, "cpu")
    decoder, layouts = model.get_decoder(), []
    forward = decoder.forward

    def spy(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        if cache is not None and cache.get_seq_length() > 0:
            layouts.append([(layer.keys.is_contiguous(), layer.values.is_contiguous()) for layer in cache.layers])
        return forward(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", spy)
    completion_hidden(model, batch).sum().backward()
    model.eval()
    with torch.no_grad():
        completion_hidden(model, batch)
    assert layouts == [[(True, True)] * len(decoder.layers)] * 2


#: Absolute tolerances of a compiled run against the eager one. The loss is a token mean of ratio x advantage whose
#: terms cancel (here -0.0087 from advantages of size ~1), so its rounding is absolute: at most the per-token
#: log-prob agreement of compiled and eager blocks (1e-5, the test above) times mean |A| <= 1; measured 1.5e-6 on an
#: AVX-512 host, where a relative 1e-4 of the loss (8.7e-7) failed.
COMPILED_ATOL = {"loss": 1e-5, "grad_norm": 1e-6, "tv/pi_k_alpha": 1e-6, "is_weight/max": 1e-6, "entropy": 1e-6}


@pytest.mark.vllm
def test_a_compiled_run_computes_the_eager_runs_numbers(one_block, tmp_path):
    """Two steps at v = 2 with the in-process vLLM engine, with and without --compile, from the same seed: the same
    samples and the same loss, gradient norm, TV and sync check, up to float32 rounding."""
    from llm.sampling.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    runs = [read_metrics(train(GRPOConfig(output_dir=str(tmp_path / f"c{c}"), model_name_or_path=one_block,
                                          sampler="vllm", max_steps=2, sync_period=2, exact_j=False, compile=c,
                                          progress=False, logging_steps=100),
                               log=lambda *a: None)) for c in (False, True)]
    for eager, compiled in zip(*runs, strict=True):
        assert compiled["reward"] == eager["reward"]  # the same samples
        for key in ("loss", "grad_norm", "tv/pi_k_alpha", "is_weight/max", "entropy"):
            assert compiled[key] == pytest.approx(eager[key], rel=1e-4, abs=COMPILED_ATOL[key]), key
    assert runs[1][0]["sampling/logp_diff_max"] < 1e-4

"""--compile: each decoder block compiled in place by inductor computes the eager model's numbers (llm.models.model.
compile_blocks). Its own module: compiling keeps a core busy for minutes, so ``make test`` runs it on the worker of
the multi-process modules (tests/conftest.py), never beside them."""

import pytest
import torch

from llm import GRPOConfig, train
from llm.core.batch import make_batch
from llm.core.logprobs import forward_completions
from llm.models.model import compile_blocks, frozen_copy, load_policy
from llm.models.tiny import tiny_model_dir
from llm.run.rundir import read_metrics
from tests.helpers import RTOL, same_gradient, sequences


def test_compiled_blocks_give_the_same_logprobs_and_gradients():
    """--compile: each decoder block compiled in place gives the eager model's log-probs and gradients (float32
    rounding), with and without gradients; the parameters keep their names, so the sync and checkpoints are unchanged;
    a copy (alpha's, pi_ref's) computes with its own weights, not the original's. Shared prompts (the blocks get a
    prompt's key-value cache: one compilation per block) run in the compiled run below, whose passes share them."""
    eager, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    compiled, _ = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    names = list(compiled.state_dict())
    assert compile_blocks(compiled) == len(eager.get_decoder().layers)
    assert list(compiled.state_dict()) == names
    prompts, comps = sequences(tok, 12)
    batch = make_batch([prompts[j // 4] for j in range(12)], comps, tok.pad_token_id, "cpu")  # 3 groups of 4
    a = forward_completions(compiled, batch, 1.0, share_prompts=False)
    b = forward_completions(eager, batch, 1.0, share_prompts=False)
    assert torch.allclose(a.logp, b.logp, rtol=RTOL, atol=1e-5)
    a.logp.sum().backward()
    b.logp.sum().backward()
    for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert same_gradient(p.grad, q.grad, 1e-3)
    copy_ = frozen_copy(compiled)
    with torch.no_grad():
        copy_.get_decoder().layers[0].mlp.down_proj.weight.zero_()
    # passes with gradients enabled (the graph compiled above; the no-gradient graphs run in the compiled run below)
    mine = forward_completions(copy_, batch, 1.0, share_prompts=False).logp
    assert not torch.allclose(mine, forward_completions(compiled, batch, 1.0, share_prompts=False).logp, atol=1e-3)
    assert torch.allclose(forward_completions(compiled, batch, 1.0, share_prompts=False).logp, b.logp,
                          rtol=RTOL, atol=1e-5)


#: Absolute tolerances of a compiled run against the eager one. The loss is a token mean of ratio x advantage whose
#: terms cancel (here -0.0087 from advantages of size ~1), so its rounding is absolute: at most the per-token
#: log-prob agreement of compiled and eager blocks (1e-5, the test above) times mean |A| <= 1; measured 1.5e-6 on an
#: AVX-512 host, where a relative 1e-4 of the loss (8.7e-7) failed.
COMPILED_ATOL = {"loss": 1e-5, "grad_norm": 1e-6, "tv/pi_k_alpha": 1e-6, "is_weight/max": 1e-6, "entropy": 1e-6}


@pytest.mark.vllm
def test_a_compiled_run_computes_the_eager_runs_numbers(tmp_path):
    """Two steps at v = 2 with the in-process vLLM engine, with and without --compile, from the same seed: the same
    samples and the same loss, gradient norm, TV and sync check, up to float32 rounding."""
    from llm.sampling.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    runs = [read_metrics(train(GRPOConfig(output_dir=str(tmp_path / f"c{c}"), sampler="vllm", max_steps=2,
                                          sync_period=2, exact_j=False, compile=c, progress=False, logging_steps=100),
                               log=lambda *a: None)) for c in (False, True)]
    for eager, compiled in zip(*runs, strict=True):
        assert compiled["reward"] == eager["reward"]  # the same samples
        for key in ("loss", "grad_norm", "tv/pi_k_alpha", "is_weight/max", "entropy"):
            assert compiled[key] == pytest.approx(eager[key], rel=1e-4, abs=COMPILED_ATOL[key]), key
    assert runs[1][0]["sampling/logp_diff_max"] < 1e-4

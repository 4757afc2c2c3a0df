"""The transformers sampler's fast paths and the update's token budget, on the CPU (docs/benchmarks.md, "On a GPU"):
one prefill per prompt, a static KV cache whose decode step transformers compiles (the path CUDA graphs run on a
GPU), passes cut by a token budget, and TRL's throughput metrics. Each is checked against the plain path: the same
draws or the same log alpha as the trainer recomputes."""

import numpy as np
import pytest
import torch

from llm.config import GRPOConfig
from llm.tensors.batch import length_groups, make_batch, padded
from llm.tensors.logprobs import completion_logprobs
from llm.tensors.token_filter import TokenFilter
from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from llm.sampling.hf_generate import TransformersSampler
from tests.helpers import SYNC_ATOL

pytestmark = pytest.mark.slow  # a vLLM server or engine, torchrun or compiling: not in make test-fast


@pytest.fixture(scope="module")
def policy():
    return load_policy(str(tiny_model_dir()), torch.device("cpu"))


def _prompts(tok):
    return [tok(f"{a}+{b}=").input_ids for a, b in [(12, 3), (5, 7), (19, 9), (3, 0)]]


def _gap(policy, tok, prompts, roll, n, temperature, f):
    batch = make_batch([p for p in prompts for _ in range(n)], roll.completion_ids, tok.pad_token_id, "cpu")
    logp = completion_logprobs(policy, batch, temperature, token_filter=f).logp
    return float(((padded(roll.logprobs, logp.shape[1], "cpu") - logp) * batch.completion_mask).abs().max())


def test_one_prefill_per_prompt_draws_what_a_prefill_per_row_draws(policy):
    """Each group's prompt prefilled once, its keys and values repeated over the group's rows: the same completions
    (each row keeps its own random stream) and log alpha within float rounding, greedy and sampled, under a
    micro-batch that splits a group; the log alpha equals the trainer's recomputation."""
    model, tok = policy
    prompts, f = _prompts(tok), TokenFilter(top_k=8, top_p=0.95)
    for kw in (dict(), dict(batch_size=12)):
        shared = TransformersSampler(model, tok.eos_token_id, tok.pad_token_id, share_prompts=True, **kw)
        plain = TransformersSampler(model, tok.eos_token_id, tok.pad_token_id, share_prompts=False, **kw)
        for greedy in (False, True):
            a = shared.generate(prompts, 8, 6, 0.8, 3, greedy=greedy, token_filter=f)
            b = plain.generate(prompts, 8, 6, 0.8, 3, greedy=greedy, token_filter=f)
            assert a.completion_ids == b.completion_ids
            assert max(abs(x - y) for la, lb in zip(a.logprobs, b.logprobs) for x, y in zip(la, lb)) < 1e-5
        assert _gap(model, tok, prompts, a, 8, 0.8, f) <= SYNC_ATOL


def test_the_static_cache_with_a_compiled_decode_step_reports_the_trainers_log_alpha(policy):
    """--cache-implementation static on the CPU runs the compiled path a GPU runs under CUDA graphs (transformers'
    generate compiles the decode step; the prompts padded to a fixed width, so the second call reuses it): every
    drawn token's log alpha within the sync tolerance of the trainer's recomputation, and greedy decoding gives the
    dynamic cache's completions."""
    model, tok = policy
    prompts, f = _prompts(tok), TokenFilter(top_k=8, top_p=0.95)
    static = TransformersSampler(model, tok.eos_token_id, tok.pad_token_id, cache_implementation="static",
                                 prompt_width=8)
    for seed in (0, 1):
        roll = static.generate(prompts, 4, 6, 0.8, seed, token_filter=f)
        assert _gap(model, tok, prompts, roll, 4, 0.8, f) <= SYNC_ATOL
    dynamic = TransformersSampler(model, tok.eos_token_id, tok.pad_token_id)
    assert static.generate(prompts, 4, 6, 1.0, 0, greedy=True).completion_ids == \
        dynamic.generate(prompts, 4, 6, 1.0, 0, greedy=True).completion_ids


def test_the_static_cache_is_the_transformers_samplers():
    with pytest.raises(ValueError, match="cache_implementation: 'static' is a mode of the transformers sampler"):
        GRPOConfig(cache_implementation="static", sampler="vllm")
    with pytest.raises(ValueError, match="cache_implementation"):
        GRPOConfig(cache_implementation="static", sampler="transformers", use_transformers_continuous_batching=True)
    assert GRPOConfig(cache_implementation="static", sampler="transformers").cache_implementation == "static"


@pytest.mark.parametrize("packed", [False, True])
def test_passes_hold_at_most_the_token_budget(packed):
    """Every pass forwards at most the budget (rows x its longest, or packed its rows' lengths), but a row longer than
    the budget alone; every row runs once; the padded positions are the least such a cut allows (against every
    partition of a small case)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 40, size=rng.integers(1, 12))
        budget = int(rng.integers(10, 120))
        groups = length_groups(lengths, token_budget=budget, packed=packed, overhead_rows=0)
        assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
        for g in groups:
            tokens = lengths[g].sum() if packed else len(g) * lengths[g].max()
            assert tokens <= budget or len(g) == 1


def test_a_token_budget_changes_the_passes_not_the_step(tmp_path):
    """Two steps at v = 2 with a token budget small enough to cut the step into many passes log the unbudgeted run's
    loss, gradient norm and TV up to float rounding, and the update's tokens per second. Step 0 starts from the same
    weights: its gradient norm agrees to rel 1e-5 (measured 7e-7 apart across AVX2/AVX-512 kernels and 1 or 2
    threads). Step 1 starts from weights that AdamW's first update moved by about lr per weight whatever a gradient
    entry's size, so entries at float rounding carry the passes' rounding into step 1: the unbudgeted run alone moves
    by rel 2.8e-4 (loss), 7.6e-5 (gradient norm) and 1.2e-4 (TV) between those kernels and thread counts, hence
    rel 2e-3 there. Each pass weighted by its own tokens (bnpo's weights forced on) moves step 0's loss from 9e-8 to
    -2.8e-3."""
    from llm import train
    from llm.run.rundir import read_metrics

    base = dict(sampler="transformers", max_steps=2, sync_period=2, prompts_per_step=4, progress=False,
                logging_steps=100, exact_j=False)
    plain = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "plain"), **base), log=lambda *a: None))
    cut = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "cut"), token_budget=40, **base),
                             log=lambda *a: None))
    for a, b in zip(plain, cut, strict=True):
        rel = 1e-5 if a["step"] == 0 else 2e-3
        for key in ("loss", "grad_norm", "tv/pi_k_alpha"):
            assert b[key] == pytest.approx(a[key], rel=rel, abs=1e-6), (a["step"], key)
        assert b["perf/forwarded_tok_s_fwd_bwd"] > 0 and "perf/mfu_fwd_bwd" not in b  # no known peak on a CPU


def test_the_mfu_follows_trls_definition():
    """TRL's definitions (perf/mfu_*): 3 x the forward FLOPs per token, attention over the whole length, the output
    layer once; peak by the device's name in bfloat16 only."""
    from types import SimpleNamespace

    from llm.tensors.metrics import mfu, peak_flops, training_flops_per_token

    qwen05 = SimpleNamespace(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                             intermediate_size=4864, vocab_size=151936)
    h, d, layers = 896, 64, 24
    per_layer = 2 * h * (14 + 4) * d + 2 * 14 * d * h + 4 * 14 * d * 512 + 6 * h * 4864
    assert training_flops_per_token(qwen05, 512) == 3 * (layers * per_layer + 2 * h * 151936)
    assert peak_flops("NVIDIA H200", "bfloat16") == 989e12 and peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert peak_flops("NVIDIA H200", "float32") is None and peak_flops("", "bfloat16") is None
    assert mfu(1e9, 1e3, 1.0, 1e12, 1) == pytest.approx(100.0 * 1e12 / 1e12)


@pytest.mark.slow
def test_the_builtin_task_learns_with_the_static_cache(tmp_path):
    """50 steps at v = 4 with --cache-implementation static (the decode step compiled once, every call of the run one
    shape): the exact J over the training prompts rises by the learning margin (measured, seed 0, on a 2-core AVX2
    host without AVX-512: +0.083), and every window's sync check holds (the sampler's log alpha against the
    trainer's recomputation; worst 1.0e-5)."""
    from llm import train
    from llm.run.rundir import read_metrics
    from tests.helpers import LEARNING_MARGIN

    said = []
    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers",
                                         cache_implementation="static", max_steps=50, sync_period=4,
                                         exact_j_steps=50, progress=False, logging_steps=1000),
                              log=lambda *a, **k: said.append(" ".join(map(str, a)))))
    assert any("sampler transformers (static cache: its own compiled decode loop" in line for line in said), said[:3]
    assert rows[-1]["j/pi_new"] - rows[0]["j/pi_k"] >= LEARNING_MARGIN, (rows[0]["j/pi_k"], rows[-1]["j/pi_new"])
    checked = [r["sampling/logp_diff_max"] for r in rows if "sampling/logp_diff_max" in r]
    assert len(checked) == 13 and max(checked) <= SYNC_ATOL

"""Model families: the vLLM sync reaches the engine's forward pass for every family of llm.models.tiny.FAMILIES, and what
cannot run is refused at start-up."""

import pytest
import torch

from llm import GRPOConfig
from llm.tensors.sync_probe import SyncCheck
from llm.models.model import Precision, load_policy
from llm.models.tiny import FAMILIES, build_family_model
from llm.sampling.vllm_engine import vllm_available
from tests.helpers import SYNC_ATOL, max_logp_gap, perturb

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sync_is_exact_for_every_family(family, tmp_path):
    from llm.sampling import probe_sync
    from llm.sampling.vllm_engine import VLLMSampler

    path = str(build_family_model(family, tmp_path / family))
    policy, tok = load_policy(path, torch.device("cpu"))
    sampler = VLLMSampler(path, dtype="float32", seed=0, max_model_len=64, eos_token_id=tok.eos_token_id)
    try:
        assert max_logp_gap(sampler, policy, tok) <= SYNC_ATOL  # the engine loaded the same model
        for round_ in range(2):
            perturb(policy, round_)
            assert max_logp_gap(sampler, policy, tok, seed=round_) > 100 * SYNC_ATOL, "stale until synced"
            before = {k: v.clone() for k, v in policy.state_dict().items()}
            sampler.load_weights(policy)  # the engine reads the trainer's own tensors (llm.sampling.weight_transfer)
            assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items()), "a sync changed the policy"
            assert max_logp_gap(sampler, policy, tok, seed=round_) <= SYNC_ATOL
        prompts = [tok("1+2=").input_ids, tok("7+5=").input_ids]
        assert probe_sync(sampler, policy, prompts, tok.pad_token_id, 1.0, Precision(),
                          SyncCheck("sampling/logp_diff_max", SYNC_ATOL)) <= SYNC_ATOL
    finally:
        sampler.close()


def test_a_head_size_vllm_cpu_cannot_run_is_refused_at_start_up(tmp_path):
    """A Llama with heads of 16 (vLLM's CPU attention runs 32, 64, ...): one line naming the head size and the
    architecture, before any engine starts."""
    import transformers as tf

    from llm import train
    from llm.models.tiny import build_tokenizer

    tok = build_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=64, eos_token_id=1,
                         pad_token_id=0, bos_token_id=None)
    tf.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    config = GRPOConfig(model_name_or_path=str(tmp_path / "m"), sampler="vllm", output_dir=str(tmp_path / "run"),
                        progress=False, max_steps=1)
    with pytest.raises(ValueError, match=r"sampler: vLLM's CPU attention does not support this model's head size 16 "
                                         r"\(LlamaForCausalLM"):
        train(config, log=lambda *a: None)


def test_a_sync_that_does_not_reach_the_engine_is_refused_at_start_up(tmp_path, monkeypatch):
    """The start-up probe: if synced weights do not reach the engine's forward pass (simulated by a sync that does
    nothing), the run stops before step 0 with one line naming the architecture."""
    from llm import train
    from llm.sampling.vllm_engine import VLLMSampler

    monkeypatch.setattr(VLLMSampler, "load_weights", lambda self, model: None)
    config = GRPOConfig(sampler="vllm", output_dir=str(tmp_path / "run"), progress=False, max_steps=1)
    with pytest.raises(ValueError, match=r"do not reach its forward pass for Qwen2ForCausalLM"):
        train(config, log=lambda *a: None)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()

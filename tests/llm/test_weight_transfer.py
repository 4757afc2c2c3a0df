"""llm.sampling.weight_transfer: vLLM's weight-transfer API with the gloo_cpu backend syncs the engine exactly."""

import pytest
import torch

from llm.model import load_policy
from llm.sampling.vllm_engine import vllm_available
from llm.tiny import tiny_model_dir
from tests.helpers import SYNC_ATOL, max_logp_gap, perturb

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]


def test_weight_transfer_api_syncs_the_engine_exactly():
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from llm.sampling.vllm_engine import VLLMSampler
    from llm.sampling.weight_transfer import BACKEND, CheckpointSource, GlooTrainerInitInfo, OfflineClient, register


    register()
    path = str(tiny_model_dir())
    policy, tok = load_policy(path, torch.device("cpu"))
    sampler = VLLMSampler(path, dtype="float32", seed=0, max_model_len=64, eos_token_id=tok.eos_token_id)
    assert sampler.llm.llm_engine.vllm_config.weight_transfer_config.backend == BACKEND
    try:
        client = OfflineClient(sampler.llm)
        engine = WeightTransferTrainerFactory.trainer_init(GlooTrainerInitInfo(rank=0), client=client,
                                                           source=CheckpointSource(policy))
        assert max_logp_gap(sampler, policy, tok) <= SYNC_ATOL
        for round_ in range(3):
            perturb(policy, round_)
            assert max_logp_gap(sampler, policy, tok, seed=round_) > 100 * SYNC_ATOL  # stale until synced
            engine.send_weights()
            assert max_logp_gap(sampler, policy, tok, seed=round_) <= SYNC_ATOL
            assert sampler.llm.get_weight_version() == str(round_ + 1)
    finally:
        sampler.close()

"""The gloo_cpu backend of vLLM's weight-transfer API (llm/sampling/weight_transfer.py), driven through the
in-process engine's RL methods: after every sync the engine's log-probs equal the trainer's."""

import pytest
import torch

from llm.model import load_policy
from llm.sampling.vllm_engine import vllm_available
from llm.tiny import tiny_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

SYNC_ATOL = 1e-4


def test_weight_transfer_api_syncs_the_engine_exactly():
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from llm.sampling.vllm_engine import VLLMSampler
    from llm.sampling.weight_transfer import BACKEND, CheckpointSource, GlooTrainerInitInfo, OfflineClient, register

    from .test_vllm_sampler import _max_logp_gap, _perturb

    register()
    path = str(tiny_model_dir())
    policy, tok = load_policy(path, torch.device("cpu"))
    sampler = VLLMSampler(path, dtype="float32", seed=0, max_model_len=64, eos_token_id=tok.eos_token_id)
    assert sampler.llm.llm_engine.vllm_config.weight_transfer_config.backend == BACKEND
    try:
        client = OfflineClient(sampler.llm)
        engine = WeightTransferTrainerFactory.trainer_init(GlooTrainerInitInfo(rank=0), client=client,
                                                           source=CheckpointSource(policy))
        assert _max_logp_gap(sampler, policy, tok) <= SYNC_ATOL
        for round_ in range(3):
            _perturb(policy, round_)
            assert _max_logp_gap(sampler, policy, tok, seed=round_) > 100 * SYNC_ATOL  # stale until synced
            engine.send_weights()
            assert _max_logp_gap(sampler, policy, tok, seed=round_) <= SYNC_ATOL
            assert sampler.llm.get_weight_version() == str(round_ + 1)
    finally:
        sampler.close()

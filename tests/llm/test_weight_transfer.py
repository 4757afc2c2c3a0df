"""llm.sampling.weight_transfer: vLLM's weight-transfer API with the gloo_cpu backend (a server's transport) and
the local_cpu one (an engine in the trainer's process) syncs the engine exactly."""

import pytest
import torch

from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from llm.sampling.vllm_engine import vllm_available
from tests.helpers import SYNC_ATOL, max_logp_gap, perturb

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo_cpu", "local_cpu"])
def test_weight_transfer_api_syncs_the_engine_exactly(backend):
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from llm.sampling.vllm_engine import VLLMSampler
    from llm.sampling.weight_transfer import TRAINER_INIT_INFO, CheckpointSource, OfflineClient, register

    register()
    path = str(tiny_model_dir())
    policy, tok = load_policy(path, torch.device("cpu"))
    sampler = VLLMSampler(path, dtype="float32", seed=0, max_model_len=64, eos_token_id=tok.eos_token_id,
                          weight_backend=backend)
    assert sampler.llm.llm_engine.vllm_config.weight_transfer_config.backend == backend
    try:
        client = OfflineClient(sampler.llm)
        engine = WeightTransferTrainerFactory.trainer_init(TRAINER_INIT_INFO[backend](rank=0), client=client,
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


def test_the_local_backend_refuses_a_trainer_outside_its_process():
    """local_cpu hands tensors over by reference: a trainer whose token the engine's process does not hold (a trainer
    in another process) is refused at the rendezvous, naming the backend that serves it."""
    from llm.sampling.vllm_engine import VLLMSampler
    from llm.sampling.weight_transfer import OfflineClient

    path = str(tiny_model_dir())
    _, tok = load_policy(path, torch.device("cpu"))
    sampler = VLLMSampler(path, dtype="float32", seed=0, max_model_len=64, eos_token_id=tok.eos_token_id)
    try:
        with pytest.raises(Exception, match="the trainer is not in this process .*needs gloo_cpu"):
            OfflineClient(sampler.llm).init_weight_transfer_engine({"token": "a-token-of-another-process"})
    finally:
        sampler.close()

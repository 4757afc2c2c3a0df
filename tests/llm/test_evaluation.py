"""llm.evaluation: the exact J of the built-in task is the sampled success rate, and samplers sample what they report."""

import pytest
import torch

from llm.model import load_policy
from llm.sampling import TransformersSampler
from llm.tasks import arithmetic_task
from llm.tiny import tiny_model_dir
from tests.helpers import (
    exact_j_matches_sampling,
    first_tokens_match_reported_probabilities,
    model_dir_with_stored_generation_config,
)


@pytest.fixture(scope="module")
def tiny():
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    return policy, tok


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_j_is_the_sampled_success_rate(tiny, temperature):
    policy, tok = tiny
    sampler = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id, copy=False)
    exact_j_matches_sampling(sampler, policy, arithmetic_task().bind(tok), temperature)


def test_stored_generation_config_does_not_change_what_is_sampled(tmp_path):
    """A model directory whose generation_config.json sets repetition_penalty 1.5 and top_k 3: the sampler
    still samples softmax(logits / T), the distribution it reports and the trainer recomputes."""
    path = model_dir_with_stored_generation_config(tiny_model_dir(), tmp_path / "model")
    policy, tok = load_policy(str(path), torch.device("cpu"))
    assert policy.generation_config.repetition_penalty == 1.5  # the stored config is really there
    sampler = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id)
    first_tokens_match_reported_probabilities(sampler, policy, tok, "3+4=")
    assert policy.generation_config.top_k == 3  # and is left as it was for the user's own generate()

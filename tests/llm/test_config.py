"""llm.config: GRPOConfig's validation (one line naming the field) and derived values."""

import json

import pytest

from llm import GRPOConfig
from llm.tasks.sources import load_task


@pytest.mark.parametrize("field,value,match", [
    ("num_generations", 1, "num_generations: a group needs G >= 2"),
    ("sync_period", 0, "sync_period: v must be >= 1"),
    ("variance_eps", 0.9, r"variance_eps: must lie in \[0, 3/4\]"),
    ("epsilon", -0.1, "epsilon"),
    ("learning_rate", 0.0, "learning_rate"),
    ("device", "tpu", "device"),
    ("per_device_train_batch_size", -1, "per_device_train_batch_size: must be >= 0"),
    ("logit_chunk_tokens", -5, "logit_chunk_tokens: must be >= 0"),
])
def test_config_validation_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**{field: value})


def test_config_derived_values():
    c = GRPOConfig(max_steps=100, sync_period=10, prompts_per_step=4, num_generations=16)
    assert c.completions_per_step == 64 and c.num_syncs == 10
    assert c.gradient_accumulation_steps == 1  # per_device_train_batch_size 0: the whole step in one pass
    assert c.replace(per_device_train_batch_size=16).gradient_accumulation_steps == 4
    assert c.replace(per_device_train_batch_size=24).gradient_accumulation_steps == 3  # 24 + 24 + 16
    assert GRPOConfig.from_json_file is not None and json.loads(c.to_json())["sync_period"] == 10


def test_reward_funcs_config_errors():
    with pytest.raises(ValueError, match="reward_funcs: give either --reward-fn"):
        GRPOConfig(reward_fn="a:b", reward_funcs=("a:c",))
    with pytest.raises(ValueError, match=r"reward_weights: needs one weight per reward function \(2\)"):
        GRPOConfig(reward_funcs=("a:b", "a:c"), reward_weights=(1.0,))
    with pytest.raises(ValueError, match="reward_weights: must be a finite number"):
        GRPOConfig(reward_funcs=("a:b",), reward_weights=(float("nan"),))
    with pytest.raises(ValueError, match="reward_funcs: cannot import 'no_such_module:f'"):
        load_task("arithmetic", reward_funcs=["no_such_module:f"])

"""Assignment is checked like construction (``GRPOConfig.__setattr__`` rebuilds and re-validates; the groups are frozen
pydantic models): each hazard the review found is refused or now holds, and TRL's habit of setting ``args.x = value``
keeps working for valid values."""

import copy

import pytest

from llm import GRPOConfig
from llm.config import MachineConfig, OptimConfig


def test_a_misspelt_name_raises_naming_the_nearest_option():
    cfg = GRPOConfig()
    with pytest.raises(AttributeError, match=r"'learning_rat' is not an option \(did you mean 'learning_rate'\?\)"):
        cfg.learning_rat = 3
    with pytest.raises(AttributeError, match=r"'learning_rat' is not a field \(did you mean 'learning_rate'\?\)"):
        cfg.optim.learning_rat = 3
    assert not hasattr(cfg, "learning_rat")


def test_a_derived_value_cannot_be_shadowed():
    """``clip_high`` is the objective group's property: setting it on the config would read 12345 while the group
    still said 0.2; now it is refused."""
    cfg = GRPOConfig()
    with pytest.raises(AttributeError, match="'clip_high' is derived from the fields"):
        cfg.clip_high = 12345
    with pytest.raises(AttributeError, match="'micro_batch_size' is derived"):
        cfg.micro_batch_size = 4
    assert cfg.clip_high == cfg.objective.clip_high == 0.2


def test_a_held_group_keeps_what_it_said_and_the_config_takes_a_new_one():
    """The groups are frozen: a flat write gives the config a new group, validated with the rest; a group held
    elsewhere (a part of the trainer built from it) never changes under its holder."""
    cfg = GRPOConfig(num_iterations=2)
    held = cfg.optim
    cfg.learning_rate = 3e-5
    assert held.learning_rate == 3e-4 != cfg.optim.learning_rate == 3e-5 and cfg.optim is not held
    assert cfg.num_iterations == 2 and cfg.to_dict()["num_iterations"] == 2
    assert cfg.optim.model_fields_set == {"learning_rate", "num_iterations"}  # what was said, and only that


def test_a_groups_field_is_checked_on_assignment_and_left_as_it_was_when_refused():
    cfg = GRPOConfig(learning_rate=1e-5)
    with pytest.raises(ValueError, match="^learning_rate: must be > 0"):
        cfg.learning_rate = -1.0
    assert cfg.learning_rate == 1e-5
    with pytest.raises(ValueError, match="^learning_rate: must be > 0"):
        OptimConfig(learning_rate=0.0)


def test_the_rules_across_groups_hold_after_assignment():
    """--fsdp with --use-peft is refused at construction; setting fsdp afterwards, flat or through the group, is
    refused the same way and leaves fsdp off; so is a group replaced whole."""
    cfg = GRPOConfig(use_peft=True)
    for assign in (lambda: setattr(cfg, "fsdp", True), lambda: setattr(cfg, "machine", MachineConfig(fsdp=True)),
                   lambda: setattr(cfg, "machine", {"fsdp": True})):
        with pytest.raises(ValueError, match="^fsdp: shards whole weights"):
            assign()
        assert cfg.fsdp is False
    with pytest.raises(ValueError, match="max_steps"):
        cfg.max_steps = 0
    assert cfg.max_steps == 100
    with pytest.raises(ValueError, match="^optim: must be a valid dictionary or instance of OptimConfig"):
        cfg.optim = ["learning_rate"]


def test_trls_habit_of_setting_args_keeps_working():
    cfg = GRPOConfig()
    cfg.learning_rate, cfg.num_generations, cfg.max_steps, cfg.beta = 5e-6, 4, 10, 0.04
    assert (cfg.optim.learning_rate, cfg.sampling.num_generations, cfg.max_steps, cfg.objective.beta) == (
        5e-6, 4, 10, 0.04)
    twin = copy.deepcopy(cfg)
    twin.learning_rate = 1e-3
    assert cfg.learning_rate == 5e-6 and twin.replace(seed=3).learning_rate == 1e-3

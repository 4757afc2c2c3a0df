"""The config is pydantic models as pydantic's users expect them (issue 80, item 1): each group a frozen model whose
rules are its validator, the config's rules across groups its own validator, ``model_dump``, ``model_validate``,
``model_json_schema`` and ``model_copy`` working, and no back-pointer or private switch. Each case failed before:
``OptimConfig().model_dump()`` raised AttributeError (the groups were pydantic dataclasses wrapped by hand)."""

import json

import pytest
from pydantic import BaseModel, ValidationError

from llm.config import GROUPS, RESUMABLE_FIELDS, GRPOConfig, OptimConfig
from llm.config.fields import is_resumable


@pytest.mark.parametrize("name", list(GROUPS))
def test_each_group_dumps_validates_and_describes_itself(name):
    cls = GROUPS[name]
    group = getattr(GRPOConfig(), name)
    assert issubclass(cls, BaseModel) and cls.model_config["frozen"] and cls.model_config["strict"]
    assert cls.model_validate(group.model_dump()) == group
    assert cls.model_validate_json(group.model_dump_json()) == group
    schema = cls.model_json_schema()
    assert set(schema["properties"]) == set(cls.model_fields)
    assert all(p.get("description") for p in schema["properties"].values()), "every field carries its docstring"
    marked = {f for f, p in schema["properties"].items() if p.get("resumable")}
    assert marked == {f for f, info in cls.model_fields.items() if is_resumable(info)} == set(cls.model_fields) & \
        RESUMABLE_FIELDS
    assert not cls.__private_attributes__, "no back-pointer, no private switch"


def test_model_copy_gives_a_new_frozen_group_and_replace_a_validated_config():
    optim = OptimConfig(learning_rate=1e-5)
    copy = optim.model_copy(update={"learning_rate": 2e-5})
    assert (optim.learning_rate, copy.learning_rate) == (1e-5, 2e-5)
    with pytest.raises(AttributeError, match="^OptimConfig is frozen: set config.learning_rate = ..."):
        copy.learning_rate = 3e-5
    with pytest.raises(ValueError, match="^learning_rate: must be > 0"):
        GRPOConfig(optim=optim).replace(learning_rate=-1.0)


def test_the_config_validates_flat_and_nested_dicts_and_json_alike():
    cfg = GRPOConfig(learning_rate=1e-5, num_generations=4, max_steps=3)
    assert GRPOConfig.model_validate(cfg.to_dict()) == cfg  # config.json's flat keys
    assert GRPOConfig.model_validate(cfg.model_dump()) == cfg  # pydantic's nested dump
    assert GRPOConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert GRPOConfig.model_validate({"learning_rate": 1e-5, "num_generations": 4, "max_steps": 3}) == cfg
    schema = GRPOConfig.model_json_schema()
    assert set(schema["properties"]) == {"max_steps", "seed", *GROUPS}


def test_what_was_said_is_kept_apart_from_the_defaults():
    """``model_dump(exclude_unset=True)`` is what the user said, through flat names, groups and assignments."""
    cfg = GRPOConfig(learning_rate=1e-5, optim=OptimConfig(adam_beta1=0.8), top_p=0.9)
    cfg.max_steps = 7
    assert cfg.model_dump(exclude_unset=True) == {"max_steps": 7, "optim": {"learning_rate": 1e-5, "adam_beta1": 0.8},
                                                  "sampling": {"top_p": 0.9}}
    assert cfg.replace(seed=2).model_dump(exclude_unset=True)["optim"] == {"learning_rate": 1e-5, "adam_beta1": 0.8}


def test_the_rules_across_groups_are_the_configs_validator():
    with pytest.raises(ValidationError, match="fsdp: shards whole weights"):
        GRPOConfig.model_validate({"fsdp": True, "use_peft": True})
    with pytest.raises(ValueError, match="^fsdp: shards whole weights"):
        GRPOConfig(machine={"fsdp": True}, model={"use_peft": True})


def test_a_config_json_written_by_group_loads(tmp_path):
    cfg = GRPOConfig(learning_rate=1e-5, top_p=0.9)
    (tmp_path / "config.json").write_text(json.dumps(cfg.model_dump()))
    assert GRPOConfig.from_json_file(tmp_path / "config.json") == cfg


def test_model_copy_with_flat_names_or_group_dicts_is_validated_and_coherent():
    """A user's trial: pydantic's own model_copy stored ``learning_rate`` beside the optimiser group (the flat read
    said 5e-5, the group and config.json 1e-5, and the copy compared equal to its original), and a group given as a
    dict stayed a dict."""
    cfg = GRPOConfig(learning_rate=1e-5)
    x = cfg.model_copy(update={"learning_rate": 5e-5})
    assert x.learning_rate == x.optim.learning_rate == x.to_dict()["learning_rate"] == 5e-5 and x != cfg
    y = cfg.model_copy(update={"optim": {"learning_rate": 2e-5}})
    assert isinstance(y.optim, OptimConfig) and y.learning_rate == 2e-5
    with pytest.raises(ValueError, match="^fsdp: shards whole weights"):
        cfg.model_copy(update={"fsdp": True, "use_peft": True})
    assert cfg.model_copy() == cfg and "learning_rate" in dir(cfg)


def test_pydantics_entry_raises_validation_error_and_the_constructor_one_line():
    """``model_validate`` of a misspelt name raised a bare TypeError that ``except ValidationError`` missed; a group of
    the wrong class was a 740-character line holding the group's repr."""
    from llm.config import ObjectiveConfig

    with pytest.raises(ValidationError, match="unexpected option 'learning_rte' \\(did you mean 'learning_rate'\\?\\)"):
        GRPOConfig.model_validate({"learning_rte": 1})
    with pytest.raises(TypeError, match="^unexpected option 'learning_rte'"):
        GRPOConfig(learning_rte=1)
    with pytest.raises(ValueError, match=r"^optim: must be a valid dictionary or instance of OptimConfig, "
                                         r"got ObjectiveConfig\(...\)$"):
        GRPOConfig(optim=ObjectiveConfig())
    with pytest.raises(AttributeError, match="^OptimConfig is frozen: set config.learning_rate"):
        GRPOConfig().optim.learning_rate = 1.0

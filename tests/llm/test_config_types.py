"""The config's types and choices are checked by pydantic wherever a config is built or changed: the constructor,
flat and group assignment, ``replace``, config.json and ``from_trl`` (llm/config/fields.py). Each case below was
accepted before: a misspelt choice ran another sampler, the string "no" turned an option on, a float became a count."""

import copy
import dataclasses
import json
import pickle
import typing

import numpy as np
import pytest

from llm.config import GROUPS, GRPOConfig, from_trl
from llm.config.grpo import TOP_FIELDS


def _fields_of(kind):
    """(name, choices or None) of every field whose type is ``kind`` (Literal: its choices)."""
    out = []
    for cls in GROUPS.values():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            if kind == "literal" and typing.get_origin(t) is typing.Literal:
                out.append((f.name, typing.get_args(t)))
            elif t is kind:
                out.append((f.name, None))
    return out


BUILDS = {
    "constructor": lambda name, value: GRPOConfig(**{name: value}),
    "flat assignment": lambda name, value: setattr(GRPOConfig(), name, value),
    "group assignment": lambda name, value: setattr(_group_of(GRPOConfig(), name), name, value),
    "replace": lambda name, value: GRPOConfig().replace(**{name: value}),
    "config.json": lambda name, value: GRPOConfig(**json.loads(json.dumps({**GRPOConfig().to_dict(), name: value}))),
    "from_trl": lambda name, value: from_trl(**{name: value}),
}


def _group_of(cfg, name):
    """The group holding ``name`` (GRPOConfig itself for its own fields)."""
    return next((getattr(cfg, g) for g, cls in GROUPS.items() if name in {f.name for f in dataclasses.fields(cls)}),
                cfg)


@pytest.mark.parametrize("how", list(BUILDS))
def test_every_choice_field_refuses_a_string_outside_its_choices(how):
    fields = _fields_of("literal")
    assert len(fields) >= 12  # and report_to, a tuple of choices
    for name, choices in fields:
        with pytest.raises(ValueError, match=rf"^{name}: must be one of .*got 'not_a_choice'"):
            BUILDS[how](name, "not_a_choice")
    with pytest.raises(ValueError, match="^sampler: must be one of 'auto', 'vllm', 'server' or 'transformers', "
                                         "got 'vlm'"):
        GRPOConfig(sampler="vlm")


@pytest.mark.parametrize("how", list(BUILDS))
def test_every_boolean_takes_only_a_bool(how):
    fields = _fields_of(bool)
    assert len(fields) >= 24
    for name, _ in fields:
        for value in ("no", 0, 1.0):
            with pytest.raises(ValueError, match=rf"^{name}: must be True or False"):
                BUILDS[how](name, value)


@pytest.mark.parametrize("how", list(BUILDS))
def test_every_integer_takes_only_an_integer(how):
    fields = _fields_of(int) + [(name, None) for name in TOP_FIELDS]
    assert len(fields) >= 30
    for name, _ in fields:
        for value in (8.5, True, "8"):
            with pytest.raises(ValueError, match=rf"^{name}: must be an integer"):
                BUILDS[how](name, value)


def test_integral_numpy_numbers_become_ints_and_config_json_writes():
    cfg = GRPOConfig(num_generations=np.int64(4), learning_rate=np.float32(1e-4), use_peft=np.bool_(False),
                     max_steps=np.int32(7))
    assert type(cfg.num_generations) is int and type(cfg.learning_rate) is float and type(cfg.max_steps) is int
    cfg.prompts_per_step = np.int16(3)
    assert type(cfg.prompts_per_step) is int
    json.loads(cfg.to_json())  # numpy numbers used to break writing config.json
    with pytest.raises(ValueError, match="num_generations: must be an integer"):
        GRPOConfig(num_generations=np.float64(4.0))


def test_a_refused_assignment_leaves_the_config_as_it_was():
    cfg = GRPOConfig()
    for name, value in (("learning_rate", "fast"), ("loss_type", "dapoo"), ("use_peft", "no")):
        before = cfg.to_dict()
        with pytest.raises(ValueError, match=f"^{name}:"):
            setattr(cfg, name, value)
        assert cfg.to_dict() == before


def test_copies_are_independent_and_deepcopy_and_pickle_work():
    cfg = GRPOConfig(learning_rate=1e-4)
    for other in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        other.learning_rate = 5e-5
        assert cfg.learning_rate == 1e-4 and other.learning_rate == 5e-5 and other.optim is not cfg.optim
        other.num_generations = 4  # the copy's groups belong to the copy: its rules run on it
        with pytest.raises(ValueError, match="sync_policy"):
            other.sync_policy = "divergence"


def test_from_trl_gives_one_answer_whatever_the_order_of_its_arguments():
    assert from_trl(use_vllm=False, vllm_mode="server").sampler == "transformers"
    assert from_trl(vllm_mode="server", use_vllm=False).sampler == "transformers"
    assert from_trl(use_vllm=True, vllm_mode="colocate").sampler == from_trl(vllm_mode="colocate",
                                                                              use_vllm=True).sampler == "vllm"


@pytest.mark.parametrize("build", [lambda: GRPOConfig(lerning_rate=1e-4), lambda: GRPOConfig().replace(lerning_rate=1),
                                   lambda: from_trl(lerning_rate=1e-4)], ids=["constructor", "replace", "from_trl"])
def test_a_misspelt_name_gets_the_nearest_one(build):
    with pytest.raises(TypeError, match=r"'lerning_rate' \(did you mean 'learning_rate'\?\)"):
        build()

"""The config's types and choices are checked by pydantic wherever a config is built or changed: the constructor,
a group's own constructor, flat assignment, ``replace``, config.json and ``from_trl`` (llm/config/fields.py). Each case below was
accepted before: a misspelt choice ran another sampler, the string "no" turned an option on, a float became a count."""

import copy
import json
import pickle
import re
import typing
import warnings

import numpy as np
import pytest

from llm.config import GROUPS, TRL_SWITCHES, GRPOConfig, from_trl, translate_trl_args
from llm.config.grpo import TOP_FIELDS


def _fields_of(kind):
    """(name, choices or None) of every field whose type is ``kind`` (Literal: its choices)."""
    out = []
    for cls in GROUPS.values():
        hints = typing.get_type_hints(cls)
        for name in cls.model_fields:
            t = hints[name]
            if kind == "literal" and typing.get_origin(t) is typing.Literal:
                out.append((name, typing.get_args(t)))
            elif t is kind:
                out.append((name, None))
    return out


BUILDS = {
    "constructor": lambda name, value: GRPOConfig(**{name: value}),
    "flat assignment": lambda name, value: setattr(GRPOConfig(), name, value),
    "group": lambda name, value: _group_of(name)(**{name: value}),
    "replace": lambda name, value: GRPOConfig().replace(**{name: value}),
    "config.json": lambda name, value: GRPOConfig(**json.loads(json.dumps({**GRPOConfig().to_dict(), name: value}))),
    "from_trl": lambda name, value: from_trl(**{name: value}),
}


def _group_of(name):
    """The class of the group holding ``name`` (GRPOConfig itself for its own fields)."""
    return next((cls for cls in GROUPS.values() if name in cls.model_fields), GRPOConfig)


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


# ---- TRL's names, config.json and the entry points (each case below was accepted, or a traceback, before) ----------


@pytest.mark.parametrize("value", ["no", 0, 2.5, None])
def test_trls_switches_take_only_a_bool_as_ours_do(value):
    """from_trl(bf16="no") ran in bfloat16 and use_vllm="no" with vLLM: a switch's value is checked as the config's
    own switches are (numpy's bool passes)."""
    for name in TRL_SWITCHES:
        said = "None is TRL's 'on unless fp16'" if (name, value) == ("bf16", None) else "must be True or False"
        with pytest.raises(ValueError, match=rf"^{name}: {said}"):
            from_trl(**{name: value})
    assert from_trl(use_vllm=np.bool_(False)).sampler == "transformers"


def test_two_trl_names_of_one_option_and_a_bad_choice_that_would_be_dropped_are_refused():
    for a, b in (("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap"),
                 ("vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max")):
        with pytest.raises(ValueError, match=f"^{b}: {a} names the same option"):
            from_trl(**{a: 5.0, b: 2.0})
    with pytest.raises(ValueError, match="^vllm_mode: expected one of colocate, server, got 'colocated'"):
        from_trl(use_vllm=False, vllm_mode="colocated")  # use_vllm=False drops vllm_mode, after it was checked


@pytest.mark.parametrize("argv,field", [(["--bf16", "--dtype", "float32"], "dtype"),
                                        (["--dtype=float32", "--bf16"], "dtype"),
                                        (["--sampler", "transformers", "--use-vllm"], "sampler"),
                                        (["--vllm-mode", "server", "--sampler", "transformers"], "sampler"),
                                        (["--entropy-coef", "0.2", "--entropy-coeff", "0.1"], "entropy_coef"),
                                        (["--ref-sync-steps", "32", "--sync-ref-model"], "ref_sync_steps"),
                                        (["--importance_sampling_mode", "paper", "--vllm-importance-sampling-mode",
                                          "token_mask"], "importance_sampling_mode")])
def test_an_option_under_its_own_and_trls_name_on_the_command_line_is_refused(argv, field):
    """TRL's translated options went last and won whatever the order; ``from_trl`` already refused the pair."""
    with pytest.raises(ValueError, match=f"^{field}: given both under its own name and under TRL's "
                                         + r"\(--[a-z0-9-]+\); give one"):
        translate_trl_args(argv)


def test_trls_own_spellings_of_its_options_are_read():
    """HfArgumentParser's spellings: underscores, and a switch followed by its value."""
    assert translate_trl_args(["--use_vllm"]) == ["--sampler", "vllm"]
    assert translate_trl_args(["--vllm_importance_sampling_mode", "token_mask"]) == ["--importance-sampling-mode",
                                                                                     "token_mask"]
    assert translate_trl_args(["--sync_ref_model", "--ref_model_sync_steps", "64"]) == ["--ref-sync-steps", "64"]
    assert translate_trl_args(["--bf16", "True", "--max-steps", "3"]) == ["--max-steps", "3", "--dtype", "bfloat16"]
    assert translate_trl_args(["--bf16=false"]) == ["--dtype", "float32"]
    assert translate_trl_args(["--use-vllm", "no"]) == ["--sampler", "transformers"]
    for argv in (["--bf16=maybe"], ["--bf16", "maybe"]):
        with pytest.raises(ValueError, match=r"^bf16: a switch \(--bf16 or --no-bf16\), or TRL's --bf16 true\|false; "
                                             "got 'maybe'"):
            translate_trl_args(argv)
    # the config's own switches take TRL's words too (HfArgumentParser reads every bool field so)
    assert translate_trl_args(["--use_peft", "False", "--progress=no", "--max-steps", "2"]) == [
        "--no-use-peft", "--no-progress", "--max-steps", "2"]
    assert translate_trl_args(["--no_mask_truncated_completions", "false"]) == ["--mask-truncated-completions"]
    with pytest.raises(ValueError, match="^ref_model_sync_steps: must be an integer, got 'x'"):
        translate_trl_args(["--sync-ref-model", "--ref-model-sync-steps", "x"])


@pytest.mark.parametrize("text,says", [(json.dumps({"learning_rat": 1}), r"'learning_rat' \(did you mean "
                                                                          r"'learning_rate'\?\)"),
                                       ("[1, 2]", "holds a JSON list, not an object of options"),
                                       ("{'a': 1}", "Expecting property name"),
                                       (json.dumps({"learning_rate": "fast"}), "learning_rate: must be a number")])
def test_a_config_json_that_is_not_one_is_a_value_error_naming_the_file(tmp_path, text, says):
    """A misspelt key or a list was a TypeError: a traceback when a run resumed from the file."""
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{path}: .*{says}"):
        GRPOConfig.from_json_file(path)


def test_a_seed_beyond_64_bits_a_malformed_device_and_a_group_of_none_are_refused():
    """A seed of 2**64 stopped the run at start-up ('Overflow when unpacking long long'); 'cuda:x' was accepted;
    optim=None quietly gave the default group."""
    assert GRPOConfig(seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(ValueError, match=r"^seed: must lie in \[0, 2\*\*63\)"):
        GRPOConfig(seed=2**63)
    for device in ("cuda:x", "cuda:", "cuda:-1", "cuda:0:1", "gpu"):
        with pytest.raises(ValueError, match=r"^device: expected auto, cpu or cuda\[:n\]"):
            GRPOConfig(device=device)
    assert [GRPOConfig(device=d).device for d in ("auto", "cpu", "cuda", "cuda:1")] == ["auto", "cpu", "cuda", "cuda:1"]
    for build in (lambda: GRPOConfig(optim=None), lambda: GRPOConfig().replace(optim=None)):
        with pytest.raises(ValueError, match="^optim: must be a valid dictionary or instance of OptimConfig, got None"):
            build()


def test_train_refuses_what_is_not_a_config():
    from llm import train

    with pytest.raises(TypeError, match="^train\\(\\) takes a GRPOConfig .* got dict"):
        train({"learning_rate": 1e-3})


def test_a_renamed_choice_warns_where_a_user_sees_it(capsys):
    """The earlier lcb names were a DeprecationWarning, hidden by Python's default filters and, on the command line,
    by the parser's capture: now a FutureWarning, and the command prints it."""
    from runkit.cli import parse

    with pytest.warns(FutureWarning, match="'cantelli' is now called 'cantelli_unguaranteed'"):
        GRPOConfig(improvement_lcb_method="cantelli")
    cfg = parse(GRPOConfig, ["--improvement-lcb-method", "t"], prog="python -m llm train")
    assert cfg.improvement_lcb_method == "t_unguaranteed"
    assert "python -m llm train: warning: lcb method 't' is now called 't_unguaranteed'" in capsys.readouterr().err


#: TRL 1.16's GRPOConfig defaults of None (read from trl.GRPOConfig's dataclass fields in .venv-bench) for fields
#: from_trl knows, with the value meaning the same here.
TRL_NONE_DEFAULTS = {"epsilon_high": ("epsilon_high", None), "num_generations_eval": ("num_generations_eval", None),
                     "delta": ("delta", 0.0), "min_p": ("min_p", 0.0),
                     "num_completions_to_print": ("num_completions_to_print", 0), "eval_steps": ("eval_steps", 0),
                     "reward_weights": ("reward_weights", ()),
                     "vllm_importance_sampling_clip_min": ("importance_sampling_cap_min", 0.0),
                     "vllm_server_base_url": ("server_url", ""),
                     "vllm_importance_sampling_cap": ("importance_sampling_cap", GRPOConfig().importance_sampling_cap)}


@pytest.mark.parametrize("name", list(TRL_NONE_DEFAULTS))
def test_trls_none_defaults_read_as_what_they_mean_here(name):
    """from_trl(epsilon_high=None) and the like, TRL's own defaults, were refused ('must be a number, got None')."""
    field, ours = TRL_NONE_DEFAULTS[name]
    assert getattr(from_trl(**{name: None}), field) == ours
    assert from_trl(num_generations=4, num_generations_eval=None).num_generations_eval is None


@pytest.mark.parametrize("name", [n for n in TRL_NONE_DEFAULTS if TRL_NONE_DEFAULTS[n][1] is not None
                                  and n != "vllm_importance_sampling_cap"])
def test_grpoconfig_itself_reads_trls_none_as_what_it_means(name):
    """GRPOConfig(delta=None), TRL's default as a TRL user writes it on the constructor, was refused ('must be a
    number') where from_trl took it; now the field reads None as its value here, on construction and on flat
    assignment, and the config equals the default one (config.json keeps the value)."""
    field, ours = TRL_NONE_DEFAULTS[name]
    cfg = GRPOConfig(**{field: None})
    assert getattr(cfg, field) == ours and cfg == GRPOConfig()
    cfg = GRPOConfig()
    setattr(cfg, field, None)
    assert getattr(cfg, field) == ours and cfg == GRPOConfig()
    assert json.loads(cfg.to_json())[field] == (list(ours) if isinstance(ours, tuple) else ours)


@pytest.mark.parametrize("build", [from_trl, GRPOConfig], ids=["from_trl", "GRPOConfig"])
def test_the_evaluation_takes_num_generations_when_num_generations_eval_is_none(build):
    """TRL's num_generations_eval defaults to None, i.e. num_generations. from_trl(num_generations=4) evaluated with
    this config's own default of 8 completions per test prompt until 2026-11-28, and GRPOConfig(num_generations=4),
    TRL's user pattern on this constructor, until 2026-12-07: TRL's GRPOConfig takes 4. None stays None in the
    config (and its config.json); the run's evaluation spec resolves it."""
    from llm.run.specs import evaluation

    assert build(num_generations=4).num_generations_eval is None
    assert evaluation(build(num_generations=4)).generations == 4
    assert evaluation(build(num_generations=4, num_generations_eval=2)).generations == 2
    assert evaluation(build(num_generations_eval=2)).generations == 2
    assert evaluation(build()).generations == 8  # TRL's num_generations is 8, and ours
    cfg = build(num_generations=4)
    assert GRPOConfig(**json.loads(cfg.to_json())) == cfg


def test_epsilon_high_none_is_epsilon_and_the_old_minus_one_still_reads():
    """epsilon_high None (TRL's default, and now this config's) is epsilon; -1, the spelling before 2026-12-07, from a
    script or a saved config.json, reads as None; the flag takes None."""
    assert GRPOConfig().epsilon_high is None and GRPOConfig(epsilon=0.3).clip_high == 0.3
    assert GRPOConfig(epsilon_high=-1).epsilon_high is None and GRPOConfig(epsilon_high=-1.0).clip_high == 0.2
    assert GRPOConfig(epsilon_high=0.28).clip_high == 0.28
    assert GRPOConfig.model_validate({"epsilon_high": -1.0}) == GRPOConfig()
    with pytest.raises(ValueError, match="epsilon_high"):
        GRPOConfig(epsilon_high=-0.5)
    assert from_trl(report_to="wandb").report_to == ("wandb",)  # TRL takes one tracker's name as a string


def test_trls_options_without_a_field_here_say_what_does_their_work():
    """from_trl(num_train_epochs=1) suggested num_iterations and generation_kwargs generator_kwargs (reasoning-gym's):
    unrelated options. Each of TRL's options without a field here names its counterpart, in Python and on the command
    line, as docs/trl.md's table does; scale_rewards takes TRL's True and False."""
    from pathlib import Path

    from llm.config.trl import TRL_COUNTERPARTS

    table = (Path(__file__).parents[2] / "docs" / "trl.md").read_text()
    for name, counterpart in TRL_COUNTERPARTS.items():
        assert f"`{name}`" in table, name
        with pytest.raises(TypeError, match=f"^from_trl: {name} is TRL's option; here "):
            from_trl(**{name: 1})
        with pytest.raises(ValueError, match=f"^{name}: TRL's option; here "):
            translate_trl_args(["--max-steps", "1", f"--{name}", "1"])
    assert from_trl(scale_rewards=True).scale_rewards == "group" and from_trl(scale_rewards=False).scale_rewards == "none"


def test_a_tuple_of_the_wrong_length_is_said_in_words():
    """``GRPOConfig(reward_range=(0,))`` said "must be Field required": pydantic's message for a missing item."""
    with pytest.raises(ValueError, match=r"^reward_range: must be a tuple of more items \(item 1 is missing\), "
                                         r"got \(0.0,\) \(tuple\)$"):
        GRPOConfig(reward_range=(0,))
    with pytest.raises(ValueError, match=r"^reward_range: must be a tuple of at most 2 items, got"):
        GRPOConfig(reward_range=(0, 1, 2))


def test_a_group_is_frozen_and_has_no_switch_to_turn_its_checks_off():
    """``cfg.optim._checked = False`` used to switch off every later check of the group. A group is now a frozen
    pydantic model with no private marks: nothing can be set on it, and its rules are its validator."""
    from pydantic import ValidationError

    cfg = GRPOConfig()
    for name, value in (("learning_rate", -1.0), ("learning_rat", 3)):
        with pytest.raises(AttributeError, match="^OptimConfig: 'learning_rat' is not a field|^OptimConfig is frozen"):
            setattr(cfg.optim, name, value)
    object.__setattr__(cfg.optim, "_checked", False)  # what used to switch the checks off: now read by nothing
    assert cfg.optim == GRPOConfig().optim
    with pytest.raises(ValueError, match="^learning_rate: must be > 0"):
        cfg.learning_rate = -1.0
    with pytest.raises(ValidationError, match="learning_rate: must be > 0"):  # pydantic's own entry, its own error
        cfg.optim.model_validate({**cfg.optim.model_dump(), "learning_rate": -1.0})


def test_an_error_about_an_option_given_under_trls_name_names_it_as_typed(capsys):
    """from_trl(importance_sampling_level="sequence", loss_type="dapo") said "ratio_level: ..., got
    'sequence_normalised'": neither the name nor the value the user wrote. The message now starts with what was typed,
    in Python and on the command line, and names the field here; an option given under its own name is unchanged."""
    from llm.commands.train import main

    with pytest.raises(ValueError, match=r"^importance_sampling_level='sequence' \(here ratio_level\): sequence-level"):
        from_trl(importance_sampling_level="sequence", loss_type="dapo")
    with pytest.raises(ValueError, match=r"^vllm_importance_sampling_clip_max=-3.0 \(here importance_sampling_cap\): "
                                         r"must be > 0, got -3.0$"):
        from_trl(vllm_importance_sampling_clip_max=-3.0)
    with pytest.raises(ValueError, match=r"^importance_sampling_cap: must be > 0"):
        from_trl(importance_sampling_cap=-3.0)
    for argv, want in [(["--importance_sampling_level=sequence", "--loss-type", "dapo"],
                        "error: --importance-sampling-level sequence (here ratio_level): sequence-level"),
                       (["--clip-ratio-high", "20"], "error: --clip-ratio-high 20 (here epsilon_high): must lie in"),
                       (["--epsilon-high", "20"], "error: epsilon_high: must lie in"),
                       (["--clip-ratio-high", "abc"], "error: --clip-ratio-high (here --epsilon-high): must be None or a "
                                                      "number, got 'abc'")]:
        with pytest.raises(SystemExit):
            main(argv)
        assert want in capsys.readouterr().err, argv
    with pytest.raises(ValueError, match=r"^importance_sampling_level: missing value \(--importance-sampling-level "
                                         r"VALUE\)$"):  # it took the next option as its value
        translate_trl_args(["--importance-sampling-level", "--max-steps", "1"])


@pytest.mark.parametrize("name,hint", [("importance_sampling_level", "TRL's name for ratio_level: llm.config.from_trl("
                                        "...) and the command line take it; importance_sampling_level='sequence' is "
                                        "ratio_level='sequence_normalised'"),
                                       ("bf16", "TRL's name for dtype: llm.config.from_trl(...) and the command line take "
                                                "it; bf16=True is dtype='bfloat16', bf16=False is dtype='float32'"),
                                       ("vllm_mode", "vllm_mode='colocate' is sampler='vllm'"),
                                       ("num_train_epochs", "TRL's option; here none: a run is --max-steps long")])
def test_trls_names_in_the_constructor_say_where_they_go(name, hint):
    """GRPOConfig(importance_sampling_level=...) suggested importance_sampling_mode, an unrelated option: TRL's names
    are taken by from_trl and the command line (issue 80's two edges), and the constructor now says so."""
    with pytest.raises(TypeError, match=f"^unexpected option '{name}' \\(.*{re.escape(hint)}"):
        GRPOConfig(**{name: "sequence"})
    with pytest.raises(AttributeError, match=re.escape(hint)):
        GRPOConfig().__setattr__(name, "sequence")


def test_every_trl_option_on_the_trl_page_is_known_to_the_config():
    """docs/trl.md has a row for every field of TRL's GRPOConfig (tests/contracts/test_docs.py); each must reach the
    config as a field, one of TRL's names or switches, or a counterpart that says what does its work. A helper's trial
    found 21 without: the constructor suggested unrelated options for some (vllm_max_model_length ->
    max_completion_length, ds3_gather_for_generation -> window_generation)."""
    from pathlib import Path

    from llm.config.grpo import FIELD_GROUP, TOP_FIELDS
    from llm.config.trl import TRL_COUNTERPARTS, TRL_NAMES

    rows = [line for line in (Path(__file__).parents[2] / "docs" / "trl.md").read_text().splitlines()
            if re.match(r"\| `[a-z0-9_]+`", line)]
    names = [re.match(r"\| `([a-z0-9_]+)`", line).group(1) for line in rows]
    assert len(names) >= 80
    known = {*TOP_FIELDS, *FIELD_GROUP, *TRL_NAMES, *TRL_SWITCHES, *TRL_COUNTERPARTS}
    assert [n for n in names if n not in known] == []
    for name in TRL_COUNTERPARTS:
        with pytest.raises(TypeError, match=f"^unexpected option '{name}' \\(TRL's option; here "):
            GRPOConfig(**{name: 1})


def test_a_trl_cap_without_a_mode_warns_that_nothing_reads_it(capsys, monkeypatch):
    """TRL's vllm_importance_sampling_clip_max acts under TRL's default mode sequence_mask; here the default is the
    paper's exact weight, which reads no cap, so the cap silently changed nothing. It still loads (a saved from_trl
    dict of this shape, tests/data/before_groups), with a warning, in Python and on the command line; with a mode
    given, no warning."""
    import warnings

    from llm.commands.train import main

    with pytest.warns(UserWarning, match=r"^vllm_importance_sampling_clip_max=2.0 is read by TRL's default mode "
                                         r"sequence_mask; here the default mode is paper"):
        assert from_trl(vllm_importance_sampling_clip_max=2.0).importance_sampling_cap == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_trl(vllm_importance_sampling_clip_max=2.0, vllm_importance_sampling_mode="sequence_mask")
        from_trl(vllm_importance_sampling_cap=2.0, importance_sampling_mode="token_truncate")
        from_trl(importance_sampling_cap=2.0)  # this project's own name: its meaning is this project's
        with pytest.raises(ValueError, match="must lie in"):  # a refused cap: the refusal alone, no warning before it
            from_trl(vllm_importance_sampling_clip_min=-1.0)
    import llm.run.trainer

    def stop(config):  # the command line parsed: no run
        raise SystemExit(0)

    monkeypatch.setattr(llm.run.trainer, "train", stop)
    for argv, warned in [(["--vllm-importance-sampling-clip-max", "2"], True),
                         (["--vllm_importance_sampling_clip_max=2", "--vllm-importance-sampling-mode", "token_mask"], False),
                         (["--vllm-importance-sampling-cap", "2", "--no-vllm-importance-sampling-correction"], False)]:
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert ("warning: --vllm-importance-sampling-clip-max 2 is read by TRL's default mode" in err) == warned, err
    with pytest.raises(SystemExit):
        main(["--vllm-importance-sampling-clip-min", "-1"])
    err = capsys.readouterr().err
    assert "error: --vllm-importance-sampling-clip-min -1" in err and "warning" not in err, err


def test_one_tracker_given_as_a_string_is_a_tuple_of_it():
    """TRL's GRPOConfig(report_to="wandb"): from_trl took it, GRPOConfig refused it ('must be a tuple')."""
    assert GRPOConfig(report_to="wandb").report_to == ("wandb",) == from_trl(report_to="wandb").report_to
    with pytest.raises(ValueError, match="report_to"):
        GRPOConfig(report_to="wanbd")


def test_cispo_refuses_a_zero_cap_and_warns_of_one_below_1():
    """CISPO's epsilon_high caps pi/pi_k: 0 zeroes every gradient (it was accepted); None leaves it at epsilon = 0.2,
    TRL's computation too, which scales every gradient by 0.2: a warning, not a change of meaning."""
    cispo = dict(loss_type="cispo", importance_sampling_mode="token_truncate")
    with pytest.raises(ValueError, match="epsilon_high: with cispo"):
        GRPOConfig(epsilon_high=0.0, **cispo)
    with pytest.warns(UserWarning, match="below 1"):
        assert GRPOConfig(**cispo).clip_high == 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GRPOConfig(epsilon_high=5.0, **cispo).clip_high == 5.0
        assert GRPOConfig(epsilon_high=0.0).clip_high == 0.0  # the clip's own upper width may be 0


def test_trls_clip_max_none_is_no_upper_cap(tmp_path):
    """TRL 1.16: vllm_importance_sampling_clip_max=None masks (or truncates) below clip_min only, with no upper bound.
    It was refused ("must be a number"); it reads as an infinite cap, kept through config.json, and the loss drops
    only the weights below the lower cap."""
    import json
    import math

    import torch

    from llm.tensors.loss import Clip, grpo_loss

    c = from_trl(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.5,
                 vllm_importance_sampling_clip_max=None)
    assert c.importance_sampling_cap == math.inf and c.importance_sampling_cap_min == 0.5
    assert GRPOConfig(**json.loads(c.to_json())) == c
    assert GRPOConfig(importance_sampling_cap=None).importance_sampling_cap == math.inf
    from llm.config.trl import translate_trl_args
    from runkit.cli import parse

    argv = translate_trl_args(["--vllm-importance-sampling-clip-max", "None", "--vllm-importance-sampling-mode",
                               "token_mask", "--vllm-importance-sampling-clip-min", "0.5"])
    assert parse(GRPOConfig, argv, prog="python -m llm train") == c  # the command line as TRL's CLI writes it
    with pytest.raises(ValueError, match="importance_sampling_cap: must be > 0, got nan"):
        GRPOConfig(importance_sampling_cap=float("nan"))
    w = torch.tensor([0.3, 1.0, 50.0], dtype=torch.float64)
    logp = torch.zeros(3, 1, dtype=torch.float64, requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), -torch.log(w)[:, None], torch.ones(3, dtype=torch.float64),
                            torch.ones(3, 1, dtype=torch.float64),
                            clip=Clip(epsilon=0.2, importance_sampling_mode="token_mask",
                                      importance_sampling_cap=math.inf, importance_sampling_cap_min=0.5))
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(-grad[:, 0], torch.tensor([0.0, 1.0, 50.0], dtype=torch.float64))
    assert stats.metrics()["is_correction/frac_above_cap"] == pytest.approx(1 / 3)

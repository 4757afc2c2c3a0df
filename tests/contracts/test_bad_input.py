"""Bad input: fuzzed command lines, data files, reward functions, model paths. Every one is refused in one line
naming what is wrong, or runs."""

import dataclasses
import importlib
import json
import re
import typing
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from grpo_theory.simulate import SimConfig
from llm import GRPOConfig
from llm.config import GROUPS, flat_fields
from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from llm.rewards import text_reward
from llm.sampling.launch import ServeConfig
from llm.tasks.sources import load_task
from tests.helpers import run_cli


class ReachedModelLoading(Exception):
    """Raised in place of loading the model: every check before it passed."""


def assert_one_line_error(status: int, stderr: str, prog: str, names: list[str]) -> None:
    progress = re.compile(r"^\s*\d+%\|.*\]$")  # tqdm's bar of a run that had started (each redraw ends in ']')
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not progress.match(ln)]
    assert status == 2, (status, stderr)
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    text = lines[0]
    assert any(n in text for n in names) or "Unrecognized options" in text or "Missing value" in text, text


# ----------------------------------------------------------------------------------------------
# Fuzzed configurations
# ----------------------------------------------------------------------------------------------

FLOATS = st.one_of(st.floats(0, 1).map(repr), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["-0.0", "1e-300", "1e300", "abc", ""]))


INTS = st.one_of(st.integers(1, 8).map(str), st.integers(-3, 40).map(str), st.sampled_from(["1.5", "nan", "x", "-1", "0", ""]))


def _option(name: str, tp, strings: dict) -> st.SearchStrategy:
    """(args, invalid) for one field of type ``tp``: ``invalid`` True when the value is certainly not acceptable."""
    flag = "--" + name.replace("_", "-")
    if name in strings:
        return strings[name].map(lambda v: ([flag, v], False))
    if tp is bool:
        return st.sampled_from([([flag], False), (["--no-" + flag[2:]], False), ([flag, "maybe"], True)])
    if typing.get_origin(tp) is typing.Literal:
        return st.sampled_from([([flag, c], False) for c in typing.get_args(tp)] + [([flag, "bogus"], True)])
    if tp is int:
        return INTS.map(lambda v: ([flag, v], v in ("1.5", "nan", "x", "")))
    if tp is float:
        return FLOATS.map(lambda v: ([flag, v], v in ("nan", "inf", "-inf", "abc", "")))
    return st.text(max_size=8).map(lambda v: ([flag, v], False))


def _options_of(cls) -> list[tuple[str, type]]:
    """(field, type) for every option of the config ``cls`` (a GRPOConfig's flat fields, through its groups), the
    annotations resolved in the module that declares them."""
    if cls is GRPOConfig:
        hints = {"": typing.get_type_hints(GRPOConfig), **{g: typing.get_type_hints(c) for g, c in GROUPS.items()}}
        return [(name, hints[g][name]) for g, name, _ in flat_fields()]
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]


def _args(cls, strings: dict, exclude=()) -> st.SearchStrategy:
    fields = [(name, tp) for name, tp in _options_of(cls) if name not in exclude]
    named = [_option(name, tp, strings).map(lambda o, n=name: (n, o)) for name, tp in fields]
    options = st.lists(st.one_of(*named), max_size=4, unique_by=lambda o: o[0]).map(lambda os: [o[1] for o in os])
    extra = st.sampled_from([([], False), (["--no-such-option", "1"], True), (["positional"], True)])
    # the extra arguments go first: after an option of a tuple field they would be read as more of its values
    return st.tuples(options, extra).map(lambda t: ([a for o in [t[1]] + t[0] for a in o[0]],
                                                    any(o[1] for o in t[0] + [t[1]])))


def _field_names(cls) -> list[str]:
    names = [name for name, _ in _options_of(cls)]
    return names + ["--" + n.replace("_", "-") for n in names]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "ok.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    (d / "bad.jsonl").write_text('{"question": "q"}\n')
    (d / "empty.jsonl").write_text("")
    (d / "text_answer.jsonl").write_text(json.dumps({"question": "q", "answer": "#### seven"}) + "\n")
    (d / "a_file").write_text("x")
    return d


@pytest.mark.slow
@given(data=st.data())
@settings(max_examples=150)
def test_fuzzed_trainer_command_lines_are_accepted_or_refused_in_one_line(files, data):
    """Random command lines of ``python -m llm.train`` (values of every field, valid or not, unknown options,
    files that are missing, empty or malformed, an output_dir that is a file): each either passes every check
    up to loading the model or exits 2 with one line naming the field; certainly invalid values exit 2."""
    d = str(files)
    strings = {
        "dataset": st.sampled_from(["arithmetic", f"{d}/ok.jsonl", f"{d}/bad.jsonl", f"{d}/empty.jsonl",
                                    f"{d}/text_answer.jsonl", f"{d}/missing.jsonl", "nonsense", ""]),
        "eval_dataset": st.sampled_from(["", f"{d}/ok.jsonl", f"{d}/bad.jsonl"]),
        "reward_fn": st.sampled_from(["", "no_such_module:f", "os:getcwd", "os:sep", "justtext", "llm.tasks:nothing"]),
        "output_dir": st.sampled_from([f"{d}/run", f"{d}/a_file", f"{d}/a_file/sub", ""]),
        "model_name_or_path": st.sampled_from(["", f"{d}/missing_model"]),
        "server_url": st.sampled_from(["", "http://127.0.0.1:1", "ftp://x", "x"]),
        "device": st.sampled_from(["auto", "cpu", "cuda:0", "tpu", ""]),
        "report_to": st.sampled_from(["none", "tensorboard", "wandb", "trackio", "bogus"]),  # none started
    }
    argv, invalid = data.draw(_args(GRPOConfig, strings))
    argv = ["--output-dir", f"{d}/run", "--no-progress", *argv]

    train_cli = importlib.import_module("llm.commands.train")

    with mock.patch("llm.models.pretrained.resolve_model_path", side_effect=ReachedModelLoading):
        try:
            status, _, err = run_cli(train_cli.main, "python -m llm train", argv)
        except ReachedModelLoading:
            assert not invalid, argv
            event("reached model loading")
            return
    event("refused")
    assert_one_line_error(status, err, "python -m llm train", _field_names(GRPOConfig))


@pytest.mark.slow
@given(data=st.data())
@settings(max_examples=150)
def test_fuzzed_simulator_command_lines_run_or_are_refused_in_one_line(data):
    """``python -m grpo_theory.simulate`` with random values (small sizes and at most 4 steps, so every valid
    example runs to the end): exit 0 or 1 (1: the bound was violated, which must not happen) or 2 with one line
    naming the field."""
    small = st.one_of(st.integers(-2, 12).map(str), st.sampled_from(["x", "2.5"]))
    strings = {name: small for name in ("n_prompts", "n_actions", "prompts_per_step", "num_generations",
                                        "num_iterations", "sync_period", "ref_sync_steps")}
    strings["max_steps"] = st.one_of(st.integers(-1, 4).map(str), st.just("y"))
    argv, invalid = data.draw(_args(SimConfig, strings, exclude=("output_dir",)))
    argv = ["--max-steps", "3", *argv]  # a drawn --max-steps comes later and wins; without one, 3 steps, not 200

    from grpo_theory import simulate

    status, _, err = run_cli(simulate.main, "python -m grpo_theory.simulate", argv)
    if status == 0:
        assert not invalid, argv
        event("ran")
        return
    event("refused")
    assert status != 1, f"bound violated for {argv}"
    assert_one_line_error(status, err, "python -m grpo_theory.simulate", _field_names(SimConfig))


@given(data=st.data())
@settings(max_examples=60)
def test_fuzzed_server_launcher_command_lines_are_checked_before_starting(data):
    """``python -m llm serve``: every field is checked before vLLM is started."""
    argv, invalid = data.draw(_args(ServeConfig, {"model": st.sampled_from(["", "/nonexistent/model"]),
                                                  "host": st.sampled_from(["127.0.0.1", ""]),
                                                  "extra_args": st.just("")}))
    from llm.commands import serve

    with mock.patch.object(serve, "ServerProcess", side_effect=ReachedModelLoading):
        try:
            status, _, err = run_cli(serve.main, "python -m llm serve", argv)
        except ReachedModelLoading:
            assert not invalid, argv
            return
    assert_one_line_error(status, err, "python -m llm serve", _field_names(ServeConfig) + ["model"])


def _typed_fields(cls, tp) -> list[str]:
    return [name for name, hint in _options_of(cls) if hint is tp]


CLIS = {"trainer": (GRPOConfig, "llm.commands.train", "python -m llm train"),
        "simulator": (SimConfig, "grpo_theory.simulate", "python -m grpo_theory.simulate"),
        "server": (ServeConfig, "llm.commands.serve", "python -m llm serve")}


@pytest.mark.parametrize("cli,field,value", [
    (cli, f, v) for cli, (cls, _, _) in CLIS.items() for f in _typed_fields(cls, float) for v in ("nan", "inf", "-inf")
] + [(cli, f, v) for cli, (cls, _, _) in CLIS.items() for f in _typed_fields(cls, int) for v in ("1.5", "x")])
@pytest.mark.slow
def test_every_number_field_refuses_non_finite_and_non_numeric_values(tmp_path, cli, field, value):
    """Field by field (the fuzz above mixes them): nan, inf, -inf for every float and a non-integer for every
    int exit 2 with one line naming that field."""
    cls, module, prog = CLIS[cli]
    flag = "--" + field.replace("_", "-")
    base = ["--output-dir", str(tmp_path / "run")] if cli != "server" else []
    with mock.patch("llm.models.pretrained.resolve_model_path", side_effect=ReachedModelLoading), \
            mock.patch("llm.commands.serve.ServerProcess", side_effect=ReachedModelLoading):
        status, _, err = run_cli(importlib.import_module(module).main, prog, [*base, flag, value])
    assert_one_line_error(status, err, prog, [field, flag])
    assert field in err or flag in err, err


# ----------------------------------------------------------------------------------------------
# Data and reward functions
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content,match", [
    ("", "holds no rows"),
    ("\n\n", "holds no rows"),
    ('{"question": "q", "answer": "#### 1"}\n{"question": "q"\n', r"bad.jsonl:2: not valid JSON"),
    ('{"question": "q", "answer": "#### 1"}\n[1, 2]\n', r"bad.jsonl:2: expected a JSON object, got a list"),
    ('[1, 2]\n', r"bad.jsonl has columns \['text'\]; expected a 'prompt' column"),
    ('{"question": "q"}\n', r"bad.jsonl has columns \['question'\]; expected a 'prompt' column"),
    ('{"question": 5, "answer": "#### 5"}\n', r"bad.jsonl: row 1: expected a 'question' string"),
    ('{"question": "q", "answer": 5}\n', r"bad.jsonl: row 1: .*must be a string ending with"),
    ('{"question": "q", "answer": "#### 1"}\n{"question": "q2"}\n', r"bad.jsonl: row 2: .*must be a string ending"),
    ('{"question": "q", "answer": "####  "}\n', r"bad.jsonl: row 1: .*empty"),
    ('{"question": "q", "answer": "#### seven"}\n', r"answer of row 1 \('seven'\) cannot be read by --answer-check"),
    ('{"prompt": 3}\n', r"bad.jsonl: row 1: the prompt must be a string or a non-empty list of messages"),
    ('{"prompt": [{"role": "user"}]}\n', r"bad.jsonl: row 1: the prompt must be"),
    ('{"prompt": "p", "answer": [1]}\n', r"bad.jsonl: row 1: the answer must be a string or a number"),
    ('{"prompt": "p"}\n', r"has no 'answer' column, which the default reward"),
])
def test_bad_data_files_are_refused_naming_the_row(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match="dataset: .*" + match):
        load_task(str(path))
    with pytest.raises(ValueError, match="dataset: expected 'arithmetic'"):
        load_task("nonsense")


def test_a_text_answer_is_accepted_with_a_users_reward_function(tmp_path, monkeypatch):
    (tmp_path / "words.py").write_text("def same(completion, answer):\n    return float(completion == answer)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "text.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### seven"}) + "\n")
    assert load_task(str(path), "words:same").answers == ("seven",)


def _raises(c, a):
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize("fn,match", [
    (_raises, r"raised ZeroDivisionError: boom for completion 'c1'"),
    (lambda c, a: float("nan"), r"returned nan"),
    (lambda c, a: float("inf"), r"got inf for completion 'c1'"),
    (lambda c, a: -0.5, r"got -0.5 for completion 'c1'"),
    (lambda c, a: 1.5, r"got 1.5 for completion 'c1'"),
    (lambda c, a: "1", r"returned a str \('1'\) for completion 'c1'"),
    (lambda c, a: None, r"returned a NoneType"),
    (lambda c, a: [1.0, 0.0], r"returned 2 values for completion 'c1'"),
    (lambda c, a: np.array([0.5, 0.5, 1.0]), r"returned 3 values"),
])
def test_misbehaving_reward_functions_are_named_with_the_completion(fn, match):
    with pytest.raises(ValueError, match="reward_fn: .*" + match + r".*\(answer '7'\)"):
        text_reward(fn, "c1", "7")


@pytest.mark.parametrize("value", [0, 1, True, 0.25, np.float32(0.5), np.float64(1.0), np.array(0.5), torch.tensor(0.75)])
def test_well_behaved_rewards_of_any_numeric_type_pass(value):
    assert text_reward(lambda c, a: value, "c", "a") == float(value)


# ----------------------------------------------------------------------------------------------
# Models and prompts
# ----------------------------------------------------------------------------------------------


def test_model_paths_without_a_model_or_a_tokenizer_are_refused(tmp_path):
    src = tiny_model_dir()
    no_tok = tmp_path / "no_tokenizer"
    no_tok.mkdir()
    for f in src.iterdir():
        if f.is_file() and "token" not in f.name:
            (no_tok / f.name).write_bytes(f.read_bytes())
    (tmp_path / "a_file").write_text("x")
    cases = [(str(tmp_path / "missing"), "no model directory"), (str(tmp_path / "a_file"), "no model directory"),
             (str(no_tok), "holds no tokenizer"), (str(tmp_path), "cannot load a tokenizer|holds no tokenizer")]
    for path, match in cases:
        with pytest.raises(ValueError, match="model_name_or_path: .*(" + match + ")"):
            load_policy(path, torch.device("cpu"))


def test_an_attention_kernel_that_cannot_load_is_refused_in_one_line():
    """flash_attention_2 without its package (and without CUDA): one line naming the field, not a traceback."""
    with pytest.raises(ValueError, match=r"^attn_implementation: flash_attention_2 cannot be used here \([^\n]+\)$"):
        load_policy(str(tiny_model_dir()), torch.device("cpu"), attn_implementation="flash_attention_2")


def test_a_prompt_longer_than_the_models_context_is_refused_at_start_up(tmp_path):
    from llm import train

    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"question": "1+2+" * 40, "answer": "#### 3"}) + "\n")
    cfg = GRPOConfig(dataset=str(path), output_dir=str(tmp_path / "run"), sampler="transformers", progress=False,
                     max_steps=1)
    with pytest.raises(ValueError, match=r"max_completion_length: the longest prompt \(\d+ tokens\) plus 6 generated "
                                         r"exceed the model's 64 positions"):
        train(cfg, log=lambda *a: None)


# ----------------------------------------------------------------------------------------------
# Trust boundaries
# ----------------------------------------------------------------------------------------------


def _model_with_its_own_code(tmp_path):
    """The tiny model, re-declared as an architecture whose code ships in the directory (auto_map); importing that
    code leaves a marker file."""
    d = tmp_path / "custom"
    d.mkdir()
    for f in tiny_model_dir().iterdir():
        if f.is_file():
            (d / f.name).write_bytes(f.read_bytes())
    marker = tmp_path / "code_ran"
    (d / "modeling_custom.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n"
        "class CustomConfig(Qwen2Config):\n    model_type = 'custom_qwen2'\n"
        "class CustomForCausalLM(Qwen2ForCausalLM):\n    config_class = CustomConfig\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="custom_qwen2", architectures=["CustomForCausalLM"],
               auto_map={"AutoConfig": "modeling_custom.CustomConfig",
                         "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    (d / "config.json").write_text(json.dumps(cfg))
    return d, marker


def test_code_shipped_with_a_model_runs_only_with_trust_remote_code(tmp_path):
    d, marker = _model_with_its_own_code(tmp_path)
    with pytest.raises(ValueError, match="model_name_or_path: cannot load .*runs only with --trust-remote-code"):
        load_policy(str(d), torch.device("cpu"))
    assert not marker.exists()
    model, _ = load_policy(str(d), torch.device("cpu"), trust_remote_code=True)
    assert marker.exists() and type(model).__name__ == "CustomForCausalLM"


def test_checkpoints_load_without_running_code_from_the_file(tmp_path):
    """A checkpoint.pt that would run code when unpickled is refused in one line (weights_only=True)."""
    import os

    cfg = GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", progress=False)
    (tmp_path / "run").mkdir()
    torch.save({"step": 1, "payload": os.system}, tmp_path / "run" / "checkpoint.pt")  # a callable: not weights
    from llm.run.rundir import RunDir

    with pytest.raises(ValueError, match=r"output_dir: .*checkpoint.pt cannot be loaded \(UnpicklingError"):
        RunDir(cfg).open()


@pytest.mark.parametrize("name,weights,match", [
    ("wrong_length", None, r"wrong_length returned 1 values for 2 completions"),
    ("text", None, r"text returned 'high' for completion"),
    ("boom", None, r"boom raised KeyError: \"no column 'solution'\""),
    ("only_even", [1.0], r"every reward source returned None for completion"),
])
def test_misbehaving_reward_functions_are_one_line(reward_module, tokenizer, name, weights, match):
    task = load_task("arithmetic", reward_funcs=[f"{reward_module}:{name}"], reward_weights=weights or [])
    bound = task.bind(tokenizer)
    idx = [0, 1] if name != "only_even" else [i for i, a in enumerate(task.answers) if int(a) % 2][:2]
    comps = [task.answers[i] for i in idx]
    with pytest.raises(ValueError, match="^reward_funcs: " + match) as err:
        bound.score(idx, comps, [[5, 1]] * 2)
    assert "\n" not in str(err.value)


def test_help_into_a_closed_pipe_ends_without_a_traceback():
    """``python -m llm.train --help | head -2`` printed a BrokenPipeError traceback: the reader is gone before the
    command writes (its pipe's read end closed at once)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        res = subprocess.run([sys.executable, "-m", "llm.train", "--help"], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(write)
    assert res.returncode == 1 and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr


@pytest.mark.parametrize("argv,says", [
    (["--learning-rat", "1e-3"], "Unrecognized options: --learning-rat, 1e-3 (did you mean --learning-rate?)"),
    (["--lerning-rate", "1", "--num-generatons", "4"], "--num-generatons: did you mean --num-generations"),
    (["--use-peft", "maybe"], "use_peft: a switch (--use-peft or --no-use-peft), or TRL's --use-peft true|false; "
                              "got 'maybe'"),
    (["--max-steps", "3", "extra"], "Unrecognized options: extra (see --help)"),
    (["--max-steps", "2", "--foo", "2"], "Unrecognized options: --foo, 2 (see --help)")])
def test_an_unknown_option_gets_the_nearest_names_and_a_switchs_value_says_how_switches_go(argv, says):
    """tyro's suggestions ("Perhaps you meant", "Arguments similar to") were cut from the one line, and a value after
    a switch was only "Unrecognized options: no" (TRL's words after a switch are read: tests/llm/test_config_types);
    no hint where the value follows an option that takes one."""
    from llm.commands import train as train_cli

    status, _, err = run_cli(train_cli.main, "python -m llm train", argv)
    assert status == 2 and says in err, err
    assert_one_line_error(status, err, "python -m llm train", _field_names(GRPOConfig))


def test_a_value_after_a_switch_of_the_simulator_says_how_switches_go():
    from grpo_theory import simulate

    status, _, err = run_cli(simulate.main, "python -m grpo_theory.simulate", ["--max-steps", "2", "--population", "2"])
    assert status == 2 and "Unrecognized options: 2 (--population is a switch: --population or --no-population, " \
                            "without a value)" in err, err


@pytest.mark.parametrize("argv,line", [
    (["--max-steps", "0"], "max_steps: must be >= 1, got 0"),
    (["--num-generations", "1"], "num_generations: a group needs G >= 2 completions, got 1"),
    (["--max-completion-length", "8.5"], "--max-completion-length: must be None or an integer, got '8.5'"),
    (["--num-generations", "8.5"], "--num-generations: must be an integer, got '8.5'"),
    (["--learning-rate", "abc"], "--learning-rate: must be a number, got 'abc'")])
def test_a_bad_value_reads_as_the_configs_own_line_without_the_parsers_words(argv, line):
    """tyro prefixed the config's line with its group ('Error parsing sampling: num_generations: ...') and said a
    union's value in its own terms ('no type matching {None}|INT could be instantiated from ...')."""
    from llm.commands import train as train_cli

    status, _, err = run_cli(train_cli.main, "python -m llm train", argv)
    assert err == f"python -m llm train: error: {line} (see --help)\n", err

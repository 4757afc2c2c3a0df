"""Tasks, rewards, config validation and the command line of the trainer."""

import json
import subprocess
import sys

import numpy as np
import pytest

from llm import GRPOConfig
from llm.tasks import arithmetic_task, load_task, numeric_reward, parse_number

PY = sys.executable


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from llm.tiny import tiny_model_dir

    return AutoTokenizer.from_pretrained(tiny_model_dir())


def test_arithmetic_task_has_a_fixed_disjoint_split():
    task, again = arithmetic_task(), arithmetic_task()
    assert len(task.prompts) == 160 and len(task.test_prompts) == 40
    assert task.prompts == again.prompts and task.test_prompts == again.test_prompts
    assert not set(task.prompts) & set(task.test_prompts)
    assert len(set(task.prompts) | set(task.test_prompts)) == 200
    for prompt, answer in zip(task.prompts + task.test_prompts, task.answers + task.test_answers):
        a, b = prompt.rstrip("=").split("+")
        assert answer == str(int(a) + int(b))
    assert task.has_exact_j


def test_arithmetic_reward_is_the_exact_answer_tokens_then_eos(tokenizer):
    """Scored on tokens: the answer's tokens followed by EOS score 1; a completion cut before EOS, a longer
    number, or one whose text decodes to the answer only because special tokens are dropped scores 0 (the
    exact J counts none of them). (The tiny tokenizer drops whitespace when encoding, so "20\\n" is "20".)"""
    bound = arithmetic_task().bind(tokenizer)
    i = bound.task.answers.index("20")
    eos = tokenizer.eos_token_id
    ids = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    pad = tokenizer.pad_token_id
    completions = [ids("20") + [eos], ids("20"), ids("200") + [eos], ids("2") + [eos] + ids("0"),
                   ids("2") + [pad] + ids("0") + [eos]]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    assert texts[-1] == "20"  # the text reward would have scored it 1
    assert list(bound.score([i] * len(completions), texts, completions)) == [1, 0, 0, 0, 0]
    assert bound.accepted_ids[i] == [ids("20") + [eos]]
    assert bound.max_accepted_length == 3  # two digits and EOS


def test_gsm8k_jsonl_loader_and_numeric_reward(tmp_path, tokenizer):
    path = tmp_path / "tiny_gsm8k.jsonl"
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "What is 1,000 + 234?", "answer": "#### 1,234"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = load_task(str(path), eval_dataset=str(path))
    assert task.answers == ("7", "1234") and task.test_answers == task.answers and not task.has_exact_j
    assert task.prompts[0].startswith("Question: Tom has 3 apples")
    texts = ["so the answer is 7.", "It is 1,234", "8"]
    assert list(task.bind(tokenizer).score([0, 1, 0], texts, [[]] * 3)) == [1, 1, 0]
    assert parse_number("a -3.5 b 12") == 12 and parse_number("none") is None
    assert numeric_reward("7.0", "7") == 1.0
    with pytest.raises(ValueError, match="eval_dataset: the task arithmetic has its own test split"):
        load_task("arithmetic", eval_dataset=str(path))


def test_bad_dataset_rows_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl has columns \['question'\]; expected a 'prompt' column"):
        load_task(str(path))
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: row 2: .*####"):
        load_task(str(path))
    with pytest.raises(ValueError, match="dataset: expected"):
        load_task("nonsense")


def test_user_reward_function_by_import_path(tmp_path, monkeypatch, tokenizer):
    (tmp_path / "my_rewards.py").write_text("def half(completion, answer):\n    return 0.5\n"
                                            "def bad(completion, answer):\n    return 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task("arithmetic", "my_rewards:half")
    assert not task.has_exact_j  # a user's reward replaces the accepted set, and with it the exact J
    assert np.all(task.bind(tokenizer).score([0, 1], ["1", "2"], [[], []]) == 0.5)
    with pytest.raises(ValueError, match=r"reward_fn: rewards must lie in \[0, 1\] .*got 2.0 for completion '1'"):
        load_task("arithmetic", "my_rewards:bad").bind(tokenizer).score([0], ["1"], [[]])
    with pytest.raises(ValueError, match="reward_fn: cannot import"):
        load_task("arithmetic", "my_rewards:missing")


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


@pytest.mark.parametrize("args,needle", [
    (["--num-generations", "1"], "num_generations: a group needs G >= 2"),
    (["--sync-period", "x"], "--sync-period"),
    (["--no-such-flag"], "Unrecognized options"),
    (["--loss-type", "ppo"], "--loss-type"),
])
def test_cli_errors_are_one_line(args, needle):
    res = subprocess.run([PY, "-m", "llm.train", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr


def test_cli_help_documents_fields():
    res = subprocess.run([PY, "-m", "llm.train", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0
    for flag in ("--sync-period", "--num-iterations", "--mask-zero-std-groups", "--behaviour-logprobs", "--epsilon"):
        assert flag in res.stdout


def test_theory_cli_error_is_one_line():
    res = subprocess.run([PY, "-m", "grpo_theory.check", "--n", "0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "n: need at least one" in res.stderr


@pytest.mark.parametrize("order", ["function first", "command module first"])
def test_llm_train_is_callable_whatever_was_imported(order, tmp_path):
    """``llm.train(config)`` runs in a process that also imported the command module ``llm.train``."""
    imports = ("import llm; import llm.train" if order == "command module first"
               else "import llm; f = llm.train; import llm.train; assert f is not None")
    code = (f"{imports}\n"
            f"from llm import GRPOConfig\n"
            f"cfg = GRPOConfig(output_dir={str(tmp_path / 'run')!r}, max_steps=1, prompts_per_step=2, sampler='transformers', progress=False)\n"
            f"print('RUN', llm.train(cfg, log=lambda *a: None))\n"
            f"import llm.train as cli\n"
            f"assert callable(cli.main)\n")
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "RUN " in res.stdout and (tmp_path / "run" / "metrics.jsonl").is_file()


def test_python_m_llm_train_prints_no_import_warning(tmp_path):
    res = subprocess.run([PY, "-m", "llm.train", "--max-steps", "1", "--prompts-per-step", "2", "--sampler", "transformers",
                          "--no-progress", "--output-dir", str(tmp_path / "cli")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "RuntimeWarning" not in res.stderr and "seconds per step: median" in res.stdout


#: A chat template over the tiny model's characters: one "Q: ...\nA:" turn per user message.
QA_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}A:{% endif %}")


def test_chat_template_renders_every_prompt_as_a_user_turn(tmp_path, tokenizer, monkeypatch):
    """--chat-template: the prompt tokens are those of the template's rendering with the generation prompt (here
    written out by hand); a run trains on them; a tokenizer without a template is refused in one line."""
    import shutil

    from llm import train
    from llm.rundir import read_metrics
    from llm.tiny import tiny_model_dir

    model = tmp_path / "chat_model"
    shutil.copytree(tiny_model_dir(), model)
    tok = type(tokenizer).from_pretrained(model)
    tok.chat_template = QA_TEMPLATE
    tok.save_pretrained(model)
    tok = type(tokenizer).from_pretrained(model)
    task = arithmetic_task()
    bound = task.bind(tok, chat_template=True)
    for ids, text in zip(bound.prompt_ids + bound.test_prompt_ids, task.prompts + task.test_prompts):
        assert ids == tok(f"Q: {text}\nA:", add_special_tokens=False).input_ids
    assert task.bind(tok).prompt_ids == tok(list(task.prompts)).input_ids  # without the flag: as they are
    with pytest.raises(ValueError, match=r"^chat_template: the model's tokenizer has no chat template"):
        task.bind(tokenizer, chat_template=True)
    from llm.tasks import TokenizedTask

    bound_prompts, real_init = [], TokenizedTask.__init__

    def recording(self, *args, **kw):
        real_init(self, *args, **kw)
        bound_prompts.append(self.prompt_ids)

    monkeypatch.setattr(TokenizedTask, "__init__", recording)
    cfg = GRPOConfig(model_name_or_path=str(model), chat_template=True, output_dir=str(tmp_path / "run"),
                     sampler="transformers", max_steps=2, progress=False, logging_steps=100, max_completion_length=6)
    rows = read_metrics(train(cfg, log=lambda *a: None))
    assert len(rows) == 2 and "j/pi_new" in rows[-1]
    rendered = bound_prompts == [bound.prompt_ids]  # a bool: pytest's diff of 160 token lists takes minutes
    assert rendered, "the trainer's prompts are not the chat template's rendering"


REWARDS_MODULE = '''
def correct(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, completion_ids, **kwargs):
    return [1.0 if len(ids) <= 3 else 0.0 for ids in completion_ids]

def only_even(prompts, completions, answer, **kwargs):
    return [None if int(a) % 2 else 1.0 for a in answer]

def wrong_length(prompts, completions, **kwargs):
    return [0.5]

def text(prompts, completions, **kwargs):
    return ["high" for _ in completions]

def boom(prompts, completions, **kwargs):
    raise KeyError("no column 'solution'")

calls = []

def length_minus_three(prompts, completions, completion_ids, **kwargs):
    bonus = 10.0 if len(calls) == 1 else 0.0  # the second call: step 0's held-out completions
    calls.append([len(ids) - 3.0 + bonus for ids in completion_ids])
    return calls[-1]
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_batch_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_batch_rewards", raising=False)  # imported afresh, forgotten afterwards
    yield "my_batch_rewards"
    sys.modules.pop("my_batch_rewards", None)


def test_trl_signature_reward_functions_are_weighted_and_logged(reward_module, tokenizer, tmp_path):
    """--reward-funcs with --reward-weights: the reward is the weighted sum of the functions' values (None counts
    0, as in TRL), each function's values are kept for rewards/<name>/mean|std, and a run logs them."""
    from llm import train
    from llm.rundir import read_metrics
    from llm.trainer import reward_metrics

    task = load_task("arithmetic", reward_funcs=[f"{reward_module}:correct", f"{reward_module}:short",
                                                 f"{reward_module}:only_even"], reward_weights=[0.5, 0.25, 0.25])
    assert not task.has_exact_j
    bound = task.bind(tokenizer)
    idx = [0, 1, 2, 3]
    completions = [task.answers[0], "x", "not the answer", task.answers[3] + " "]
    ids = [tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for c in completions]
    r = bound.score(idx, completions, ids)
    correct = np.array([1.0, 0.0, 0.0, 1.0])
    short = np.array([len(i) <= 3 for i in ids], dtype=float)
    even = np.array([np.nan if int(task.answers[i]) % 2 else 1.0 for i in idx])
    assert np.allclose(r, 0.5 * correct + 0.25 * short + 0.25 * np.nan_to_num(even))
    m = reward_metrics(bound)
    assert m["rewards/correct/mean"] == 0.5 and m["rewards/correct/std"] == pytest.approx(np.std(correct, ddof=1))
    assert m["rewards/only_even/mean"] == pytest.approx(np.nanmean(even))  # None left out of the mean
    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", max_steps=2,
                                         progress=False, logging_steps=100, reward_funcs=(f"{reward_module}:correct",
                                         f"{reward_module}:short"), reward_weights=(0.8, 0.2)), log=lambda *a: None))
    for row in rows:  # no None here: the mean reward is the weighted sum of the functions' means
        assert row["reward"] == pytest.approx(0.8 * row["rewards/correct/mean"] + 0.2 * row["rewards/short/mean"])
        assert "j/pi_new" not in row


@pytest.mark.parametrize("name,weights,match", [
    ("wrong_length", None, r"wrong_length returned 1 values for 2 completions"),
    ("text", None, r"text returned 'high' for completion"),
    ("boom", None, r"boom raised KeyError: \"no column 'solution'\""),
    ("only_even", [1.0], r"every function returned None for completion"),
])
def test_misbehaving_reward_functions_are_one_line(reward_module, tokenizer, name, weights, match):
    task = load_task("arithmetic", reward_funcs=[f"{reward_module}:{name}"], reward_weights=weights or [])
    bound = task.bind(tokenizer)
    idx = [0, 1] if name != "only_even" else [i for i, a in enumerate(task.answers) if int(a) % 2][:2]
    comps = [task.answers[i] for i in idx]
    with pytest.raises(ValueError, match="^reward_funcs: " + match) as err:
        bound.score(idx, comps, [[5, 1]] * 2)
    assert "\n" not in str(err.value)


def test_rewards_outside_unit_range_train_and_the_bound_uses_the_range_seen(reward_module, tmp_path, capsys):
    """Rewards from -2 to 13 train; each step logs the range its bound terms used, [0, 1] widened to every training
    and held-out reward seen up to that step (both scored each step, in that order), the first widening is said
    once, and a resumed run starts from the range of the steps it keeps."""
    import importlib

    from llm import train
    from llm.rundir import read_metrics

    funcs = importlib.import_module(reward_module)
    cfg = dict(output_dir=str(tmp_path / "run"), sampler="transformers", max_steps=3, progress=False,
               logging_steps=100, heldout_prompts=2, eval_steps=0, max_completion_length=6, save_steps=1,
               reward_funcs=(f"{reward_module}:length_minus_three",))
    rows = read_metrics(train(GRPOConfig(**cfg)))
    rows += read_metrics(train(GRPOConfig(**cfg | {"max_steps": 5})))[3:]  # resumed at step 3
    assert len(funcs.calls) == 2 * len(rows) == 10
    assert min(min(c) for c in funcs.calls) < 0 and max(funcs.calls[1]) > max(max(c) for c in funcs.calls[2:])
    for k, row in enumerate(rows):
        seen = [v for c in funcs.calls[: 2 * (k + 1)] for v in c]
        assert (row["bound/reward_lo"], row["bound/reward_hi"]) == (min(0.0, *seen), max(1.0, *seen)), k
        assert np.isfinite(row["heldout/bound_est/lower_tight"])
    said = capsys.readouterr().out
    assert said.count("rewards outside [0, 1]") == 2  # once per process: the first run and the resumed one


def test_reward_funcs_config_errors():
    with pytest.raises(ValueError, match="reward_funcs: give either --reward-fn"):
        GRPOConfig(reward_fn="a:b", reward_funcs=("a:c",))
    with pytest.raises(ValueError, match=r"reward_weights: needs one weight per reward function \(2\)"):
        GRPOConfig(reward_funcs=("a:b", "a:c"), reward_weights=(1.0,))
    with pytest.raises(ValueError, match="reward_weights: must be finite"):
        GRPOConfig(reward_funcs=("a:b",), reward_weights=(float("nan"),))
    with pytest.raises(ValueError, match="reward_funcs: cannot import 'no_such_module:f'"):
        load_task("arithmetic", reward_funcs=["no_such_module:f"])


@pytest.mark.parametrize("completion,answer,math_verify,last_number", [
    ("The total is 1,000.", "1000", 1.0, 1.0),
    ("so the answer is $\\frac{1}{2}$", "0.5", 1.0, 0.0),       # a fraction: the last-number rule reads "2"
    ("x = 3/4", "0.75", 1.0, 0.0),
    ("She sold 48 in April and 24 in May, 72 in all. #### 72", "72", 1.0, 1.0),
    ("It is 71", "72", 0.0, 0.0),
    ("72 apples, minus 2", "72", 0.0, 0.0),                       # the answer is not the last value
    ("so $f(x) = 1 + x^2$", "x^2+1", 1.0, 0.0),                    # MATH-style bare LaTeX answers
    ("the area is \\(\\pi\\)", "\\pi", 1.0, 0.0),
    ("the area is \\(2\\pi\\)", "\\pi", 0.0, 0.0),
])
def test_math_verify_checks_answers_that_differ_only_in_format(completion, answer, math_verify, last_number):
    from llm.tasks import ANSWER_CHECKS

    assert ANSWER_CHECKS["math_verify"](completion, answer) == math_verify
    assert ANSWER_CHECKS["last_number"](completion, answer) == last_number


def test_answer_check_selects_the_gsm8k_reward(tmp_path):
    from llm.tasks import math_verify_reward

    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"question": "Half of 1?", "answer": "#### 0.5"}) + "\n")
    assert load_task(str(path)).reward_fn is math_verify_reward  # the default
    assert load_task(str(path), answer_check="last_number").reward_fn is numeric_reward
    assert GRPOConfig().answer_check == "math_verify"

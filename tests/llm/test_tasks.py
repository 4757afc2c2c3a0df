"""llm.tasks and llm.tasks.sources: the built-in task, rewards (text, TRL's signature, math-verify), chat templates."""

import json
import sys

import numpy as np
import pytest

from llm import GRPOConfig
from llm.rewards import numeric_reward, parse_number
from llm.tasks import arithmetic_task
from llm.tasks.sources import load_task

PY = sys.executable


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


#: A chat template over the tiny model's characters: one "Q: ...\nA:" turn per user message.
QA_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}A:{% endif %}")


def test_chat_template_renders_every_prompt_as_a_user_turn(tmp_path, tokenizer, monkeypatch):
    """--chat-template: the prompt tokens are those of the template's rendering with the generation prompt (here
    written out by hand); a run trains on them; a tokenizer without a template is refused in one line."""
    import shutil

    from llm import train
    from llm.models.tiny import tiny_model_dir
    from llm.run.rundir import read_metrics

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


def test_trl_signature_reward_functions_are_weighted_and_logged(reward_module, tokenizer, tmp_path):
    """--reward-funcs with --reward-weights: the reward is the weighted sum of the functions' values (None counts
    0, as in TRL), each function's values are kept for rewards/<name>/mean|std, and a run logs them."""
    from llm import train
    from llm.run.rundir import read_metrics
    from llm.step.score import reward_metrics

    task = load_task("arithmetic", reward_funcs=[f"{reward_module}:correct", f"{reward_module}:short",
                                                 f"{reward_module}:only_even"], reward_weights=[0.5, 0.25, 0.25])
    assert not task.has_exact_j
    bound = task.bind(tokenizer)
    idx = [0, 1, 2, 3]
    completions = [task.answers[0], "x", "not the answer", task.answers[3] + " "]
    ids = [tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for c in completions]
    r, parts = bound.score_parts(idx, completions, ids)
    correct = np.array([1.0, 0.0, 0.0, 1.0])
    short = np.array([len(i) <= 3 for i in ids], dtype=float)
    even = np.array([np.nan if int(task.answers[i]) % 2 else 1.0 for i in idx])
    assert np.allclose(r, 0.5 * correct + 0.25 * short + 0.25 * np.nan_to_num(even))
    m = reward_metrics(parts)
    assert m["rewards/correct/mean"] == 0.5 and m["rewards/correct/std"] == pytest.approx(np.std(correct, ddof=1))
    assert m["rewards/only_even/mean"] == pytest.approx(np.nanmean(even))  # None left out of the mean
    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", max_steps=2,
                                         progress=False, logging_steps=100, reward_funcs=(f"{reward_module}:correct",
                                         f"{reward_module}:short"), reward_weights=(0.8, 0.2)), log=lambda *a: None))
    for row in rows:  # no None here: the mean reward is the weighted sum of the functions' means
        assert row["reward"] == pytest.approx(0.8 * row["rewards/correct/mean"] + 0.2 * row["rewards/short/mean"])
        assert "j/pi_new" not in row


@pytest.mark.slow
def test_rewards_outside_unit_range_train_and_the_bound_uses_the_range_seen(reward_module, tmp_path, capsys):
    """With no declared range, rewards from -2 to 13 train; each step logs the range its bound terms used, [0, 1]
    widened to every training and held-out reward seen up to that step (both scored each step, in that order),
    flagged as no guarantee, the certificate abstains, the first widening is said once, and a resumed run starts
    from the range of the steps it keeps."""
    import importlib

    from llm import train
    from llm.run.rundir import read_metrics

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
        assert np.isfinite(row["heldout/bound_est/lower_tight"]) and row["bound/range_declared"] == 0.0
        assert np.isnan(row["heldout/improvement_lcb"])  # no declared range: the certificate abstains
    said = capsys.readouterr().out
    assert said.count("rewards outside [0, 1]") == 2  # once per process: the first run and the resumed one


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
    from llm.rewards import ANSWER_CHECKS

    assert ANSWER_CHECKS["math_verify"](completion, answer) == math_verify
    assert ANSWER_CHECKS["last_number"](completion, answer) == last_number


def test_answer_check_selects_the_gsm8k_reward(tmp_path):
    from llm.rewards import math_verify_reward

    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"question": "Half of 1?", "answer": "#### 0.5"}) + "\n")
    assert load_task(str(path)).reward_fn is math_verify_reward  # the default
    assert load_task(str(path), answer_check="last_number").reward_fn is numeric_reward
    assert GRPOConfig().answer_check == "math_verify"

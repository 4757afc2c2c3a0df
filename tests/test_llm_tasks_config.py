"""Tasks, rewards, config validation and the command line of the trainer."""

import json
import subprocess
import sys

import numpy as np
import pytest

from llm import GRPOConfig
from llm.tasks import arithmetic_task, load_task, numeric_reward, parse_number

PY = sys.executable


def test_arithmetic_reward_is_exact_match():
    task = arithmetic_task()
    assert len(task.prompts) == 200 and task.prompts[0] == "0+0="
    i = task.prompts.index("13+7=")
    assert task.answers[i] == "20"
    assert list(task.score(["20", "20\n", "2", "200", ""], ["20"] * 5)) == [1, 1, 0, 0, 0]


def test_gsm8k_jsonl_loader_and_numeric_reward(tmp_path):
    path = tmp_path / "tiny_gsm8k.jsonl"
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "What is 1,000 + 234?", "answer": "#### 1,234"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = load_task(str(path))
    assert task.answers == ("7", "1234")
    assert task.prompts[0].startswith("Question: Tom has 3 apples")
    assert list(task.score(["so the answer is 7.", "It is 1,234", "8"], ["7", "1234", "7"])) == [1, 1, 0]
    assert parse_number("a -3.5 b 12") == 12 and parse_number("none") is None
    assert numeric_reward("7.0", "7") == 1.0


def test_bad_dataset_rows_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_task(str(path))
    path.write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match="####"):
        load_task(str(path))
    with pytest.raises(ValueError, match="dataset: expected"):
        load_task("nonsense")


def test_user_reward_function_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def half(completion, answer):\n    return 0.5\n"
                                            "def bad(completion, answer):\n    return 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task("arithmetic", "my_rewards:half")
    assert np.all(task.score(["1", "2"], ["1", "1"]) == 0.5)
    with pytest.raises(ValueError, match=r"reward_fn: rewards must lie in \[0, 1\]"):
        load_task("arithmetic", "my_rewards:bad").score(["1"], ["1"])
    with pytest.raises(ValueError, match="reward_fn: cannot import"):
        load_task("arithmetic", "my_rewards:missing")


@pytest.mark.parametrize("field,value,match", [
    ("num_generations", 1, "num_generations: a group needs G >= 2"),
    ("sync_period", 0, "sync_period: v must be >= 1"),
    ("variance_eps", 0.9, r"variance_eps: must lie in \[0, 3/4\]"),
    ("epsilon", -0.1, "epsilon"),
    ("learning_rate", 0.0, "learning_rate"),
    ("device", "tpu", "device"),
])
def test_config_validation_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**{field: value})


def test_config_derived_values():
    c = GRPOConfig(max_steps=100, sync_period=10, prompts_per_step=4, num_generations=16)
    assert c.completions_per_step == 64 and c.num_syncs == 10
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
    assert "RuntimeWarning" not in res.stderr and "median seconds per step" in res.stdout

"""llm.tasks.data: data in TRL's formats read with datasets (files, saved data sets, conversations, GSM8K rows)."""

import json
import shutil
import sys

import numpy as np
import pytest

from llm import GRPOConfig
from llm.tasks.data import GSM8K_TEMPLATE
from llm.tasks.sources import load_task

datasets = pytest.importorskip("datasets")


ROWS = [{"prompt": "3+4=", "answer": "7", "level": 1, "solution": "three plus four"},
        {"prompt": "12+5=", "answer": 17, "level": 2, "solution": "twelve plus five"},
        {"prompt": "0+9=", "answer": "9", "level": 1, "solution": "nine"}]


TEST_ROWS = [{"prompt": "1+1=", "answer": "2", "level": 3, "solution": "two"}]


#: A chat template over the tiny model's characters: system "S:", user "Q:", assistant "A:" turns.
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}S: {{ m['content'] }}\n"
            "{% elif m['role'] == 'user' %}Q: {{ m['content'] }}\n{% else %}A: {{ m['content'] }}"
            "{% if not loop.last %}\n{% endif %}{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A copy of the built-in tiny model whose tokenizer carries ``TEMPLATE``."""
    from transformers import AutoTokenizer

    from llm.models.tiny import tiny_model_dir

    model = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(tiny_model_dir(), model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    return model, AutoTokenizer.from_pretrained(model)


def test_text_prompts_read_the_same_from_jsonl_parquet_and_a_saved_dataset(tmp_path):
    """One task from three sources: the prompts as written, the answers as strings (a number too), every other
    column kept for the reward functions; a saved DatasetDict gives its train split for training and its test
    split for testing."""
    jsonl = write_jsonl(tmp_path / "train.jsonl", ROWS)
    parquet = str(tmp_path / "train.parquet")
    table = {k: [str(r[k]) if k == "answer" else r[k] for r in ROWS] for k in ROWS[0]}  # Parquet: one type a column
    datasets.Dataset.from_dict(table).to_parquet(parquet)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(table),
                          "test": datasets.Dataset.from_list(TEST_ROWS)}).save_to_disk(str(saved))
    want_columns = {"level": (1, 2, 1), "solution": ("three plus four", "twelve plus five", "nine")}
    for source, eval_source in ((jsonl, write_jsonl(tmp_path / "test.jsonl", TEST_ROWS)), (parquet, ""),
                                (str(saved), str(saved))):
        task = load_task(source, eval_dataset=eval_source)
        assert task.prompts == ("3+4=", "12+5=", "0+9=") and task.answers == ("7", "17", "9"), source
        assert task.columns == want_columns, source
        if eval_source:
            assert task.test_prompts == ("1+1=",) and task.test_answers == ("2",)
            assert task.test_columns == {"level": (3,), "solution": ("two",)}
    with pytest.raises(ValueError, match=r"saved holds the splits \['test', 'train'\]; the 'validation' split"):
        from llm.tasks.data import load_prompt_data
        load_prompt_data(str(saved), "validation")
    with pytest.raises(ValueError, match=r"dataset: expected 'arithmetic', a .json/.jsonl/.parquet/.csv file"):
        load_task(str(tmp_path / "train.txt"))


def test_gsm8k_rows_are_one_mapping_onto_the_prompt_format(tmp_path):
    """GSM8K's question/answer rows become prompt = template(question), answer = the number after '####', the
    same from a JSONL file and from a saved data set; any other column is kept."""
    rows = [{"question": " Tom has 3 apples and buys 4. How many? ", "answer": "3 + 4 = 7\n#### 7", "id": "a"},
            {"question": "What is 1,000 + 234?", "answer": "#### 1,234", "id": "b"}]
    saved = tmp_path / "gsm8k"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    for source in (write_jsonl(tmp_path / "gsm8k.jsonl", rows), str(saved)):
        task = load_task(source)
        assert task.prompts == (GSM8K_TEMPLATE.format(question="Tom has 3 apples and buys 4. How many?"),
                                GSM8K_TEMPLATE.format(question="What is 1,000 + 234?"))
        assert task.answers == ("7", "1234") and task.columns == {"id": ("a", "b")}


SPY_MODULE = '''
calls = []

def spy(prompts, completions, completion_ids, **columns):
    calls.append({"prompts": prompts, "completions": completions, "columns": columns})
    return [1.0 if "7" in (c[0]["content"] if isinstance(c, list) else c) else 0.0 for c in completions]
'''


@pytest.fixture
def spy(tmp_path, monkeypatch):
    (tmp_path / "spy_rewards.py").write_text(SPY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spy_rewards", raising=False)
    import spy_rewards

    yield spy_rewards
    sys.modules.pop("spy_rewards", None)


@pytest.mark.parametrize("conversational", [False, True])
def test_reward_functions_receive_the_rows_columns_and_trls_completion_format(tmp_path, spy, chat_model,
                                                                              conversational):
    """The reward function gets the batch's prompts as written (a conversation stays a list of messages), each
    completion as text or, for conversational data, as [{"role": "assistant", "content": text}], and every
    column but the prompt, row for row (here without an 'answer' column: none is passed)."""
    system = {"role": "system", "content": "add"}
    rows = [{"prompt": [system, {"role": "user", "content": r["prompt"]}] if conversational else r["prompt"],
             "level": r["level"], "solution": r["solution"]} for r in ROWS]
    task = load_task(write_jsonl(tmp_path / "conv.jsonl", rows), reward_funcs=["spy_rewards:spy"])
    assert task.conversational == conversational and task.answers == ()
    _, tok = chat_model
    idx, texts = [2, 0, 0], ["9", "7", "no"]
    rewards = task.bind(tok).score(idx, texts, [[5], [6], [7, 8]])
    assert list(rewards) == [0.0, 1.0, 0.0]
    (call,) = spy.calls
    assert call["prompts"] == [rows[i]["prompt"] for i in idx]
    assert call["completions"] == ([[{"role": "assistant", "content": t}] for t in texts] if conversational else texts)
    assert call["columns"] == {"level": [1, 1, 1], "solution": ["nine", "three plus four", "three plus four"]}
    with pytest.raises(ValueError, match="has no 'answer' column, which the default reward"):
        load_task(str(tmp_path / "conv.jsonl"))


def test_conversations_are_rendered_with_the_chat_template_and_train(tmp_path, spy, chat_model):
    """A conversational prompt's tokens are the template's rendering with the generation prompt (written out here by
    hand); a conversation ending in an assistant turn is continued instead; a tokenizer without a template is
    refused in one line; a run on conversational data trains and logs the function's reward."""
    from transformers import AutoTokenizer

    from llm import train
    from llm.models.tiny import tiny_model_dir
    from llm.run.rundir import read_metrics

    model, tok = chat_model
    user = lambda r: {"role": "user", "content": r["prompt"]}  # noqa: E731
    rows = [{"prompt": [{"role": "system", "content": "add"}, user(ROWS[0])]},
            {"prompt": [user(ROWS[1])]},
            {"prompt": [user(ROWS[2]), {"role": "assistant", "content": "so"}]}]
    path = write_jsonl(tmp_path / "conv.jsonl", rows)
    task = load_task(path, eval_dataset=path, reward_funcs=["spy_rewards:spy"])
    bound = task.bind(tok)
    by_hand = ["S: add\nQ: 3+4=\nA:", "Q: 12+5=\nA:", "Q: 0+9=\nA: so"]
    assert bound.prompt_ids == bound.test_prompt_ids == [tok(t, add_special_tokens=False).input_ids for t in by_hand]
    with pytest.raises(ValueError, match=r"^dataset: the prompts are conversations .* has none"):
        task.bind(AutoTokenizer.from_pretrained(tiny_model_dir()))
    cfg = GRPOConfig(model_name_or_path=str(model), dataset=path, reward_funcs=("spy_rewards:spy",), exact_j=False,
                     output_dir=str(tmp_path / "run"), sampler="transformers", max_steps=2, prompts_per_step=3,
                     progress=False, logging_steps=100, max_completion_length=4)
    rows = read_metrics(train(cfg, log=lambda *a: None))
    assert len(rows) == 2 and all(np.isfinite(r["rewards/spy/mean"]) for r in rows)
    assert all(isinstance(c["prompts"][0], list) for c in spy.calls)

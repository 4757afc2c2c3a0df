"""llm.tasks.procedural: reasoning-gym tasks (``--dataset reasoning_gym:<name>``): the answer read from a completion, the
seeded split, the generator's own scorer as the reward, and one-line refusals."""

import importlib.util

import pytest

from llm import GRPOConfig  # noqa: E402
from llm.tasks.procedural import GeneratorSpec, read_answer, reasoning_gym_task  # noqa: E402
from llm.tasks.sources import load_task  # noqa: E402

#: Skipped without reasoning-gym, found without importing it (about 1 s at collection, in each pytest-xdist worker).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None,
                                reason="reasoning-gym is not installed")


ONE_DIGIT = ("min_terms=2", "max_terms=2", "min_digits=1", "max_digits=1")


@pytest.mark.parametrize("completion, reference, read", [
    ("The answer is -6.", "-6", "-6"),
    ("2 + -8 = 8 - 2 = 4", "-6", "4"),  # the last number, right or wrong
    ("It is 1,000 apples", "1000", "1000"),
    ("no number here", "12", ""),
    ("think... <answer> 7 </answer> and 9", "7", "7"),  # a tagged answer wins over later numbers
    ("  Paris.  ", "Paris", "Paris."),  # not numeric: the completion itself, stripped
])
def test_the_answer_read_from_a_completion(completion, reference, read):
    assert read_answer(completion, reference) == read


def test_split_is_seeded_disjoint_and_scored_by_the_generators_own_checker():
    import reasoning_gym

    spec = GeneratorSpec(ONE_DIGIT, train_size=300, test_size=60, seed=3)
    a, b = reasoning_gym_task("basic_arithmetic", spec), reasoning_gym_task("basic_arithmetic", spec)
    assert a.prompts == b.prompts and a.test_prompts == b.test_prompts  # seeded
    assert not set(a.prompts) & set(a.test_prompts)  # no test question is a training question
    assert len(a.prompts) + len(a.test_prompts) <= 360
    assert abs(len(a.test_prompts) / (len(a.prompts) + len(a.test_prompts)) - 60 / 360) < 0.01
    assert all(p.endswith("\nReply with the final answer only.") for p in a.prompts + a.test_prompts)
    other = reasoning_gym_task("basic_arithmetic", GeneratorSpec(ONE_DIGIT, 300, 60, seed=4))
    assert other.prompts != a.prompts
    data = reasoning_gym.create_dataset("basic_arithmetic", size=360, seed=3, min_terms=2, max_terms=2,
                                        min_digits=1, max_digits=1)
    by_question = {e["question"]: e for e in data}
    for i, prompt in enumerate(a.prompts[:40]):
        entry = by_question[prompt.split("\n")[0]]
        assert a.answers[i] == entry["answer"]
        assert a.row_reward(f"So the result is {entry['answer']}.", i, False) == 1.0
        wrong = str(int(entry["answer"]) + 1)
        assert a.row_reward(wrong, i, False) == data.score_answer(wrong, entry)
    j = 5
    entry = by_question[a.test_prompts[j].split("\n")[0]]
    assert a.row_reward(entry["answer"], j, True) == 1.0


def test_the_task_scores_completions_through_the_tokenized_task():
    from transformers import AutoTokenizer

    from llm.models.tiny import tiny_model_dir

    task = load_task("reasoning_gym:chain_sum", generator=GeneratorSpec(("min_terms=2", "max_terms=2"), 50, 10))
    bound = task.bind(AutoTokenizer.from_pretrained(tiny_model_dir()))
    texts = [f"I think {task.answers[0]}", "no idea", f"<answer>{task.test_answers[1]}</answer>"]
    assert list(bound.score([0, 0], texts[:2], [[1], [1]])) == [1.0, 0.0]
    assert list(bound.score([1], texts[2:], [[1]], test=True)) == [1.0]


def test_bad_generator_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="reasoning-gym has no task 'basic_arithmatic' \\(close: .*basic_arithmetic"):
        reasoning_gym_task("basic_arithmatic")
    with pytest.raises(ValueError, match="generator_kwargs: reasoning_gym:basic_arithmetic refused"):
        reasoning_gym_task("basic_arithmetic", GeneratorSpec(("no_such_option=3",)))
    with pytest.raises(ValueError, match="generator_kwargs: expected key=value, got 'min_terms'"):
        GeneratorSpec(("min_terms",)).options()
    with pytest.raises(ValueError, match="generator_kwargs: apply to --dataset reasoning_gym"):
        GRPOConfig(generator_kwargs=("min_terms=2",))
    with pytest.raises(ValueError, match="eval_dataset: the task reasoning_gym:chain_sum has its own test split"):
        load_task("reasoning_gym:chain_sum", eval_dataset="x.jsonl")
    assert GeneratorSpec(("a=2", "b=[1, 2]", "c=text")).options() == {"a": 2, "b": [1, 2], "c": "text"}

"""llm.rewards: the built-in soft overlong punishment (TRL's semantics), reward models in --reward-funcs (the score
through the run's reward functions equals a direct call of the model), and the entries --reward-funcs refuses."""

import numpy as np
import pytest
import torch

from llm.rewards import OVERLONG, RewardContext, RewardModel, SoftOverlongPunishment, is_reward_model, reward_funcs
from llm.tasks import BatchReward, batch_rewards


def test_soft_overlong_punishment_is_daps_eq_13():
    """L_max 100, L_cache 20 (TRL's docstring example): 0 up to 80 tokens, then linear to -1 at 100, -1 beyond."""
    f = SoftOverlongPunishment(100, 20)
    assert f(completion_ids=[[1] * n for n in (10, 80, 81, 90, 100, 101)]) == [0.0, 0.0, -0.05, -0.5, -1.0, -1.0]
    assert SoftOverlongPunishment(100, 0)(completion_ids=[[1] * 100]) == [0.0]
    with pytest.raises(ValueError, match="^soft_punish_cache: "):
        SoftOverlongPunishment(10, 11)


def test_the_built_in_is_named_in_reward_funcs_and_weighted():
    funcs = reward_funcs([OVERLONG], [0.5], RewardContext(max_completion_length=6, soft_punish_cache=2))
    assert [(f.name, f.weight) for f in funcs] == [("soft_overlong_punishment_reward", 0.5)]
    total, parts = batch_rewards(funcs, ["a"] * 3, ["x"] * 3, [[1] * 4, [1] * 5, [1] * 6], {})
    assert np.allclose(total, [0.0, -0.25, -0.5]) and list(parts) == ["soft_overlong_punishment_reward"]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    """A tiny sequence classifier (Qwen2 shape, the built-in character tokenizer), built locally and saved."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from llm.models.tiny import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64, num_labels=1,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rm") / "tiny-reward-model"
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_reward_model_scores_the_same_through_reward_funcs_as_called_directly(reward_model_dir):
    """The score of each prompt+completion through --reward-funcs (batched, padded) is the classifier's logit for that
    text alone, computed here by hand, one sequence at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert is_reward_model(str(reward_model_dir)) and not is_reward_model("mod:fn") and not is_reward_model(OVERLONG)
    (fn,) = reward_funcs([str(reward_model_dir)], [], RewardContext())
    prompts, completions = ["3+4=", "12+9=", "0+0="], ["7", "21 or so", ""]
    total, parts = batch_rewards([fn], prompts, completions, [[0]] * 3, {})
    tok = AutoTokenizer.from_pretrained(reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    with torch.no_grad():
        want = [float(model(**tok(p + c, return_tensors="pt", add_special_tokens=False)).logits[0, 0])
                for p, c in zip(prompts, completions)]
    assert np.allclose(total, want, atol=1e-5) and fn.name == "tiny-reward-model"
    assert len(set(np.round(want, 6))) == 3  # the texts score differently: the check can fail


def test_a_reward_model_reads_conversations_through_its_chat_template(reward_model_dir, tmp_path):
    import shutil

    path = tmp_path / "rm"
    shutil.copytree(reward_model_dir, path)
    model = RewardModel(str(path))
    model.tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    texts = model.texts([[{"role": "user", "content": "3+4="}]], [[{"role": "assistant", "content": "7"}]])
    assert texts == ["<user>3+4=<assistant>7"]


def test_reward_funcs_entries_it_cannot_read_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="^reward_funcs: expected 'module:function', soft_overlong_punishment or a "
                                         "reward model's directory"):
        reward_funcs([str(tmp_path)], [])
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForSequenceClassification"]}')
    with pytest.raises(ValueError, match="^reward_funcs: cannot load the reward model"):
        reward_funcs([str(tmp_path)], [])
    assert isinstance(reward_funcs([OVERLONG], [], RewardContext(soft_punish_cache=1))[0], BatchReward)


def test_async_reward_functions_are_awaited_together_on_one_loop_as_trls_are():
    """TRL 1.16 awaits ``async def`` reward functions (asyncio.gather on one loop of its own thread); they were
    refused ('returned a coroutine'). Two async ones and a sync one; a client made in the first call is reused."""
    import asyncio
    import threading

    seen = {}

    async def lengths(prompts, completions, **kw):
        seen.setdefault("loop", asyncio.get_running_loop())
        assert seen["loop"] is asyncio.get_running_loop() and threading.current_thread().name == "reward-loop"
        await asyncio.sleep(0.01)
        return [len(c) for c in completions]

    class Halves:
        async def __call__(self, prompts, completions, **kw):
            return [0.5 if c == "ab" else None for c in completions]

    def ones(prompts, completions, **kw):
        return [1.0] * len(completions)

    funcs = [BatchReward("lengths", lengths, 2.0), BatchReward("halves", Halves()), BatchReward("ones", ones)]
    for _ in range(2):
        total, parts = batch_rewards(funcs, ["p", "p"], ["ab", "abc"], [[1], [1]], {})
        assert total.tolist() == [2 * 2 + 0.5 + 1, 2 * 3 + 0 + 1]
        assert parts["lengths"].tolist() == [2, 3] and np.isnan(parts["halves"][1])


def test_an_async_reward_function_that_raises_or_returns_garbage_is_one_line():
    async def raises(prompts, completions, **kw):
        raise KeyError("label")

    async def short(prompts, completions, **kw):
        return [1.0]

    with pytest.raises(ValueError, match=r"^reward_funcs: raises raised KeyError: 'label'$"):
        batch_rewards([BatchReward("raises", raises)], ["p"] * 2, ["a", "b"], [[1], [1]], {})
    with pytest.raises(ValueError, match="short returned 1 values for 2 completions"):
        batch_rewards([BatchReward("short", short)], ["p"] * 2, ["a", "b"], [[1], [1]], {})


def test_a_sync_reward_function_that_raises_after_an_async_one_leaves_no_warning():
    """The async function's call, made before the sync one raised, is closed: the one line is all the user sees (it
    was followed by "RuntimeWarning: coroutine 'judge' was never awaited"). A number that is not finite is one line
    too."""
    import gc
    import warnings

    async def judge(prompts, completions, **kw):
        return [1.0] * len(completions)

    def raises(prompts, completions, **kw):
        raise KeyError("label")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"^reward_funcs: raises raised KeyError: 'label'$"):
            batch_rewards([BatchReward("judge", judge), BatchReward("raises", raises)], ["p"] * 2, ["a", "b"],
                          [[1], [1]], {})
        gc.collect()
    assert not [w for w in said if "never awaited" in str(w.message)]
    with pytest.raises(ValueError, match=r"^reward_funcs: nan returned nan for completion 'b'; expected a finite"):
        batch_rewards([BatchReward("nan", lambda completions, **kw: [0.0, float("nan")])], ["p"] * 2, ["a", "b"],
                      [[1], [1]], {})


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_reward_function_that_runs_long_is_named_while_the_step_waits(kind, monkeypatch, capsys):
    """A hung reward function left the run silent for good (reward functions have no time limit, as in TRL): past
    REWARD_NOTICE_S the run names it, above the progress bar, and says how to stop; a quick one is not named."""
    import asyncio
    import time

    from llm.rewards import functions

    monkeypatch.setattr(functions, "REWARD_NOTICE_S", 0.2)

    def slow(prompts, completions, **kw):
        time.sleep(0.6)
        return [1.0] * len(completions)

    async def slow_async(prompts, completions, **kw):
        await asyncio.sleep(0.6)
        return [1.0] * len(completions)

    def quick(prompts, completions, **kw):
        return [0.0] * len(completions)

    funcs = [BatchReward("quick", quick), BatchReward("slow", slow if kind == "sync" else slow_async)]
    total, _ = batch_rewards(funcs, ["p"] * 2, ["a", "b"], [[1], [1]], {})
    assert total.tolist() == [1.0, 1.0]
    out = capsys.readouterr().out
    assert out.count("reward_funcs: slow has run 0.2 s on 2 completions without returning") == 1, out
    assert "Ctrl-C twice" in out and "quick" not in out


def test_a_partial_reward_function_is_named_after_its_function(tmp_path):
    """A functools.partial from Python was logged as 'rewards/5, scale=0.5)/mean' (the tail of its description,
    which moved with its line number); TRL names a reward function by its function."""
    import functools

    from llm.config.user_code import object_spec
    from llm.rewards import reward_name

    def weighted(prompts, completions, scale, **kw):
        return [scale] * len(completions)

    class Scorer:
        def __call__(self, prompts, completions, **kw):
            return [1.0] * len(completions)

    partial = functools.partial(weighted, scale=0.5)
    (f,) = reward_funcs([object_spec(partial, "reward_funcs")], [])
    assert f.name == "weighted"
    assert reward_name(functools.partial(partial, extra=1)) == "weighted"
    assert reward_name(Scorer()) == "Scorer"  # TRL's get_callable_name: an instance by its class, from Python or not
    # two partials of one function share TRL's name: refused in one line that names the clash and its mend
    small, large = functools.partial(weighted, scale=0.1), functools.partial(weighted, scale=2.0)
    with pytest.raises(ValueError, match=r"^reward_funcs: 2 functions are named 'weighted' .* fn.__name__ = "):
        reward_funcs([object_spec(p, "reward_funcs") for p in (small, large)], [])
    small.__name__, large.__name__ = "small", "large"
    assert [f.name for f in reward_funcs([object_spec(p, "reward_funcs") for p in (small, large)], [])] == [
        "small", "large"]

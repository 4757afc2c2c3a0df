"""llm.agents: multi-turn tool-calling episodes, token in and token out, with the environment's tokens masked.

The built-in agent task (``--dataset arithmetic_tools``) on the built-in agent model: the environment's tokens enter
neither the loss, nor the importance weights, nor the TV; the exact J is the probability of the sampled episodes'
success; bad input from the world (a tool that raises, hangs, answers too much or not text, a malformed or unknown
call, too many calls) ends neither the run nor a row; a template that cannot express tool calls is refused."""

import functools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from llm.tasks.arithmetic_tools import arithmetic_tools_task
from llm.agents.episodes import AgentSampler
from llm.agents.setup import build_agent
from llm.config import GRPOConfig
from llm.config.agent import AgentConfig
from llm.sampling.base import Rollout

QUIET = lambda *a: None  # noqa: E731


def _tokenizer():
    from llm.models.model import load_tokenizer
    from llm.models.tiny import agent_model_dir

    return load_tokenizer(str(agent_model_dir()))


def _agent(tools=(), log=QUIET, **kw):
    """The built-in agent task bound to the agent model's tokenizer with an agent of ``tools`` (its accepted episodes
    built by the episode loop: a few seconds; the plain one is built once, ``_plain_agent``)."""
    if not tools and log is QUIET and not kw:
        return _plain_agent()
    tok = _tokenizer()
    task = arithmetic_tools_task()
    agent = build_agent(AgentConfig(tools=tuple(tools), **kw), task, tok, log)
    return tok, task, agent, task.bind(tok, agent=agent)


@functools.cache
def _plain_agent():
    tok = _tokenizer()
    task = arithmetic_tools_task()
    agent = build_agent(AgentConfig(), task, tok, QUIET)
    return tok, task, agent, task.bind(tok, agent=agent)


class Script:
    """An inner sampler that answers every request of round r with ``turns[r]`` (log alpha -1 per token)."""

    name = "script"

    def __init__(self, tok, turns):
        self.turns = [tok(t, add_special_tokens=False).input_ids for t in turns]
        self.round = 0

    def generate(self, prompt_ids, n, max_tokens, temperature, seed, greedy=False, token_filter=None):
        ids = self.turns[min(self.round, len(self.turns) - 1)][:max_tokens]
        self.round += 1
        return Rollout([list(ids) for _ in prompt_ids for _ in range(n)], [[-1.0] * len(ids)
                                                                          for _ in prompt_ids for _ in range(n)])


def _episodes(agent, bound, tok, turns, n=2, max_tokens=60):
    sampler = AgentSampler(Script(tok, turns), agent)
    return sampler.generate(bound.prompt_ids[:3], n, max_tokens, 1.0, 0)


# ---- the episodes' tokens and masks ----------------------------------------------------------------------------


def test_an_episode_is_the_policys_turns_and_the_tools_answers_token_for_token():
    tok, task, agent, bound = _agent()
    roll = _episodes(agent, bound, tok, ['[multiply{"a":3,"b":4}]<eos>', "12<eos>"])
    text = tok.decode(roll.completion_ids[0])
    assert text == '[multiply{"a":3,"b":4}]<eos>=12|12<eos>'
    mask = roll.tool_mask[0]
    env = [t for t, m in zip(tok.convert_ids_to_tokens(roll.completion_ids[0]), mask) if not m]
    assert "".join(env) == "=12|" and sum(mask) == len(mask) - 4
    assert roll.tool_calls == [1] * 6 and roll.tool_failures == [0] * 6
    assert [lp for lp, m in zip(roll.logprobs[0], mask) if not m] == [0.0] * 4  # alpha drew none of them
    assert all(lp == -1.0 for lp, m in zip(roll.logprobs[0], mask) if m)


def test_the_accepted_episodes_are_what_the_loop_builds_and_score_one():
    tok, task, agent, bound = _agent()
    i = next(k for k, p in enumerate(task.prompts) if p == "12*7=")
    texts = [tok.decode(ids) for ids in bound.accepted_ids[i]]
    assert texts == ['[multiply{"a":12,"b":7}]<eos>=84|84<eos>', '[multiply{"a":7,"b":12}]<eos>=84|84<eos>']
    sampler = AgentSampler(Script(tok, ['[multiply{"a":7,"b":12}]<eos>', "84<eos>"]), agent)
    roll = sampler.generate([bound.prompt_ids[i]], 1, 60, 1.0, 0)
    assert bound.score([i], [""], roll.completion_ids)[0] == 1.0
    wrong = AgentSampler(Script(tok, ["84<eos>"]), agent).generate([bound.prompt_ids[i]], 1, 60, 1.0, 0)
    assert bound.score([i], [""], wrong.completion_ids)[0] == 0.0  # the right number without the call


def test_a_users_tool_of_the_same_name_replaces_the_builtin_one_everywhere():
    said = []
    tok, task, agent, bound = _agent(tools=["tests.llm.agent_tools:multiply"], log=said.append)
    i = next(k for k, p in enumerate(task.prompts) if p == "12*7=")
    assert tok.decode(bound.accepted_ids[i][0]) == '[multiply{"a":12,"b":7}]<eos>=85|85<eos>'
    assert any("replace the task's own" in s for s in said)


# ---- the environment's tokens enter nothing ----------------------------------------------------------------------


def _episode_batch():
    """Two prompts, three episodes each (two accepted, one with a wrong answer), of the built-in agent model."""
    from llm.tensors.batch import make_batch

    tok, task, agent, bound = _agent()
    rows, masks, prompts = [], [], []
    for i in [k for k, acc in enumerate(bound.accepted_ids) if len(acc) == 2][3:5]:
        for ids, m in zip(bound.accepted_ids[i], bound.accepted_masks[i]):
            rows.append(ids)
            masks.append(m)
        rows.append(bound.accepted_ids[i][0][:-2] + tok("5", add_special_tokens=False).input_ids + [tok.eos_token_id])
        masks.append(bound.accepted_masks[i][0])
        prompts += [bound.prompt_ids[i]] * 3
    return make_batch(prompts, rows, tok.pad_token_id, "cpu", masks), tok


def _env_noise_hook(batch, scale):
    """A forward hook on the final norm that adds noise to the hidden states that predict environment tokens: only
    the next-token distributions at those positions change (each position's logits read its own hidden state)."""
    env = (batch.completion_mask * (1 - batch.tool_mask)) > 0
    lp = batch.prompt_width
    g = torch.Generator().manual_seed(1)

    def hook(module, inputs, out):
        if out.shape[1] != batch.input_ids.shape[1] or scale == 0:
            return out
        noise = torch.zeros_like(out)
        where = torch.zeros(out.shape[:2], dtype=torch.bool)
        where[:, lp - 1: lp - 1 + env.shape[1]] = env
        noise[where] = scale * torch.randn(int(where.sum()), out.shape[-1], generator=g, dtype=out.dtype)
        return out + noise

    return hook


def _everything(batch, scale, alpha_env, mode, level):
    """Loss statistics, gradient, the weights' and episodes' metrics, the sequence ratios and the per-token TV of one
    optimiser step (SGD lr 0) with the environment positions' logits perturbed by ``scale`` and log alpha of the
    environment's tokens set to ``alpha_env``."""
    from llm.tensors import agent_metrics
    from llm.tensors import diagnostics as dg
    from llm.tensors.passes import Passes
    from llm.models.model import Precision, load_policy
    from llm.models.tiny import agent_model_dir
    from llm.tensors.loss import Clip
    from llm.optim import Objective, optimise

    policy, _ = load_policy(str(agent_model_dir()), torch.device("cpu"))
    policy.double()
    handle = policy.model.norm.register_forward_hook(_env_noise_hook(batch, scale))
    passes = Passes(1.0, Precision(), micro_batch=0, group_size=3, share_prompts=False)
    with torch.no_grad():
        logp = passes.logprobs(policy, batch).logp
    g = torch.Generator().manual_seed(0)
    log_alpha = logp + 0.3 * torch.randn(logp.shape, generator=g, dtype=logp.dtype)
    env = (batch.completion_mask * (1 - batch.tool_mask)) > 0
    log_alpha = torch.where(env, torch.full_like(log_alpha, alpha_env), log_alpha)
    adv = np.array([[1.0, 0.5, -1.5], [0.2, 0.4, -0.6]])
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    out = optimise(passes, Objective(num_iterations=2, max_grad_norm=0.0, max_completion_length=40,
                                     clip=Clip(ratio_level=level, importance_sampling_mode=mode), keep_hidden=True),
                   policy, opt, batch, adv, np.ones(2, bool), log_alpha, None)
    grad = torch.cat([p.grad.flatten() for p in policy.parameters()])
    pm = batch.policy_mask
    dists = passes.frozen_dists(policy, out.pi_k.hidden)
    handle.remove()
    plain = passes.dists(policy, passes.logprobs(policy, batch, keep_hidden=True).hidden)
    tv, kl = passes.token_divergences(dists, plain, pm)
    return {"stats": out.stats.metrics(), "grad": grad, "weights": dg.weight_metrics(out.pi_k.logp, log_alpha, pm),
            "episodes": agent_metrics.episode_metrics(out.pi_k.logp, log_alpha, pm),
            "seq": dg.sequence_log_ratio(out.pi_k.logp, log_alpha, pm, 2, 3), "tv": tv, "kl": kl,
            "logp": out.pi_k.logp * pm}


@pytest.mark.parametrize("mode,level", [("paper", "token"), ("paper", "sequence"), ("seq_max_k2", "token"),
                                        ("sequence_mask", "token"), ("m2po", "token")])
def test_environment_tokens_enter_neither_the_loss_nor_the_ratios_nor_the_tv(mode, level):
    batch, _ = _episode_batch()
    assert batch.tool_mask is not None and float((batch.completion_mask - batch.policy_mask).sum()) >= 6 * 3 - 1
    base = _everything(batch, 0.0, -0.5, mode, level)
    moved = _everything(batch, 3.0, -7.0, mode, level)  # other logits and other log alpha on the environment's tokens
    assert base["stats"].keys() == moved["stats"].keys() and base["stats"]["clip_ratio/region_mean"] >= 0
    for key in base["stats"]:
        assert math.isclose(base["stats"][key], moved["stats"][key], rel_tol=1e-9, abs_tol=1e-12), key
    assert torch.allclose(base["grad"], moved["grad"], rtol=1e-9, atol=1e-13) and base["grad"].abs().sum() > 0
    for part in ("weights", "episodes"):
        for key in base[part]:
            assert math.isclose(base[part][key], moved[part][key], rel_tol=1e-9, abs_tol=1e-12), (part, key)
    assert np.allclose(base["seq"], moved["seq"], rtol=1e-9, atol=1e-12)
    assert torch.allclose(base["logp"], moved["logp"], rtol=1e-9, atol=1e-12)
    # the TV and KL between the perturbed and unperturbed policies: 0 on every policy token, though not on the
    # environment's positions (the perturbation is real)
    assert np.abs(moved["tv"]).max() < 1e-9 and np.abs(moved["kl"]).max() < 1e-9


def test_the_hook_does_move_the_environment_positions():
    """The perturbation of the test above is not a no-op: with the policy mask replaced by every completion token,
    the per-token TV it finds is large."""
    from llm.tensors.passes import Passes
    from llm.models.model import Precision, load_policy
    from llm.models.tiny import agent_model_dir

    batch, _ = _episode_batch()
    policy, _ = load_policy(str(agent_model_dir()), torch.device("cpu"))
    policy.double()
    passes = Passes(1.0, Precision(), micro_batch=0, group_size=3, share_prompts=False)
    plain = passes.dists(policy, passes.logprobs(policy, batch, keep_hidden=True).hidden)
    handle = policy.model.norm.register_forward_hook(_env_noise_hook(batch, 3.0))
    moved = passes.dists(policy, passes.logprobs(policy, batch, keep_hidden=True).hidden)
    handle.remove()
    tv, _ = passes.token_divergences(plain, moved, batch.completion_mask)
    assert tv.max() > 0.1


# ---- exact J ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_exact_j_is_the_probability_that_a_sampled_episode_succeeds():
    """Episodes sampled by the transformers sampler through the episode loop: each prompt's success count is
    consistent with Binomial(n, J) for its exact J (exact binomial test), and so is the pooled count."""
    from llm.evaluation.exact import prompt_exact_j
    from llm.models.model import load_policy
    from llm.models.tiny import agent_model_dir
    from llm.sampling import TransformersSampler

    tok, task, agent, bound = _agent()
    policy, _ = load_policy(str(agent_model_dir()), torch.device("cpu"))
    j = prompt_exact_j(policy, bound, 1.0, tok.pad_token_id)
    idx = [i for i in range(0, len(bound.prompt_ids), 13)][:6]
    n = 400
    sampler = AgentSampler(TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id), agent)
    roll = sampler.generate([bound.prompt_ids[i] for i in idx], n, 40, 1.0, 0)
    hits = bound.score([i for i in idx for _ in range(n)], [""] * (n * len(idx)), roll.completion_ids)
    hits = hits.reshape(len(idx), n).sum(1)
    for k, p in zip(hits, j[idx]):
        assert stats.binomtest(int(k), n, float(p)).pvalue > 1e-4, (int(k), n, float(p))
    z = (hits.sum() - n * j[idx].sum()) / np.sqrt((n * j[idx] * (1 - j[idx])).sum())
    assert abs(z) < 4 and hits.sum() > 0
    assert sum(roll.tool_calls) > 0


# ---- bad input from the world ------------------------------------------------------------------------------------


CALL = '[{name}{{"a":3,"b":4}}]<eos>'


@pytest.mark.slow
@pytest.mark.parametrize("tool,turns,failure,answer", [
    ("fails", [CALL.format(name="fails"), "1<eos>"], "raised", "={'error': 'tool broke'}|"),
    ("hangs", [CALL.format(name="hangs"), "1<eos>"], "timed out", "tool_timeout"),
    ("opaque", [CALL.format(name="opaque"), "1<eos>"], None, "=<object object"),
    ("huge", [CALL.format(name="huge"), "1<eos>"], None, "[truncated]"),
    ("fails", [CALL.format(name="nosuch"), "1<eos>"], "unknown tool", "={'error': 'Tool nosuch not found.'}|"),
])
def test_a_bad_tool_or_call_is_one_line_and_a_scored_episode(tool, turns, failure, answer):
    """TRL 1.16's answers: a raised call answers str({"error": str(exception)}), an unknown tool TRL's own text, a
    value that is not text its str(); ours beside them: a hung call answers after the round's deadline, a huge answer
    is cut."""
    said = []
    tok, task, agent, bound = _agent(tools=[f"tests.llm.agent_tools:{tool}"], log=said.append, tool_timeout=0.5,
                                     max_tool_response_length=8 if tool == "huge" else 256)
    roll = _episodes(agent, bound, tok, turns, max_tokens=200)
    assert len(roll.completion_ids) == 6  # no row lost
    if failure is None:
        assert roll.tool_failures == [0] * 6 and said == []
    else:
        assert roll.tool_failures == [1] * 6
        assert len(said) == 1 and failure in said[0]  # one line for all six
    text = tok.decode(roll.completion_ids[0])
    assert answer in text and text.endswith("1<eos>")
    env = [t for t, m in zip(roll.completion_ids[0], roll.tool_mask[0]) if not m]
    if tool == "huge":
        assert 8 <= len(env) <= 8 + len(" [truncated]") + 2
    scores = bound.score([0, 0, 1, 1, 2, 2], [""] * 6, roll.completion_ids)
    assert scores.tolist() == [0.0] * 6
    again = _episodes(agent, bound, tok, turns, max_tokens=200)  # the same failure is not logged twice per run
    assert len(again.completion_ids) == 6 and len(said) == (failure is not None)


def test_a_turn_the_parser_cannot_read_is_a_final_answer_with_a_metric_of_its_own():
    """TRL 1.16 reads a turn its parser cannot read as the model's text: no call, no failure, the episode ends. Ours
    counts it in tools/malformed_frequency and says so once."""
    from llm.tensors.agent_metrics import tool_metrics

    said = []
    tok, task, agent, bound = _agent(log=said.append)
    roll = _episodes(agent, bound, tok, ['[multiply{"a":3,"b":4]<eos>', "12<eos>"], max_tokens=200)
    assert roll.tool_calls == [0] * 6 and roll.tool_failures == [0] * 6 and roll.malformed == [1] * 6
    assert tok.decode(roll.completion_ids[0]) == '[multiply{"a":3,"b":4]<eos>'
    assert roll.messages[0] == [{"role": "assistant", "content": '[multiply{"a":3,"b":4]'}]
    metrics = tool_metrics(roll.tool_mask, roll.tool_calls, roll.tool_failures, roll.malformed, roll.env_failed)
    assert metrics["tools/failure_frequency"] == 0.0 and metrics["tools/malformed_frequency"] == 1.0
    assert len(said) == 1 and "could not read" in said[0]


def test_calls_past_the_limit_end_the_episode_and_are_neither_run_nor_counted():
    """TRL 1.16: a turn's calls past max_tool_calling_iterations are not run and not counted; the episode ends."""
    said = []
    tok, task, agent, bound = _agent(log=said.append, max_tool_calling_iterations=2)
    roll = _episodes(agent, bound, tok, [CALL.format(name="multiply")] * 5, max_tokens=200)
    text = tok.decode(roll.completion_ids[0])
    assert text.count("[multiply") == 3 and text.count("=12|") == 2  # the third call is not run
    assert roll.tool_calls == [2] * 6 and roll.tool_failures == [0] * 6
    assert len(said) == 1 and "max_tool_calling_iterations" in said[0]


def test_an_answer_past_the_budget_ends_the_episode_without_it():
    tok, task, agent, bound = _agent()
    roll = _episodes(agent, bound, tok, [CALL.format(name="multiply"), "12<eos>"], max_tokens=26)
    assert all(m == 1 for m in roll.tool_mask[0]) and len(roll.completion_ids[0]) <= 26


# ---- start-up refusals -------------------------------------------------------------------------------------------


def test_a_template_that_cannot_express_tool_calls_is_refused_in_one_line(tmp_path):
    from llm.models.tiny import build_tokenizer

    task = arithmetic_tools_task()
    with pytest.raises(ValueError, match="no chat template"):
        build_agent(AgentConfig(), task, build_tokenizer())
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ValueError, match="cannot express tool calls"):
        build_agent(AgentConfig(chat_template_path=str(plain)), task, build_tokenizer())
    with pytest.raises(ValueError, match="chat_template_path: no file"):
        build_agent(AgentConfig(chat_template_path=str(tmp_path / "none.jinja")), task, build_tokenizer())


def test_bad_agent_options_are_one_line_each():
    for kw, field in ((dict(tools=("nomodule",)), "tools"), (dict(max_tool_calling_iterations=0),
                                                             "max_tool_calling_iterations"),
                      (dict(tool_timeout=-1.0), "tool_timeout"), (dict(max_tool_response_length=-2),
                                                                  "max_tool_response_length"),
                      (dict(environment_factory="x"), "environment_factory"),
                      (dict(dataset="arithmetic_tools", filter_groups=True), "filter_groups"),
                      (dict(tools=("m:f",), filter_groups=True), "filter_groups")):
        with pytest.raises(ValueError, match=field):
            GRPOConfig(**kw)
    with pytest.raises(ValueError, match="tools: cannot import"):
        _agent(tools=["tests.llm.agent_tools:nothing"])
    with pytest.raises(ValueError, match="no schema transformers can build"):
        _agent(tools=["tests.llm.agent_tools:no_docstring"])


# ---- training: every sampler, synchronous and asynchronous -------------------------------------------------------

#: Exact J gained by the built-in agent task in 24 steps at v = 4 (learning rate 1e-4). Measured with vLLM in process
#: on an AVX-512 host: +0.021, +0.025, +0.026 at seeds 0, 1, 2; with the transformers sampler (the test's, 56-61 s a
#: run against 96 s with vLLM: vLLM's per-token bookkeeping outweighs the tiny model) on the 2-core AVX2 host:
#: +0.032, +0.035, +0.029 (at 16 steps +0.007, +0.021, +0.025: too close). The margin is under half the smallest.
AGENT_LEARNING_MARGIN = 0.01
AGENT = dict(dataset="arithmetic_tools", max_completion_length=40, learning_rate=1e-4, progress=False,
             logging_steps=1000)


def _train(tmp_path, name, **kw):
    from llm import train
    from llm.run.rundir import read_metrics

    return read_metrics(train(GRPOConfig(output_dir=str(tmp_path / name), **{**AGENT, **kw}), log=QUIET))


@pytest.mark.slow
def test_the_agent_task_learns_off_policy_with_the_sync_check_on_the_policys_tokens(tmp_path):
    """v = 4 for 24 steps (the transformers sampler; vLLM's episodes: the test below): exact J rises by the margin, the
    model calls its tool, the sampler's log alpha equals the trainer's on the policy's tokens right after each sync
    (float32: below 1e-3), and the per-episode and per-turn ratios are logged."""
    rows = _train(tmp_path, "learn", sampler="transformers", max_steps=24, sync_period=4, exact_j_steps=24)
    assert rows[-1]["j/pi_new"] - rows[0]["j/pi_k"] >= AGENT_LEARNING_MARGIN, (rows[0]["j/pi_k"], rows[-1]["j/pi_new"])
    assert all(r["tools/call_frequency"] > 0.3 for r in rows)
    synced = [r for r in rows if r["lag"] == 0]
    assert len(synced) == 6 and all(r["sampling/logp_diff_max"] < 1e-3 for r in synced)
    # at lag 0 pi_k/alpha is 1 on every policy token (an environment token, whose log alpha is 0, would not be)
    assert all(0.999 < r["is_weight/min"] <= r["is_weight/max"] < 1.001 for r in synced)
    lagged = [r for r in rows if r["lag"] > 0]
    assert all(r["episode/log_ratio_min"] <= r["episode/turn_log_ratio_max"] for r in lagged)
    assert all(0 < r["episode/turn_ess"] <= 1 and 0 < r["tools/env_token_frac"] < 0.5 for r in lagged)


@pytest.mark.slow
@pytest.mark.parametrize("kw", [dict(sampler="vllm"), dict(sampler="transformers"),
                                dict(sampler="vllm", async_generation=True),
                                dict(sampler="transformers", use_transformers_continuous_batching=True)],
                         ids=["vllm", "transformers", "vllm-async", "continuous-batching"])
def test_episodes_under_every_sampler(tmp_path, kw):
    """Four steps of each sampler path: right after each sync (the first step's, and the third's where generation
    waits for it) the sampler's log-probs equal the trainer's on the policy's tokens, the tools are called, each
    step's exact J is logged."""
    rows = _train(tmp_path, "run", max_steps=4, sync_period=2, prompts_per_step=4, **kw)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    synced = [r for r in rows if r["lag"] == 0]
    assert synced[0] is rows[0] and len(synced) == (1 if kw.get("async_generation") else 2), [r["lag"] for r in rows]
    assert all(r["sampling/logp_diff_max"] < 1e-3 for r in synced)
    assert all(0.999 < r["is_weight/min"] <= r["is_weight/max"] < 1.001 for r in synced)
    assert all(r["tools/call_frequency"] > 0 and math.isfinite(r["j/pi_new"]) for r in rows)


@pytest.mark.parametrize("factory", ["Calculator"])
def test_an_environment_factory_rewards_and_supplies_the_tools(tmp_path, factory):
    """TRL's environment_factory: pooled Calculators reset with each prompt's row, its method the tool, its get_reward
    the episode's reward (the dataset has no other); an accepted episode of the built-in model's format scores 1
    through the environment."""
    import json

    from llm.models.tiny import agent_model_dir

    tok, task, _, bound = _agent()
    env_task = task.with_env_reward()
    env_agent = build_agent(AgentConfig(environment_factory=f"tests.llm.agent_tools:{factory}"), env_task, tok, QUIET)
    sampler = AgentSampler(Script(tok, ['[multiply{"a":3,"b":4}]<eos>', "12<eos>"]), env_agent)
    roll = sampler.generate([bound.prompt_ids[0]] * 2, 1, 60, 1.0, 0, rows=[{"prompt": "3*4="}, {"prompt": "5*4="}])
    assert roll.env_rewards == [{factory: 1.0}, {factory: 0.0}] and roll.tool_failures == [0, 0]
    scores, parts = env_task.bind(tok, agent=env_agent).score_parts([0, 1], ["", ""], roll.completion_ids,
                                                                   episodes=roll)
    assert scores.tolist() == [1.0, 0.0] and parts[factory].tolist() == [1.0, 0.0]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}*{b}="}) + "\n" for a in range(2, 9) for b in range(2, 6)))
    rows = _train(tmp_path, "env", dataset=str(data), environment_factory=f"tests.llm.agent_tools:{factory}",
                  model_name_or_path=str(agent_model_dir()), max_steps=2, sampler="transformers", prompts_per_step=4,
                  exact_j=False, eval_steps=0, log_completions=True, num_completions_to_print=8)
    assert all(r["tools/call_frequency"] > 0 and 0 <= r["reward"] <= 1 for r in rows) and rows[0]["reward"] > 0
    assert all(f"rewards/{factory}/mean" in r for r in rows)
    # --log-completions: each episode whole, as TRL's table holds it, and the environment's reward in its own column
    table = [json.loads(line) for line in (tmp_path / "env" / "completions.jsonl").read_text().splitlines()]
    # step 0 alone (logging_steps 1000), every one of its 4 x 8 completions, whatever the console prints
    assert [r["step"] for r in table] == [0] * 32
    assert all(list(r) == ["step", "prompt", "completion", "reward", factory, "advantage"] for r in table)
    assert all(r[factory] == r["reward"] for r in table)
    called = [r["completion"] for r in table if len(r["completion"]) > 1]
    assert called and all(e[0].get("tool_calls") and e[1]["role"] == "tool" for e in called)


def test_an_episode_is_one_line_in_the_completions_table():
    from llm.run.output import as_text, shorten

    episode = [{"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}]},
               {"role": "tool", "name": "multiply", "content": "12"}, {"role": "assistant", "content": "It is\n12."}]
    assert as_text(episode) == "assistant: multiply(a=3, b=4) / multiply -> 12 / assistant: It is\n12."
    assert shorten(as_text(episode), 40) == "assistant: multiply(a=3, b=4) / multi..."
    assert as_text("12") == "12"


def test_trls_tools_and_environment_factory_given_as_objects_are_kept_by_name():
    """TRL's GRPOTrainer takes the functions and the factories themselves: from_trl and GRPOConfig take them too and
    keep them by 'module:name' (config.json holds text); any other callable (a lambda, a functools.partial, a dict of
    them) is kept for this process as 'object:<what it is>', the same text in every process."""
    import functools
    import json

    from llm.config.user_code import import_object
    from llm.config import from_trl
    from tests.llm import agent_tools

    config = from_trl(tools=[agent_tools.multiply], environment_factory=agent_tools.Calculator,
                      max_tool_calling_iterations=3)
    assert config.tools == ("tests.llm.agent_tools:multiply",)
    assert config.environment_factory == ("tests.llm.agent_tools:Calculator",)
    assert json.loads(config.to_json())["tools"] == ["tests.llm.agent_tools:multiply"]
    assert GRPOConfig(environment_factory="tests.llm.agent_tools:Calculator").environment_factory == \
        ("tests.llm.agent_tools:Calculator",)  # a config.json written before the dict of factories loads
    make = lambda: agent_tools.Calculator()  # noqa: E731
    partial = functools.partial(agent_tools.Calculator)
    config = GRPOConfig(environment_factory={"calc": make, "other": partial})
    (calc, other) = config.environment_factory
    assert calc.startswith("calc=object:tests.llm.test_agents:") and "<lambda>" in calc
    assert "at test_agents.py:" in calc and "/" not in calc  # its file's name, no directory of this machine
    assert other == "other=object:functools.partial(tests.llm.agent_tools:Calculator)"
    assert import_object(calc.partition("=")[2], "environment_factory") is make
    with pytest.raises(ValueError, match="another process"):
        import_object("object:<gone>", "environment_factory")


def test_the_agent_reward_functions_read_the_last_turn_and_the_tools_answers():
    from llm.rewards.agents import called_tool, last_turn_answer

    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "multiply"}}]}
    good = [call, {"role": "tool", "name": "multiply", "content": "5535"}, {"role": "assistant", "content": "5535"}]
    tool_only = [call, {"role": "tool", "name": "multiply", "content": "5535"}, {"role": "assistant", "content": "ok"}]
    failed = [call, {"role": "tool", "name": "multiply", "content": '{"error": "ZeroDivisionError: x"}'},
              {"role": "assistant", "content": "5535"}]
    failed_trl = [call, {"role": "tool", "name": "multiply", "content": "{'error': 'division by zero'}"},
                  {"role": "assistant", "content": "5535"}]
    direct = [{"role": "assistant", "content": "It is 5535."}]
    episodes = [good, tool_only, failed, direct, failed_trl]
    assert last_turn_answer(None, episodes, ["5535"] * 5) == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert called_tool(None, episodes) == [1.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("console", [False, True], ids=["python -m llm", "offpolicy-grpo"])
def test_the_data_command_writes_the_multiplication_rows(tmp_path, console):
    """``python -m llm agent-data`` (and ``offpolicy-grpo agent-data``, the same dispatcher): the training and test rows
    in TRL's format, the product as the answer."""
    import json
    import subprocess
    import sys

    from llm.commands.agent_data import multiplication_rows
    from tests.helpers import ROOT

    out = tmp_path / "multiply.jsonl"
    from pathlib import Path

    command = [str(Path(sys.executable).with_name("offpolicy-grpo"))] if console else [sys.executable, "-m", "llm"]
    res = subprocess.run([*command, "agent-data", "--out", str(out), "--train-size", "6", "--test-size", "2"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for p in (out, tmp_path / "multiply-test.jsonl") for line in p.read_text().splitlines()]
    assert rows == multiplication_rows(8, 0)
    assert all(int(r["answer"]) == int(r["prompt"].split()[2]) * int(r["prompt"].split()[4].rstrip("?"))
               for r in rows)

"""The reward range the guarantees read is declared before the first step, never read off the rewards seen
(llm.config.ranges, llm.step.monitors.DeclaredRange; docs/theory.md, §8.6)."""

import json
import math
import sys

import numpy as np
import pytest
import torch

from llm.config import GRPOConfig
from llm.run.plan import reward_range_origin

RUN = dict(sampler="transformers", max_steps=3, progress=False, logging_steps=100, prompts_per_step=4,
           num_generations=4, max_completion_length=6, eval_steps=0)

STEPPED = '''
calls = []

def jumps_at_step_one(prompts, completions, answer, **kwargs):
    """1 iff correct, plus 1 from its second call on (step 1's training rewards)."""
    calls.append(len(completions))
    bonus = 1.0 if len(calls) >= 2 else 0.0
    return [float(c.strip() == a) + bonus for c, a in zip(completions, answer)]

def correct(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

def jumps_at_third_call(prompts, completions, answer, **kwargs):
    """jumps_at_step_one for a run with held-out prompts: step 0 calls it twice (training, held-out)."""
    calls.append(len(completions))
    bonus = 1.0 if len(calls) >= 3 else 0.0
    return [float(c.strip() == a) + bonus for c, a in zip(completions, answer)]

def tenths(prompts, completions, answer, **kwargs):
    """0.1 + 0.2 for a correct answer: 0.30000000000000004, one float64 rounding above a declared 0.3."""
    return [0.1 + 0.2 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

text_calls = []

def text_over_later(completion, answer):
    """A text reward that leaves [0, 1] from its 33rd call on (step 1: step 0 scores 4 x 4 training and 4 x 4
    held-out completions)."""
    text_calls.append(1)
    return 1.01 if len(text_calls) > 32 else float(completion.strip() == answer)

eval_calls = []

def over_in_the_second_evaluation(prompts, completions, answer, **kwargs):
    """Correct or not, but 1.5 on the test prompts (any batch but the training one's 16) from the third such call
    on: the initial evaluation (sampled, greedy) passes, the one after step 0 does not."""
    if len(completions) != 16:
        eval_calls.append(1)
    bonus = 0.5 if len(eval_calls) >= 3 else 0.0
    return [float(c.strip() == a) + bonus for c, a in zip(completions, answer)]

def over_by_an_ulp(completion, answer):
    """A text reward as reasoning-gym's spell_backward scores near misses: 1.0000000000000002."""
    return 1.0000000000000002 if completion.strip() == answer else 0.0
'''


@pytest.fixture
def stepped(tmp_path, monkeypatch):
    (tmp_path / "stepped_rewards.py").write_text(STEPPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stepped_rewards", raising=False)
    yield "stepped_rewards"
    sys.modules.pop("stepped_rewards", None)


def _train(tmp_path, name, **kw):
    from llm import train
    from llm.run.rundir import read_metrics

    said = []
    path = train(GRPOConfig(output_dir=str(tmp_path / name), **{**RUN, **kw}), log=said.append)
    return read_metrics(path), said, path


# ---- where the range comes from ------------------------------------------------------------------------------------


def test_the_range_is_the_declaration_or_the_sources_own_never_the_data():
    def own(**kw):
        return reward_range_origin(GRPOConfig(**kw)).range

    assert own() == (0.0, 1.0)  # the built-in task's check
    assert own(reward_fn="m:f") == (0.0, 1.0)  # a text reward, checked to [0, 1]
    overlong = dict(reward_funcs=("soft_overlong_punishment",), soft_punish_cache=2)
    assert own(**overlong) == (-1.0, 0.0)
    assert own(**overlong, reward_weights=(0.5,)) == (-0.5, 0.0)
    assert own(reward_funcs=("m:f",)) is None  # TRL's: declares nothing
    assert own(reward_funcs=("m:f", "soft_overlong_punishment"), soft_punish_cache=2, reward_range=(-1, 1)) == (-1.0, 1.0)
    assert own(environment_factory="m:Env", dataset="d.jsonl") is None
    with pytest.raises(ValueError, match=r"reward_range: \[0, 1\] does not hold the range its sources return, "
                                         r"\[-1, 0\]"):
        own(**overlong, reward_range=(0, 1))
    for bad in ((1, 0), (0, math.inf), (0,)):
        with pytest.raises(ValueError, match="reward_range"):
            GRPOConfig(reward_range=bad)
    assert json.loads(GRPOConfig().to_json())["reward_range"] is None  # config.json records what was said
    assert json.loads(GRPOConfig(reward_funcs=("m:f",)).to_json())["reward_range"] is None


def test_the_soft_overlong_punishment_pays_within_its_own_range():
    from llm.rewards import SoftOverlongPunishment

    fn = SoftOverlongPunishment(8, 4)
    lo, hi = SoftOverlongPunishment.reward_range
    values = fn(completion_ids=[[0] * n for n in range(0, 12)])
    assert min(values) == lo and max(values) == hi


# ---- the counterexample: a range read off the data is not a range ------------------------------------------------


def test_a_range_read_off_the_data_certifies_a_harmful_step_and_the_declared_one_does_not():
    """benchmarks/declared_range.py: the step lowers J by 0.0995; the -1 answer that shows it is rarely drawn."""
    sys.path.insert(0, str(__import__("tests.helpers", fromlist=["ROOT"]).ROOT / "benchmarks"))
    from declared_range import certified_rates, true_change

    assert true_change() == pytest.approx(-0.0995)
    rates = certified_rates(64, 200)
    assert rates["inferred"][0] > 0.6  # the old inference certifies most such steps (77.8% in the issue)
    assert rates["declared"][0] <= 0.05 + 3 * max(rates["declared"][1], 0.015)  # the theorem: at most 1 - level


# ---- a reward outside the declared range stops the run -------------------------------------------------------------


def test_a_reward_outside_the_declared_range_stops_the_run_in_one_line_keeping_rows_and_checkpoint(stepped, tmp_path):
    from runkit.cli import RunError

    with pytest.raises(RunError) as err:
        _train(tmp_path, "out", reward_funcs=(f"{stepped}:jumps_at_step_one",), reward_range=(0, 1), save_steps=1)
    message = str(err.value)
    assert "\n" not in message and "step 1" in message and "declared range [0, 1]" in message
    assert "jumps_at_step_one" in message  # the source and its value
    run = tmp_path / "out"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and "loss" in lines[0]  # step 0's row kept
    assert lines[1] == {"step": 1, "bound/certificates_void": 1.0, "bound/void_reason": message[:500]}  # the void mark
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 1  # and its checkpoint


def test_a_wrong_declaration_found_later_voids_the_certificates_logged_before_it(stepped, tmp_path):
    """Step 0's held-out certificate was claimed under [0, 1]; step 1's rewards refute it: the run stops, the last row
    of metrics.jsonl marks the certificates void, readers see every row void, and the report counts none."""
    from runkit.cli import RunError

    from llm.analysis.report import certificate_lines
    from llm.tensors.metrics import certificate_shares
    from llm.run.rundir import read_metrics

    with pytest.raises(RunError):
        _train(tmp_path, "void", reward_funcs=(f"{stepped}:jumps_at_third_call",), reward_range=(0, 1),
               heldout_prompts=4)
    rows = read_metrics(tmp_path / "void")
    assert len(rows) == 1 and np.isfinite(rows[0]["heldout/improvement_lcb"])  # logged, and now void
    assert rows[0]["bound/certificates_void"] == 1.0 and rows[0]["bound/void_step"] == 1
    shares = certificate_shares(rows)
    assert shares["void"] == 1 and shares["certified"] == 0 and "e_bh" not in shares
    certified = {**rows[0], "heldout/improvement_lcb": 0.5}  # even a certified step counts for nothing once void
    assert certificate_shares([certified])["certified"] == 0
    text = "\n".join(certificate_lines(rows))
    assert "certificates: void" in text and "none is counted" in text


def test_a_text_reward_leaving_its_own_range_later_voids_the_certificates_too(stepped, tmp_path):
    """Without --reward-range a text reward's range is its own [0, 1]: a value outside it at step 1 stops the run as
    a declared range does, with the void mark after step 0's row."""
    from llm.run.rundir import read_metrics

    with pytest.raises(ValueError, match=r"got 1.01") as err:
        _train(tmp_path, "text", reward_fn=f"{stepped}:text_over_later", heldout_prompts=4)
    assert "\n" not in str(err.value)
    lines = [json.loads(line) for line in (tmp_path / "text" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and "loss" in lines[0] and lines[1]["step"] == 1 and lines[1]["bound/certificates_void"]
    assert read_metrics(tmp_path / "text")[0]["bound/certificates_void"] == 1.0


def test_a_test_reward_outside_the_range_names_the_rows_step(stepped, tmp_path):
    """The evaluation after step 1's update scores the policy after 2 updates: the step it stops at is the row's, 1
    (it said 2, a step the run never reached)."""
    from runkit.cli import RunError

    with pytest.raises(RunError, match=r"step 1: a test") as err:
        _train(tmp_path, "eval", reward_funcs=(f"{stepped}:over_in_the_second_evaluation",), reward_range=(0, 1),
               eval_steps=2)
    lines = [json.loads(line) for line in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1] and "loss" in lines[0] and lines[1]["bound/certificates_void"]
    assert "lies outside the declared range [0, 1]" in str(err.value)


# ---- float rounding at an edge is the edge -------------------------------------------------------------------------


def test_rewards_at_an_edge_by_float_rounding_are_the_edge_and_the_run_trains_on(stepped, tmp_path):
    """0.1 + 0.2 under a declared [0, 0.3], and a text reward of 1.0000000000000002 under its own [0, 1]: both runs
    train to their end, the rewards read as the edge (``bound/rewards_rounded`` counts them) and the certificates
    certify or not as usual; a real excess still stops the run, its value printed with every digit."""
    from runkit.cli import RunError

    from llm.config.ranges import beyond_range, onto_range
    from llm.step.monitors import DeclaredRange

    rows, _, _ = _train(tmp_path, "tenths", reward_funcs=(f"{stepped}:tenths",), reward_range=(0, 0.3),
                        heldout_prompts=4)
    assert len(rows) == 3 and sum(r["bound/rewards_rounded"] for r in rows) > 0
    assert all(np.isfinite(r["heldout/improvement_lcb"]) for r in rows)
    rows, _, _ = _train(tmp_path, "ulp", reward_fn=f"{stepped}:over_by_an_ulp", heldout_prompts=4)
    assert len(rows) == 3 and sum(r["bound/rewards_rounded"] for r in rows) > 0
    assert not beyond_range([0.1 + 0.2, (0.1 + 0.1 + 0.1) / 3 * 3], 0.0, 0.3).any()
    assert beyond_range([0.3001, float("nan")], 0.0, 0.3).tolist() == [True, False]
    values, moved = onto_range(np.array([0.30000000000000004, 0.1]), 0.0, 0.3)
    assert values[0] == 0.3 and moved == 1
    rewards = np.array([[0.2, 1.0000000000000002]])
    assert DeclaredRange((0, 1), [], print).check(0, "training", rewards) == 1 and rewards[0, 1] == 1.0
    with pytest.raises(RunError, match=r"reward 1\.0000001 lies outside"):
        DeclaredRange((0, 1), [], print).check(0, "training", np.array([1.0000001]))


def test_a_test_prompts_mean_at_an_edge_by_rounding_is_the_edge():
    """A test prompt's mean of three 0.1 rewards is 0.10000000000000002: under a declared [0, 0.1] the run
    certificate reads 0.1, where it used to abstain."""
    from llm.evaluation.policy_eval import improvement_bounds

    mean = np.mean([0.1, 0.1, 0.1])
    assert mean > 0.1
    now, before = {"accuracy_sampled": np.full(40, mean)}, {"accuracy_sampled": np.full(40, 0.0)}
    assert np.isfinite(improvement_bounds(now, before, 0.95, 1, (0.0, 0.1))["eval/improvement_lcb"])


def test_the_run_certificate_spends_half_its_level_on_each_accuracy():
    """The sampled and the greedy bound hold at once at the run's level: each at 1 - (1 - level) / 2 (a union bound
    over the two, on top of the one over the looks)."""
    from grpo_theory.betting import spent_level
    from grpo_theory.estimators import lower_confidence_bound

    from llm.evaluation.policy_eval import certificate_level, improvement_bounds

    assert certificate_level(0.95) == pytest.approx(0.975)
    a, b = np.tile([0.5, 1.0, 0.25, 0.75], 10), np.tile([0.25, 0.5, 0.25, 0.5], 10)
    out = improvement_bounds({"accuracy_sampled": a, "accuracy_greedy": a}, {"accuracy_sampled": b,
                                                                            "accuracy_greedy": b}, 0.95, 2, (0.0, 1.0))
    expected = lower_confidence_bound(a - b, spent_level(0.975, 2), low=-1.0, high=1.0)
    assert out["eval/improvement_lcb"] == pytest.approx(expected) == out["eval/improvement_lcb_greedy"]
    assert expected < lower_confidence_bound(a - b, spent_level(0.95, 2), low=-1.0, high=1.0)


def test_the_report_says_abstained_where_every_certificate_abstained():
    from llm.analysis.report import certificate_lines

    rows = [{"step": k, "heldout/improvement_lcb": float("nan"), "bound/range_declared": 0.0,
             "heldout/bound_est/lower_tight": 0.1} for k in range(3)]
    rows[-1].update({"eval/improvement_lcb": float("nan"), "eval/improvement_lcb_greedy": float("nan")})
    lines = certificate_lines(rows)
    step_line = next(line for line in lines if "improvement certificate" in line)
    run_line = next(line for line in lines if "run certificate" in line)
    assert "abstained on all 3 steps" in step_line and "%" not in step_line.split(";")[0]
    assert "sampled accuracy abstained, greedy abstained" in run_line and "nan" not in run_line


@pytest.mark.slow
def test_without_a_declared_range_the_run_trains_and_the_certificates_abstain(stepped, tmp_path):
    rows, said, _ = _train(tmp_path, "undeclared", reward_funcs=(f"{stepped}:correct",), heldout_prompts=4,
                           eval_steps=2)
    assert [r["bound/range_declared"] for r in rows] == [0.0] * 3
    assert all(math.isnan(r["heldout/improvement_lcb"]) and math.isnan(r["heldout/improvement_e"]) for r in rows)
    assert all(math.isnan(r["eval/improvement_lcb"]) for r in rows if "eval/improvement_lcb" in r)
    assert any("reward range: not declared" in s and "--reward-range" in s for s in said)
    rows, said, _ = _train(tmp_path, "declared", reward_funcs=(f"{stepped}:correct",), heldout_prompts=4,
                           eval_steps=2, reward_range=(0, 1))  # TRL's reward function unchanged, one flag
    assert [r["bound/range_declared"] for r in rows] == [1.0] * 3
    assert all(np.isfinite(r["heldout/improvement_lcb"]) for r in rows)
    assert any("reward range: [0, 1] (declared with --reward-range)" in s for s in said)


def test_with_the_trainers_recomputed_log_alpha_the_step_certificate_abstains(tmp_path):
    rows, said, _ = _train(tmp_path, "recompute", behaviour_logprobs="recompute", heldout_prompts=4)
    assert all(math.isnan(r["heldout/improvement_lcb"]) for r in rows)
    assert any("behaviour_logprobs recompute" in s for s in said)
    rows, _, _ = _train(tmp_path, "sampler", heldout_prompts=4)
    assert all(np.isfinite(r["heldout/improvement_lcb"]) for r in rows)


# ---- the run certificate's looks ---------------------------------------------------------------------------------


def test_a_resumed_run_never_reuses_an_evaluation_look(tmp_path):
    """Evaluations after steps 2 and 3 (the last) of a 3-step run are looks 1 and 2; resumed to 4 steps, the next
    evaluation is look 3 (ceil(4 / 2) = 2 would spend look 2's level twice)."""
    from llm.evaluation.policy_eval import improvement_bounds

    rows, _, path = _train(tmp_path, "looks", eval_steps=2)
    assert torch.load(path / "checkpoint.pt", weights_only=True)["eval_looks"] == 2
    rows, _, path = _train(tmp_path, "looks", eval_steps=2, max_steps=4)
    assert torch.load(path / "checkpoint.pt", weights_only=True)["eval_looks"] == 3
    a, b = np.tile([0.5, 1.0, 0.25, 0.75], 10), np.tile([0.25, 0.5, 0.25, 0.5], 10)
    three, two = (improvement_bounds({"accuracy_sampled": a}, {"accuracy_sampled": b}, 0.95, k, (0.0, 1.0))
                  for k in (3, 2))
    assert three["eval/improvement_lcb"] < two["eval/improvement_lcb"]  # a later look spends a smaller share


def test_the_run_certificate_reads_the_declared_range():
    from llm.evaluation.policy_eval import improvement_bounds

    now, before = {"accuracy_sampled": np.full(40, 2.0)}, {"accuracy_sampled": np.full(40, 0.0)}
    unit = improvement_bounds({"accuracy_sampled": np.full(40, 1.0)}, before, 0.95, 1, (0.0, 1.0))
    wide = improvement_bounds(now, before, 0.95, 1, (0.0, 2.0))
    assert wide["eval/improvement_lcb"] == pytest.approx(2 * unit["eval/improvement_lcb"])
    assert math.isnan(improvement_bounds(now, before, 0.95, 1, None)["eval/improvement_lcb"])
    assert math.isnan(improvement_bounds(now, before, 0.95, 1, (0.0, 1.0))["eval/improvement_lcb"])  # 2 outside


def test_certified_refuses_nan_values_and_an_abstention_does_not_certify():
    from grpo_theory.certificate import certified

    assert not certified(np.full((1, 4), 0.5), 0.95, method="t_unguaranteed")[0]  # below min_count: abstains
    with pytest.raises(ValueError):
        certified(np.array([[0.5, np.nan] * 10]), 0.95)


def test_reasoning_gyms_spell_backward_scoring_a_near_miss_above_1_is_read_as_1():
    """spell_backward scores an answer with one letter too many 1.0000000000000002: the task's reward returns it (a
    source within rounding of its own [0, 1]) and the run's range check reads it as 1 instead of stopping."""
    pytest.importorskip("reasoning_gym")
    from llm.models.model import load_tokenizer
    from llm.models.tiny import tiny_model_dir
    from llm.step.monitors import DeclaredRange
    from llm.tasks.procedural import reasoning_gym_task

    task = reasoning_gym_task("spell_backward").bind(load_tokenizer(str(tiny_model_dir())))
    n = min(64, len(task.task.answers))
    texts = [task.task.answers[i] + "x" for i in range(n)]
    rewards = task.score(list(range(n)), texts, [[1]] * n)
    assert (rewards > 1).sum() > 0 and rewards.max() == 1.0000000000000002  # what the scorer says
    above = int((rewards > 1).sum())
    assert DeclaredRange((0, 1), [], print).check(0, "training", rewards) == above
    assert rewards.max() == 1.0  # read as the edge, in place

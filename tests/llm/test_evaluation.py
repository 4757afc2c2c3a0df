"""llm.evaluation: the exact J of the built-in task is the sampled success rate, and samplers sample what they report."""

import pytest
import torch
from scipy import stats

from llm.tensors.token_filter import TokenFilter
from llm.evaluation import EvalSpec, evaluate, exact_pass_at_k, maj_at_k, pass_at_k
from llm.evaluation.passk import ks_up_to
from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from llm.sampling import TransformersSampler
from llm.tasks import arithmetic_task
from tests.helpers import (
    exact_j_matches_sampling,
    first_tokens_match_reported_probabilities,
    model_dir_with_stored_generation_config,
)


@pytest.fixture(scope="module")
def tiny():
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    return policy, tok


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_j_is_the_sampled_success_rate(tiny, temperature):
    policy, tok = tiny
    sampler = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id, copy=False)
    exact_j_matches_sampling(sampler, policy, arithmetic_task().bind(tok), temperature)


def test_stored_generation_config_does_not_change_what_is_sampled(tmp_path):
    """A model directory whose generation_config.json sets repetition_penalty 1.5 and top_k 3: the sampler
    still samples softmax(logits / T), the distribution it reports and the trainer recomputes."""
    path = model_dir_with_stored_generation_config(tiny_model_dir(), tmp_path / "model")
    policy, tok = load_policy(str(path), torch.device("cpu"))
    assert policy.generation_config.repetition_penalty == 1.5  # the stored config is really there
    sampler = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id)
    first_tokens_match_reported_probabilities(sampler, policy, tok, "3+4=")
    assert policy.generation_config.top_k == 3  # and is left as it was for the user's own generate()


@pytest.mark.slow
@pytest.mark.parametrize("token_filter,cells", [(TokenFilter(top_p=0.9), 4), (TokenFilter(top_k=3, min_p=0.05), 3)])
def test_the_transformers_sampler_draws_from_the_filtered_distribution_it_reports(tiny, token_filter, cells):
    """top-p, top-k and min-p in the transformers sampler: first tokens pass a chi-square test against the filtered
    probabilities the sampler reports, which equal the trainer's filtered log-probs; none is drawn off the kept set;
    and the exact J of the filtered policy is the sampled success rate. On the built-in model top-p 0.9 keeps 4 first
    tokens of "3+4=" (cumulative mass 0.8587 after 3, 0.9553 after 4), top-k 3 with min-p 0.05 keeps 3 (the third at
    0.111 against a floor of 0.028): the kept sets are far from their boundaries on every kernel."""
    policy, tok = tiny
    sampler = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id, copy=False)
    first_tokens_match_reported_probabilities(sampler, policy, tok, "3+4=", token_filter=token_filter,
                                              min_cells=cells)
    exact_j_matches_sampling(sampler, policy, arithmetic_task().bind(tok), 1.0, n=600, token_filter=token_filter)


# ---- pass@k and maj@k ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(4, 1), (8, 4), (16, 8), (5, 5)])
@pytest.mark.parametrize("p", [0.0, 0.05, 0.3, 0.9, 1.0])
def test_pass_at_k_is_unbiased_for_one_minus_one_minus_p_to_the_k(n, k, p):
    """The estimator's exact expectation over c ~ Binomial(n, p) is 1 - (1 - p)^k, the probability that k samples
    include a solution."""
    expectation = sum(stats.binom.pmf(c, n, p) * pass_at_k(n, c, k) for c in range(n + 1))
    assert expectation == pytest.approx(1 - (1 - p) ** k, abs=1e-12)
    assert exact_pass_at_k([p], k)[0] == pytest.approx(1 - (1 - p) ** k, abs=1e-15)


def test_maj_at_k_counts_every_subset_and_splits_ties():
    """Answers a, a, b, c with a correct: one sample votes a half the time; three samples vote a in the two subsets
    holding both a's and tie three ways in the other two: (1 + 1 + 1/3 + 1/3)/4."""
    keys, rewards = ["a", "a", "b", "c"], [1.0, 1.0, 0.0, 0.0]
    assert maj_at_k(keys, rewards, 1) == pytest.approx(0.5)
    assert maj_at_k(keys, rewards, 3) == pytest.approx((1 + 1 + 1 / 3 + 1 / 3) / 4)
    assert maj_at_k(keys, rewards, 4) == pytest.approx(1.0)
    assert ks_up_to(8) == [1, 2, 4, 8] and ks_up_to(6) == [1, 2, 4, 6]


@pytest.mark.slow
def test_the_run_evaluations_pass_at_k_matches_the_exact_one(tiny):
    """On the built-in task, where J(pi | x) is exact: pass@k from 32 sampled completions of each of the 40 test
    prompts lies within 0.05 of 1 - (1 - J)^k averaged over them (the estimate's standard error here is ~0.01)."""
    policy, tok = tiny
    out = evaluate(policy, arithmetic_task().bind(tok), EvalSpec(1.0, TokenFilter(), 32, 6, (1, 4, 32)), seed=0,
                   pad=tok.pad_token_id)
    for k in (1, 4, 32):
        assert out[f"eval/pass@{k}"] == pytest.approx(out[f"eval/pass@{k}_exact"], abs=0.05), k
    assert out["eval/pass@1"] == pytest.approx(out["eval/accuracy_sampled"], abs=1e-12)
    assert out["eval/pass@1_exact"] == pytest.approx(out["eval/j"], abs=1e-12)
    assert out["eval/maj@1"] == pytest.approx(out["eval/accuracy_sampled"], abs=1e-12)


def test_the_transformers_sampler_in_micro_batches_samples_what_the_unsplit_call_samples(tiny):
    """Each sequence draws from its own random stream: the same call in micro-batches of 5 sequences (prompts of
    different lengths, so other padding in each batch) gives the same completions and, to float rounding, the same
    log-probs as in one batch; another seed gives other completions."""
    policy, tok = tiny
    bound = arithmetic_task().bind(tok)
    prompts = bound.prompt_ids[::9]
    whole = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id, copy=False)
    split = TransformersSampler(policy, tok.eos_token_id, tok.pad_token_id, copy=False, batch_size=5)
    a, b = (s.generate(prompts, 4, 6, 1.0, seed=3, token_filter=TokenFilter(top_p=0.95)) for s in (whole, split))
    assert a.completion_ids == b.completion_ids and len(a.completion_ids) == 4 * len(prompts)
    assert max(abs(x - y) for la, lb in zip(a.logprobs, b.logprobs) for x, y in zip(la, lb)) < 1e-5
    assert whole.generate(prompts, 4, 6, 1.0, seed=4).completion_ids != a.completion_ids


# ---- the run's certificate ------------------------------------------------------------------------------------


def test_the_runs_certificate_is_the_betting_bound_on_paired_differences_at_the_spent_level():
    """``improvement_bounds``: for each accuracy, the betting bound on the per-prompt differences now - before at
    the level spent on the look-th evaluation of half the run's miss (so every look's bounds, sampled and greedy, hold
    at once), for rewards in the declared range
    [0, 1]; nan when an accuracy leaves it; accuracies without a first evaluation are skipped; a later look is never
    less strict."""
    import numpy as np

    from grpo_theory.betting import spent_level
    from grpo_theory.estimators import lower_confidence_bound
    from llm.evaluation.policy_eval import improvement_bounds

    g = np.random.default_rng(0)
    before = {"accuracy_sampled": g.uniform(0, 0.4, 113), "accuracy_greedy": (g.random(113) < 0.2).astype(float)}
    now = {"accuracy_sampled": np.clip(before["accuracy_sampled"] + g.uniform(0, 0.6, 113), 0, 1),
           "accuracy_greedy": np.maximum(before["accuracy_greedy"], (g.random(113) < 0.5).astype(float))}
    unit = (0.0, 1.0)
    out = improvement_bounds(now, before, 0.95, 4, unit)
    d = now["accuracy_sampled"] - before["accuracy_sampled"]
    assert out["eval/improvement_lcb"] == pytest.approx(lower_confidence_bound(d, spent_level(0.975, 4), low=-1,
                                                                               high=1))  # half the miss each
    assert 0 < out["eval/improvement_lcb"] < d.mean() and 0 < out["eval/improvement_lcb_greedy"]
    assert improvement_bounds(now, before, 0.95, 40, unit)["eval/improvement_lcb"] <= out["eval/improvement_lcb"]
    wide = {**now, "accuracy_sampled": now["accuracy_sampled"] * 2.0}
    assert np.isnan(improvement_bounds(wide, before, 0.95, 1, unit)["eval/improvement_lcb"])
    assert improvement_bounds(now, {"accuracy_greedy": before["accuracy_greedy"]}, 0.95, 1, unit).keys() == {
        "eval/improvement_lcb_greedy"}


@pytest.mark.slow
def test_a_run_logs_its_certificate_at_every_evaluation_after_the_first_and_after_a_resume(tmp_path):
    """Evaluations every 2 steps of 6: eval/improvement_lcb (and _greedy) at steps 1, 3 and 5, none at step 0 (the
    first evaluation is the baseline); a run stopped after step 3 and resumed logs it at step 5 too, from the
    checkpointed baseline, equal to the uninterrupted run's."""
    from llm import GRPOConfig, train
    from llm.run.rundir import read_metrics

    kw = dict(sampler="transformers", max_steps=6, eval_steps=2, progress=False, logging_steps=1000, save_steps=2)
    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "whole"), **kw), log=lambda *a: None))
    logged = [r["step"] for r in rows if "eval/improvement_lcb" in r]
    assert logged == [1, 3, 5] and all("eval/improvement_lcb_greedy" in rows[s] for s in logged)
    assert all(-1 <= rows[s]["eval/improvement_lcb"] <= 1 for s in logged)
    train(GRPOConfig(output_dir=str(tmp_path / "cut"), **{**kw, "max_steps": 4}), log=lambda *a: None)
    resumed = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "cut"), **kw), log=lambda *a: None))
    assert resumed[5]["eval/improvement_lcb"] == pytest.approx(rows[5]["eval/improvement_lcb"], abs=1e-9)

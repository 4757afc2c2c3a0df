"""Checks shared by the transformers and vLLM tests: exact J against sampled success rates, and sampled
first-token frequencies against the probabilities a sampler reports."""

import json
import math
import shutil

import numpy as np
import torch
from scipy import stats

from llm.batch import make_batch
from llm.logprobs import LogitHead, completion_logprobs
from llm.evaluation import exact_j
from llm.tasks import TokenizedTask

#: A stored generation config of the kind hub instruct models ship; it must not act on alpha.
STORED_GENERATION_CONFIG = {"repetition_penalty": 1.5, "top_k": 3, "do_sample": True}
#: Tests reject at this p-value (each test makes a handful of comparisons).
P_REJECT = 1e-4


def exact_j_matches_sampling(sampler, policy, bound: TokenizedTask, temperature: float, n: int = 1500) -> None:
    """Sample n completions of ten training prompts: the success count of every prompt is consistent with
    Binomial(n, J) for the exact J of that prompt (exact binomial test), and so is the pooled count (z-test)."""
    idx = list(range(0, len(bound.prompt_ids), 16))[:10]
    prompts = [bound.prompt_ids[i] for i in idx]
    j = exact_j(policy, prompts, [bound.accepted_ids[i] for i in idx], temperature, bound.tokenizer.pad_token_id)
    roll = sampler.generate(prompts, n, 6, temperature, 0)
    texts = bound.tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=True)
    hits = bound.score([i for i in idx for _ in range(n)], texts, roll.completion_ids).reshape(len(idx), n).sum(1)
    for k, p in zip(hits, j):
        assert stats.binomtest(int(k), n, float(p)).pvalue > P_REJECT, (int(k), n, float(p))
    z = (hits.sum() - n * j.sum()) / np.sqrt((n * j * (1 - j)).sum())
    assert abs(z) < 4, (hits / n, j, z)
    assert j.min() < 0.9 * j.max()  # prompts differ: the test is not passed by one shared rate


def model_dir_with_stored_generation_config(src, dst):
    """A copy of the model directory ``src`` whose generation_config.json sets a repetition penalty and top-k."""
    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**stored, **STORED_GENERATION_CONFIG}))
    return dst


def first_tokens_match_reported_probabilities(sampler, policy, tok, prompt: str, n: int = 3000) -> None:
    """n one-token completions of ``prompt``: the token frequencies pass a chi-square test against the
    probabilities the sampler reported, and those equal the trainer's softmax(logits / T) to 1e-4."""
    ids = tok(prompt).input_ids
    roll = sampler.generate([ids], n, 1, 1.0, 0)
    first = [c[0] for c in roll.completion_ids]
    reported = {}
    for c, lp in zip(roll.completion_ids, roll.logprobs):
        reported.setdefault(c[0], lp[0])
    with torch.no_grad():
        hidden = completion_logprobs(policy, make_batch([ids], [[0]], tok.pad_token_id, "cpu"), 1.0, keep_hidden=True).hidden
        probs = LogitHead(policy, 1.0).logprobs(hidden[0, :1])[0].double().exp().numpy()
    for t, lp in reported.items():
        assert abs(lp - np.log(probs[t])) < 1e-4, (t, lp, np.log(probs[t]))
    counts = np.bincount(first, minlength=len(probs)).astype(float)
    expected = n * probs
    big = expected >= 5  # chi-square cells: every token expected 5+ times, the rest pooled
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    assert big.sum() >= 4  # a spread-out distribution, so a top-k of 3 could not pass
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > P_REJECT, (obs, exp)


def same(a: float, b: float, rel: float, abs_: float) -> bool:
    """Two logged numbers agree: within the tolerances, or both nan (a standard error of fewer than 2 prompts)."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_) or (math.isnan(a) and math.isnan(b))

"""What several test modules share: exact-J and sampling checks, tolerances, small sequences and models, the vLLM sync
helpers, the float64 optimiser case."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from llm import GRPOConfig
from llm.tensors.batch import make_batch, padded
from llm.tensors.logit_head import LogitHead
from llm.tensors.logprobs import completion_logprobs
from llm.tensors.token_filter import NO_FILTER
from llm.evaluation import exact_j
from llm.models.distributed import SINGLE, shard_blocks
from llm.models.model import Precision, frozen_copy, load_policy
from llm.models.tiny import tiny_model_dir
from llm.optim import optimise
from llm.run import specs
from llm.step.score import advantages
from llm.tasks import TokenizedTask, arithmetic_task

from fixtures.logprobs import chunked_logprobs_and_gradients, sequences  # noqa: F401  (tests import them here)

#: The repository's root (the working directory of the subprocesses tests start).
ROOT = Path(__file__).resolve().parents[1]


def run_cli(main, prog: str, argv: list[str]) -> tuple[int, str, str]:
    """A command's ``main`` run in this process as ``python -m`` runs it (through ``run_main``, ``argv`` as its
    arguments): (exit status, what it printed, what it printed to stderr)."""
    import contextlib
    import io
    from unittest import mock

    from runkit.cli import run_main

    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with mock.patch("sys.argv", [prog, *argv]), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run_main(main, prog)
            except SystemExit as exc:
                return int(exc.code or 0), out.getvalue(), err.getvalue()
    finally:
        torch.set_num_threads(threads)  # --num-threads is the process's; the test's own computations keep theirs
    raise AssertionError("run_main always exits")


def train_command(*argv: str) -> str:
    """``python -m llm.train ARGV`` run in this process (``run_cli``: what the command runs once its interpreter has
    started); what it printed. For the one-process runs the torchrun and SIGKILL tests compare with: each spares an
    interpreter's imports (torch, transformers: about 6 s of a core). Asserts that the run succeeded."""
    from llm.commands.train import PROG, main

    status, out, err = run_cli(main, PROG, list(argv))
    assert status == 0, err[-2000:]
    return out


#: float32 agreement of two summation orders of the same quantities (gradients, log-probs).
RTOL, ATOL = 1e-4, 1e-6
#: float64 agreement of a step split into micro-batches and the unsplit step (measured: ~1e-14).
RTOL64 = 1e-10


#: Gradients of a float64 model through shared prompts against whole sequences: transformers' RMSNorm computes its
#: variance in float32 whatever the model's dtype, so the two summation orders agree to float32 rounding (measured
#: 4e-8 to 6e-8 relative); a prompt's gradient counted once instead of G times is off by order one.
SHARED_GRAD_RTOL = 1e-6


def one_block_model_dir(dst: Path) -> Path:
    """The built-in model cut to its first decoder block, saved as a model directory (weights, config, tokenizer) in
    ``dst``: what the compiled-model tests compile. Each block gets graphs of its own where it reads a prompt's
    key-value cache (dynamo specialises on the block's layer index)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm.models.tiny import tiny_model_dir

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    model.config.layer_types = model.config.layer_types[:1]
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(tiny_model_dir()).save_pretrained(dst)
    return dst


def same_gradient(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> bool:
    """Equal up to summation order: ||a - b|| <= rtol ||b|| (elementwise tests fail on entries that are sums of
    cancelling terms)."""
    return float((a - b).norm()) <= rtol * float(b.norm()) + 1e-30


def plain_full(model, batch, temperature=1.0):
    """log softmax of the model's own logits at the completion positions, (B, T, V) (the unchunked reference)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                   use_cache=False).logits
    T, lp = batch.completion_ids.shape[1], batch.prompt_width
    return torch.log_softmax(logits[:, lp - 1: lp - 1 + T].to(torch.promote_types(logits.dtype, torch.float32))
                             / temperature, dim=-1)


def plain_logprobs(model, batch, temperature=1.0):
    full = plain_full(model, batch, temperature)
    logp = full.gather(-1, batch.completion_ids[..., None]).squeeze(-1) * batch.completion_mask
    entropy = -(full.exp() * full).sum(-1) * batch.completion_mask
    return logp, entropy


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradient of every step it takes."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


CASES = [("grpo", "token", True), ("grpo", "token", False), ("grpo", "sequence", True), ("dapo", "token", True),
         ("dapo", "token", False), ("dr_grpo", "token", True), ("dr_grpo", "token", False)]


def optimise_case(loss_type, ratio_level, mask, micro_batch, checkpointing=False, by_length=False, ranks=SINGLE,
                  padding_free=False):
    """One step of 3 prompts x G = 3 (one group with equal rewards) with alpha != pi_k, beta > 0 and i = 2, in
    float64, so that any difference between two splits above 1e-10 is an error, not rounding. ``ranks``: this
    process's share of the prompts among several (tests/llm/test_distributed.py)."""
    torch.manual_seed(0)
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    policy.double()
    if checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.train()
    alpha, ref = frozen_copy(policy), frozen_copy(policy)
    with torch.no_grad():  # alpha and pi_ref away from pi_k (at pi_ref = pi_k the KL gradient is rounding noise)
        for p, q in zip(alpha.parameters(), ref.parameters()):
            p.add_(0.005 * torch.randn_like(p))
            q.add_(0.005 * torch.randn_like(q))
    if ranks.fsdp:  # tests/llm/test_distributed.py: the three copies sharded as the trainer shards them
        for model in (policy, alpha, ref):
            shard_blocks(model)
    G = 3
    prompts, comps = sequences(tok, 3 * G, seed=1)
    batch = make_batch([p for p in prompts[:3] for _ in range(G)], comps, tok.pad_token_id, "cpu")
    config = GRPOConfig(prompts_per_step=3, num_generations=G, loss_type=loss_type, ratio_level=ratio_level,
                        mask_zero_std_groups=mask, beta=0.1, num_iterations=2, epsilon=0.1, max_completion_length=6,
                        per_device_train_batch_size=micro_batch, logit_chunk_tokens=5, group_by_length=by_length,
                        tv_diagnostics=True, share_prompts=False,  # exact float64 sums (sharing: its own test)
                        padding_free=padding_free)
    passes = dataclasses.replace(specs.passes(config, ranks), precision=Precision())
    groups = advantages(np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]), config.variance_eps, True, mask)
    a = completion_logprobs(alpha, batch, 1.0, keep_hidden=True)
    logp_ref = completion_logprobs(ref, batch, 1.0).logp
    with torch.no_grad():  # the chain-rule TV of pi_k (the policy before the update) and alpha, from full logits
        tv = 0.5 * (plain_full(policy, batch).exp() - plain_full(alpha, batch).exp()).abs().sum(-1)
        chain_tv_k = float((tv * batch.completion_mask).sum(1).mean())
    optimizer = RecordingSGD(policy.parameters(), lr=0.5)
    out = optimise(passes, specs.objective(config), policy, optimizer, batch, groups.advantages, groups.keep,
                   a.logp, logp_ref, passes.dists(alpha, a.hidden))
    assert math.isclose(out.chain_tv_k, chain_tv_k, rel_tol=1e-6)  # tv_rows sums in float32
    return out, optimizer.grads


#: After a sync, sampler and trainer log-probs of the sampled tokens agree to this (fp32).
SYNC_ATOL = 1e-4


def long_prompts(tok, n=48):
    """n prompts of 49 tokens (longer than a KV cache block of 32: the engine caches their first block)."""
    return [tok("+".join(str((i * 7 + j) % 10) for j in range(24)) + "=").input_ids for i in range(n)]


def max_logp_gap(sampler, model, tok, seed=0, prompts=None, token_filter=NO_FILTER) -> float:
    task = arithmetic_task()
    prompts = prompts or [tok(p).input_ids for p in task.prompts[::25]]
    roll = sampler.generate(prompts, 4, 6, 1.0, seed, token_filter=token_filter)
    batch = make_batch([p for p in prompts for _ in range(4)], roll.completion_ids, tok.pad_token_id, "cpu")
    with torch.no_grad():
        logp = completion_logprobs(model, batch, 1.0, token_filter=token_filter).logp
    gap = (padded(roll.logprobs, logp.shape[1], "cpu") - logp).abs() * batch.completion_mask
    return float(gap.max())


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))


#: Learning test: the exact J over the training prompts must rise by this much (from 0.2431, the shipped built-in
#: model). Measured, seed 0, under the host's and the AVX2 kernels of an AVX-512 host: the trainer +0.115 to +0.130 in
#: 80 steps (v = 1 and 4, one and two threads), asynchronous generation +0.090, TRL's default correction +0.088,
#: vLLM's server +0.101 (all one thread a test, as under make test).
LEARNING_MARGIN = 0.05


#: A stored generation config of the kind hub instruct models ship; it must not act on alpha.
STORED_GENERATION_CONFIG = {"repetition_penalty": 1.5, "top_k": 3, "do_sample": True}


#: Tests reject at this p-value (each test makes a handful of comparisons).
P_REJECT = 1e-4


def exact_j_matches_sampling(sampler, policy, bound: TokenizedTask, temperature: float, n: int = 1500,
                             token_filter=NO_FILTER) -> None:
    """Sample n completions of ten training prompts: the success count of every prompt is consistent with
    Binomial(n, J) for the exact J of that prompt (exact binomial test), and so is the pooled count (z-test); with
    ``token_filter`` both are the filtered policy's."""
    idx = list(range(0, len(bound.prompt_ids), 16))[:10]
    prompts = [bound.prompt_ids[i] for i in idx]
    j = exact_j(policy, prompts, [bound.accepted_ids[i] for i in idx], temperature, bound.tokenizer.pad_token_id,
                token_filter=token_filter)
    roll = sampler.generate(prompts, n, 6, temperature, 0, token_filter=token_filter)
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


def first_tokens_match_reported_probabilities(sampler, policy, tok, prompt: str, n: int = 3000,
                                              token_filter=NO_FILTER, min_cells: int = 4) -> None:
    """n one-token completions of ``prompt``: the token frequencies pass a chi-square test against the
    probabilities the sampler reported, and those equal the trainer's softmax(logits / T) (filtered by
    ``token_filter``) to 1e-4; no token off the kept set is ever drawn."""
    ids = tok(prompt).input_ids
    roll = sampler.generate([ids], n, 1, 1.0, 0, token_filter=token_filter)
    first = [c[0] for c in roll.completion_ids]
    reported = {}
    for c, lp in zip(roll.completion_ids, roll.logprobs):
        reported.setdefault(c[0], lp[0])
    with torch.no_grad():
        hidden = completion_logprobs(policy, make_batch([ids], [[0]], tok.pad_token_id, "cpu"), 1.0, keep_hidden=True).hidden
        probs = LogitHead(policy, 1.0, token_filter).logprobs(hidden[0, :1])[0].double().exp().numpy()
    for t, lp in reported.items():
        assert abs(lp - np.log(probs[t])) < 1e-4, (t, lp, np.log(probs[t]))
    counts = np.bincount(first, minlength=len(probs)).astype(float)
    expected = n * probs
    big = expected >= 5  # chi-square cells: every token expected 5+ times, the rest pooled
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() > 0:  # the rest pooled (a filter may leave nothing outside the big cells)
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
    assert counts[probs == 0].sum() == 0  # nothing outside the kept set
    assert big.sum() >= min_cells  # a spread-out distribution, so a top-k of 3 could not pass
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > P_REJECT, (obs, exp)


#: Theorem 1's estimated lower bounds and the terms each is the difference of.
BOUND_TERMS = {"lower": ("surrogate", "penalty_tv", "penalty_lag"),
               "lower_tight": ("surrogate", "penalty_tv_tight", "penalty_lag_tight")}


def metric_atol(row: dict, key: str, rtol: float, atol: float, heldout_prompts: int, level: float = 0.95) -> float:
    """The absolute tolerance of the logged metric ``key`` of ``row`` when two runs (micro-batched and not, FSDP and
    one process) compute every per-prompt value to a relative ``rtol`` of itself: a plain mean agrees to rtol of
    itself (``atol`` beside it), but a metric that is a difference of such values carries their size, not its own:

    - an estimated lower bound (surrogate - penalty_tv - penalty_lag): rtol times the sum of its terms' magnitudes;
    - a standard error ``X_se`` over n <= ``heldout_prompts`` values x_i (each within rtol |x_i|): the deviations
      x_i - mean move by at most 2 rtol max|x_i|, and max|x_i| <= |mean| + se sqrt(n (n - 1)), so the error moves by
      at most 2 rtol (|mean| + sqrt(n) se) for every n in [2, heldout_prompts];
    - a lower confidence bound mean - t se: rtol |mean| plus t_{n - 1}(level) times the standard error's tolerance
      (t at n = 2, the largest)."""
    from scipy import stats

    value = row[key]
    if isinstance(value, str) or not math.isfinite(value):
        return atol
    prefix, _, name = key.rpartition("bound_est/")
    if prefix and name in BOUND_TERMS:
        return atol + rtol * sum(abs(row[f"{prefix}bound_est/{t}"]) for t in BOUND_TERMS[name])
    if key.endswith("_se") and key[:-3] in row:
        return atol + 2 * rtol * (abs(row[key[:-3]]) + math.sqrt(heldout_prompts) * value)
    if key.endswith("_lcb"):
        mean, se = key[:-4], key[:-4] + "_se"
        if mean in row and se in row and math.isfinite(row[se]):
            return (atol + rtol * abs(row[mean]) + stats.t.ppf(level, 1) *
                    metric_atol(row, se, rtol, 0.0, heldout_prompts, level))
    return atol + rtol * abs(value)


def same_metric(want: dict, got: dict, key: str, rtol: float, atol: float, heldout_prompts: int) -> bool:
    """``got[key]`` agrees with ``want[key]`` to ``metric_atol`` (strings equal; both nan counts as equal)."""
    return same(want[key], got[key], 0.0, metric_atol(want, key, rtol, atol, heldout_prompts))


def same(a: float, b: float, rel: float, abs_: float) -> bool:
    """Two logged values agree: strings (``sync/reason``) equal; numbers within the tolerances, or both nan (a
    standard error of fewer than 2 prompts)."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_) or (math.isnan(a) and math.isnan(b))

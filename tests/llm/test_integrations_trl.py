"""``llm.integrations.trl.watch`` inside TRL 1.16's own GRPOTrainer (docs/integrations.md): TRL's loss, rewards and
logs are the same with and without it, step for step; every optimiser step logs its lag, TV and ESS, including the
stale steps of ``steps_per_generation`` and the later passes of ``num_iterations``; the readings are this project's
estimators on TRL's own tensors; the held-out certificate; the declared range and its voiding; one-line refusals;
an engine that never received the trainer's weights is flagged."""

import copy
import json
import math
import warnings

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from llm.tensors import diagnostics as dg  # noqa: E402
from llm.integrations import readings as rd  # noqa: E402
from llm.integrations.trl import TRLWatcher, watch  # noqa: E402
from llm.models.model import load_tokenizer  # noqa: E402
from llm.models.tiny import agent_model_dir, tiny_model_dir  # noqa: E402
from fixtures.agent_envs import Multiplier  # noqa: E402
from tests.llm.trl_harness import TASK, DeltaEngine, EngineTrainer, exact_reward  # noqa: E402

#: TRL's keys that are wall-clock, not a function of the seed.
CLOCK_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


class Logs(TrainerCallback):
    """Every dict TRL logs."""

    def __init__(self):
        self.rows = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.rows.append(dict(logs or {}))


class Captured(trl.GRPOTrainer):
    """TRL's trainer, keeping what its loss saw: each micro-batch's inputs and the policy's log-probs TRL computed."""

    def _compute_loss(self, model, inputs):
        self._in_loss, self._logp = True, None
        loss = super()._compute_loss(model, inputs)
        self._in_loss = False
        inputs = dict(inputs)
        if getattr(self, "offpolicy_watch", None) is not None:  # the sampler's log-probs the watcher recorded
            inputs["recorded"] = self.offpolicy_watch.recorded(inputs)
        self.seen = getattr(self, "seen", []) + [(self.state.global_step, inputs, self._logp)]
        return loss

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if getattr(self, "_in_loss", False) and self._logp is None:
            self._logp = out[0].detach().clone()
        return out


def trainer(tmp_path, watched=None, reward=exact_reward, cls=trl.GRPOTrainer, steps=8, model_dir=None, rows=None,
            trainer_kwargs=None, **args):
    """A TRL GRPOTrainer on the built-in model and task (32 completions per micro-batch, G = 8), and its log."""
    model_dir = model_dir or tiny_model_dir()
    settings = dict(output_dir=str(tmp_path / "out"), max_steps=steps, num_generations=8, per_device_train_batch_size=32,
                    max_completion_length=6, beta=0.0, learning_rate=3e-4, logging_steps=1, report_to="none",
                    save_strategy="no", use_cpu=True, seed=0, bf16=False, disable_tqdm=True)
    settings.update(args)
    data = rows if rows is not None else {"prompt": list(TASK.prompts), "answer": list(TASK.answers)}
    logs = Logs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = cls(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), reward_funcs=reward,
                args=trl.GRPOConfig(**settings), train_dataset=Dataset.from_dict(data) if isinstance(data, dict)
                else Dataset.from_list(data), processing_class=load_tokenizer(str(model_dir)), callbacks=[logs],
                **(trainer_kwargs or {}))
    if watched is not None:
        lines = []
        assert watch(t, log=lines.append, **watched) is t
        t.lines = lines
    return t, logs


def trl_part(row: dict) -> dict:
    """A logged row without the watcher's keys and the clock."""
    return {k: v for k, v in row.items() if k not in CLOCK_KEYS and not k.startswith(OURS)}


OURS = ("lag", "tv/", "ess/", "is_weight_seq/", "heldout/", "bound/", "sampling/logp_diff")


def step_rows(logs: Logs) -> list[dict]:
    return [r for r in logs.rows if "loss" in r]


# ---- TRL's run is the same run -------------------------------------------------------------------------------


@pytest.mark.slow
def test_watch_leaves_trls_loss_rewards_and_logs_the_same_step_for_step(tmp_path):
    """Two generations, each trained over 4 optimiser steps (steps_per_generation 2, num_iterations 2), held-out
    prompts sampled between TRL's own draws: TRL's every logged number is the same, bit for bit; every step also
    logs its lag (0, 1, 2, 3 twice), TV, ESS and the held-out certificate."""
    plain, plain_logs = trainer(tmp_path / "a", steps_per_generation=2, num_iterations=2)
    plain.train()
    watched, logs = trainer(tmp_path / "b", dict(reward_range=(0, 1), heldout_prompts=8), steps_per_generation=2,
                            num_iterations=2)
    watched.train()
    assert len(logs.rows) == len(plain_logs.rows) == 9
    for ours, theirs in zip(logs.rows, plain_logs.rows):
        assert trl_part(ours) == trl_part(theirs)
    steps = step_rows(logs)
    assert [r["lag"] for r in steps] == [0, 1, 2, 3, 0, 1, 2, 3]
    for r in steps:
        assert 0 <= r["tv/pi_k_alpha"] <= 1 and 0 < r["ess/pi_k_alpha"] <= 1 and r["tv/pi_k_alpha_se"] >= 0
        assert math.isfinite(r["heldout/improvement_lcb"]) and r["bound/range_declared"] == 1
        assert r["heldout/lag"] == r["lag"]  # the held-out set is drawn with each generation
        if r["lag"] == 0:  # alpha's weights are pi_k's: TRL's two forwards of them agree
            assert r["tv/pi_k_alpha"] < 1e-5 and r["ess/pi_k_alpha"] > 1 - 1e-9
    assert max(r["tv/pi_k_alpha"] for r in steps if r["lag"] == 3) > 0.01
    table = json.loads((tmp_path / "b" / "out" / "offpolicy_watch.json").read_text())
    assert [row["lag"] for row in table["per_lag"]] == [0, 1, 2, 3]
    assert [row["steps"] for row in table["per_lag"]] == [2, 2, 2, 2]
    assert table["certificates"]["steps_logged"] == 8 and table["stopped"] is None
    assert any("readings by lag" in line for line in watched.lines)


def test_the_readings_are_this_projects_estimators_on_trls_own_tensors(tmp_path):
    """With whole groups per step (steps_per_generation 1, num_iterations 2: lag 0, 1, 0, 1), each step's logged
    TV, its standard error, ESS and sequence weights equal ``llm.tensors.diagnostics.group_metrics`` (what llm.train
    logs) on the (P, G) log-weights rebuilt from the tensors TRL's loss used and the sampler's log-probs, to float
    rounding; the sampler's log-probs equal TRL's forward of the sampler's weights to float rounding."""
    t, logs = trainer(tmp_path, dict(), cls=Captured, steps=4, num_iterations=2, learning_rate=1e-3)
    t.train()
    rows = step_rows(logs)
    assert [r["lag"] for r in rows] == [0, 1, 0, 1]
    for row, (step, inputs, logp) in zip(rows, t.seen):
        mask = inputs["completion_mask"].float()
        alpha = inputs["recorded"]  # the sampler's own, recorded from generate's scores
        trainers = inputs.get("old_per_token_logps")
        trainers = logp if trainers is None else trainers  # TRL's forward of alpha's weights: alpha to rounding
        assert ((alpha - trainers).abs() * mask).max() < 1e-5
        log_w = ((logp - alpha) * mask).sum(1).double().numpy()
        keys = [bytes(p[m.bool()].numpy().tobytes()) for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
        order = np.argsort([sorted(set(keys)).index(k) for k in keys], kind="stable")
        grouped = log_w[order].reshape(-1, 8)
        ours = dg.group_metrics(np.zeros_like(grouped), grouped, 1e-4)
        for key in ("tv/pi_k_alpha", "ess/pi_k_alpha", "is_weight_seq/max", "is_weight_seq/mean"):
            assert row[key] == pytest.approx(ours[key], rel=1e-9, abs=1e-12), key
        per_prompt = np.mean(np.maximum(1 - np.exp(grouped), 0), axis=1)
        assert row["tv/pi_k_alpha_se"] == pytest.approx(np.std(per_prompt, ddof=1) / np.sqrt(len(per_prompt)),
                                                        rel=1e-9, abs=1e-12)
    assert rows[1]["tv/pi_k_alpha"] > 0.01  # the second pass is stale: a reading that can fail


def test_clustered_metrics_equal_group_metrics_on_whole_groups_in_any_order():
    """The plugin's estimator over completions labelled by prompt (in any order, as TRL shuffles them) is the
    trainer's ``group_metrics`` on the same (P, G) weights."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        P, G = rng.integers(2, 9), rng.integers(2, 9)
        log_w = rng.normal(0, rng.uniform(0.01, 2), size=(P, G))
        order = rng.permutation(P * G)
        ours = dg.clustered_metrics(log_w.reshape(-1)[order], np.repeat(np.arange(P), G)[order])
        theirs = dg.group_metrics(np.zeros((P, G)), log_w, 1e-4)
        for key in ("tv/pi_k_alpha", "ess/pi_k_alpha", "is_weight_seq/max", "is_weight_seq/mean"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-12), key


def test_heldout_readings_are_llm_trains_heldout_estimates_on_the_same_tensors():
    """The held-out readings (``readings.heldout_metrics``) and the trainer's own (``llm.step.diagnose.
    heldout_estimates``) on the same rewards and log-probs of alpha, pi_k and pi_{k+1}: the same numbers."""
    from llm.tensors.batch import make_batch
    from llm.step.diagnose import Heldout, heldout_estimates

    rng = np.random.default_rng(0)
    P, G, T = 12, 4, 5
    completions = [[int(x) for x in rng.integers(3, 50, size=rng.integers(1, T + 1))] for _ in range(P * G)]
    batch = make_batch([[5, 6, 7]] * (P * G), completions, pad=0, device=torch.device("cpu"))
    mask = batch.policy_mask
    logp_alpha = torch.from_numpy(rng.normal(-2, 0.5, size=mask.shape)).float() * mask
    logp_k = logp_alpha + torch.from_numpy(rng.normal(0, 0.1, size=mask.shape)).float() * mask
    logp_new = logp_k + torch.from_numpy(rng.normal(0, 0.1, size=mask.shape)).float() * mask
    rewards = rng.integers(0, 2, size=(P, G)).astype(float)

    class Passes:
        def logprobs(self, policy, batch, keep_hidden=False):
            return type("Forward", (), {"logp": logp_new, "hidden": None})()

    options = rd.watch_options(reward_range=(0, 1))
    trainer_row = heldout_estimates(Passes(), None, Heldout(rewards, batch, logp_alpha, logp_k), 1e-4,
                                    dg.RewardRange(0, 1))
    held = rd.HeldoutSet(0, rewards, batch.input_ids, batch.input_ids, mask, logp_alpha, logp_k)
    plugin_row = rd.heldout_metrics(held, logp_new, options, rd.RangeWatch((0, 1)))
    assert plugin_row.keys() == trainer_row.keys()
    for key, value in trainer_row.items():
        assert plugin_row[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key


def test_the_held_out_samplers_log_alpha_is_the_policys_own_at_lag_0(tmp_path):
    """The held-out completions' log alpha, recorded from generate's own scores, equals TRL's forward of the same
    weights on the same tokens (to float rounding): what the certificate's level rests on."""
    t, _ = trainer(tmp_path, dict(reward_range=(0, 1), heldout_prompts=4), steps=1)
    watcher: TRLWatcher = t.offpolicy_watch
    held = {}
    original = watcher.draw_heldout

    def keep():
        original()
        held["set"] = copy.copy(watcher.heldout)

    watcher.draw_heldout = keep
    t.train()
    s = held["set"]
    assert s.rewards.shape == (4, 8) and s.alpha_from_sampler
    diff = ((s.logp_alpha - s.logp_k).abs() * s.mask).max()
    assert diff < 1e-5 and s.mask.sum() > 0


@pytest.mark.slow
def test_trls_bf16_autocast_shows_as_engine_mismatch_at_lag_0(tmp_path):
    """TRL's default ``bf16=True`` runs every forward under bfloat16 autocast: ``generate``'s cached step-by-step decode
    and the loss's full-sequence forward round differently, so at lag 0, where TRL's importance weight is 1 by
    construction, the watcher reads the sampler's own log-probs against the trainer's and shows the mismatch
    (``sampling/logp_diff_*``, ``tv/engine_mismatch`` > 0). In float32 the same reading is float rounding."""
    rows = {}
    for bf16 in (True, False):
        t, logs = trainer(tmp_path / str(bf16), dict(), steps=3, bf16=bf16)
        t.train()
        rows[bf16] = step_rows(logs)
        assert all(r["lag"] == 0 for r in rows[bf16])
    # the shipped weights are bf16-representable (step 0 agrees to 2e-6); once Adam has moved them, they are not
    assert min(r["sampling/logp_diff_max"] for r in rows[True][1:]) > 1e-3
    assert min(r["sampling/logp_diff_mean"] for r in rows[True][1:]) > 30 * max(r["sampling/logp_diff_mean"]
                                                                                 for r in rows[False])
    # the TV is an estimate over 16 completions: on AVX2 kernels one bf16 step read 6e-8, the other 1.2e-3
    assert max(r["tv/engine_mismatch"] for r in rows[True][1:]) > 1e-4
    assert max(r["sampling/logp_diff_max"] for r in rows[False]) < 1e-5
    assert max(r["tv/engine_mismatch"] for r in rows[False]) < 1e-5


# ---- the declared range -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_reward_outside_the_declared_range_voids_its_certificates_and_training_goes_on(tmp_path):
    """A declaration found wrong at step 2: the line says so, every later row carries bound/certificates_void, the
    summary counts no certificate, and TRL trains to the end, its logs as without the watcher."""

    def reward(completions, answer, trainer_state=None, **kwargs):
        scale = 2.0 if trainer_state.global_step >= 2 else 1.0
        return [scale if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    plain, plain_logs = trainer(tmp_path / "a", reward=reward, steps=4)
    plain.train()
    t, logs = trainer(tmp_path / "b", dict(reward_range=(0, 1), heldout_prompts=4), reward=reward, steps=4)
    t.train()
    assert [trl_part(r) for r in logs.rows] == [trl_part(r) for r in plain_logs.rows]
    rows = step_rows(logs)
    assert all("bound/certificates_void" not in r for r in rows[:2])
    assert all(r["bound/certificates_void"] == 1 and r["heldout/improvement_lcb"] is None for r in rows[2:])
    assert any("outside the declared range [0, 1]" in line and "void" in line for line in t.lines)
    summary = t.offpolicy_watch.summary()["certificates"]
    assert summary["void_from_step"] == 2 and summary["steps_certified"] == 0


def test_a_reward_at_an_edge_by_float_rounding_is_the_edge(tmp_path):
    """Three reward functions of 0.1 each under a declared [0, 0.3]: TRL sums them in float32 to 0.3000000119, one
    float32 rounding above the edge; that is the edge (counted), not a wrong declaration."""

    def tenth(completions, answer, **kwargs):
        return [0.1 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    assert float(torch.tensor([0.1, 0.1, 0.1]).sum()) > 0.3
    t, logs = trainer(tmp_path, dict(reward_range=(0, 0.3), heldout_prompts=4), reward=[tenth, tenth, tenth], steps=2)
    t.train()
    summary = t.offpolicy_watch.summary()["certificates"]
    assert summary["void_from_step"] is None and summary["rewards_rounded_to_an_edge"] > 0
    assert all(math.isfinite(r["heldout/improvement_lcb"]) for r in step_rows(logs))


def test_range_rounding_is_read_as_the_edge_and_a_real_excess_is_not():
    from llm.config.ranges import beyond_range, onto_range

    assert not beyond_range([0.1 + 0.2], 0.0, 0.3).any()
    assert not beyond_range([1.0000000000000002, -1e-17], 0.0, 1.0).any()
    assert beyond_range([1.001, float("nan"), 0.5], 0.0, 1.0).tolist() == [True, False, False]
    clipped, moved = onto_range([0.1 + 0.2, 0.1, float("nan")], 0.0, 0.3)
    assert clipped[0] == 0.3 and moved == 1 and math.isnan(clipped[2])


# ---- what it refuses, and what it never costs -----------------------------------------------------------------


@pytest.mark.parametrize("options, setup, error, words", [
    (dict(heldout_prompts=-1), {}, ValueError, "heldout_prompts: must be >= 0"),
    (dict(heldout_prompt=8), {}, TypeError, "did you mean 'heldout_prompts'"),
    (dict(reward_range=(1, 0)), {}, ValueError, "reward_range: must be two finite numbers"),
    (dict(improvement_lcb_level=1.5), {}, ValueError, "improvement_lcb_level"),
    (dict(improvement_lcb_method="z"), {}, ValueError, "method"),
    (dict(heldout_prompts="8"), {}, ValueError, "heldout_prompts: must be an integer"),
    (dict(improvement_lcb_method="foo"), {}, ValueError, "improvement_lcb_method: must be one of betting"),
    (dict(summary_file=__file__ + "/y.json"), {}, ValueError, "summary_file"),  # a file in its path
    (dict(), dict(top_p=0.9, use_transformers_continuous_batching=True), ValueError, "top_k, top_p or min_p with"),
    (dict(), dict(generation_kwargs={"do_sample": False}), ValueError, "greedy"),
])
def test_a_wrong_option_or_setup_is_one_line_before_training(tmp_path, options, setup, error, words):
    t, _ = trainer(tmp_path, steps=1, **setup)
    with pytest.raises(error) as info:
        watch(t, **options)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert getattr(t, "offpolicy_watch", None) is None


def test_watch_refuses_what_is_not_a_trainer_and_a_second_watch(tmp_path):
    with pytest.raises(TypeError, match="expected a built trl.GRPOTrainer or AsyncGRPOTrainer"):
        watch(object())
    t, _ = trainer(tmp_path, dict(), steps=1)
    with pytest.raises(ValueError, match="already watched"):
        watch(t)


@pytest.mark.slow
def test_an_error_inside_the_watcher_is_one_line_and_trl_trains_on_unchanged(tmp_path, monkeypatch):
    import llm.integrations.watcher as plugin

    def broken(parts):
        raise RuntimeError("a bug of ours")

    plain, plain_logs = trainer(tmp_path / "a", steps=3)
    plain.train()
    monkeypatch.setattr(plugin, "step_metrics", broken)
    t, logs = trainer(tmp_path / "b", dict(heldout_prompts=4), steps=3)
    t.train()
    assert [trl_part(r) for r in logs.rows] == [trl_part(r) for r in plain_logs.rows]
    said = [line for line in t.lines if "stopped observing" in line]
    assert len(said) == 1 and "a bug of ours" in said[0]


# ---- tools: only the policy's tokens count -------------------------------------------------------------------


def test_with_tools_only_the_policys_tokens_enter_the_readings(tmp_path):
    """An environment's episodes (TRL's tool_mask): the readings' weights are over completion_mask x tool_mask, as
    TRL's loss; recomputed from TRL's tensors, they match."""
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in ["3*4=", "6*7=", "12*3=", "5*9="]]

    def env_reward(environments, **kwargs):
        return [e.get_reward() for e in environments]

    t, logs = trainer(tmp_path, dict(), cls=Captured, steps=2, model_dir=agent_model_dir(), rows=rows,
                      reward=env_reward, per_device_train_batch_size=8, num_generations=2, max_completion_length=48,
                      num_iterations=2, max_tool_calling_iterations=2, learning_rate=1e-3,
                      trainer_kwargs=dict(environment_factory=Multiplier))
    t.train()
    rows_logged = step_rows(logs)
    assert [r["lag"] for r in rows_logged] == [0, 1]
    step, inputs, logp = t.seen[1]
    assert "tool_mask" in inputs and (inputs["tool_mask"] * inputs["completion_mask"]).sum() < \
        inputs["completion_mask"].sum()  # the episodes had environment tokens
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).float()
    log_w = ((logp - inputs["old_per_token_logps"]) * mask).sum(1).double().numpy()
    labels = [bytes(p[m.bool()].numpy().tobytes()) for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
    expected = dg.clustered_metrics(log_w, np.array([sorted(set(labels)).index(x) for x in labels]))
    assert rows_logged[1]["tv/pi_k_alpha"] == pytest.approx(expected["tv/pi_k_alpha"], rel=1e-9, abs=1e-12)


# ---- an engine that never received the weights ----------------------------------------------------------------


@pytest.mark.slow
def test_the_sync_check_flags_a_bf16_engine_whose_weights_never_change_beside_an_fp32_trainer(tmp_path):
    """martingale's first real run: a float32 trainer beside a bfloat16 engine whose policy never moved, because the
    trainer's small updates were lost to bf16's spacing. Here the engine receives each sync as the change since the
    last one added in bf16 (``DeltaEngine``): every change below half a weight's spacing rounds away, so its weights
    stay the initial ones while the trainer moves. TRL logs its sampling_logp_difference and trains on; the watcher's
    sync check (bf16's rule: twice the run's first floor) warns, and the engine's mismatch TV grows. The same run with
    a sync that writes the rounded weights (TRL's colocate sync) stays at the floor: no warning."""
    common = dict(steps=12, learning_rate=1e-4, num_generations=8, per_device_train_batch_size=64)
    faulty, logs = trainer(tmp_path / "delta", dict(), cls=DeltaEngine, **common)
    faulty.train()
    rows = step_rows(logs)
    assert all(r["lag"] == 0 and "sampling/logp_diff_mean" in r for r in rows)
    assert "sampling/sampling_logp_difference/mean" in rows[0]  # TRL's own number, without an alarm
    assert rows[-1]["sampling/logp_diff_mean"] > 4 * rows[0]["sampling/logp_diff_mean"]
    assert rows[-1]["tv/engine_mismatch"] > 4 * rows[0]["tv/engine_mismatch"]
    warned = [line for line in faulty.lines if "may hold stale weights" in line]
    assert len(warned) >= 3
    fine, fine_logs = trainer(tmp_path / "rounded", dict(), cls=EngineTrainer, **common)
    fine.train()
    assert not any("may hold stale weights" in line for line in fine.lines)
    assert max(r["sampling/logp_diff_mean"] for r in step_rows(fine_logs)) < 2 * rows[0]["sampling/logp_diff_mean"]
    assert faulty.offpolicy_watch.warnings.check.metric == "sampling/logp_diff_mean"  # the engine's bf16: bf16's rule


@pytest.mark.slow
def test_a_lora_run_is_watched_and_trains_as_without(tmp_path):
    """TRL with a LoRA adapter (peft_config): the sampler's log-probs are recorded through the PEFT model's generate,
    TRL's logs are the same with and without the watcher, and the stale steps read a TV above the lag-0 floor."""
    from peft import LoraConfig

    def lora():
        return dict(peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))

    plain, plain_logs = trainer(tmp_path / "a", steps=4, num_iterations=2, learning_rate=1e-2, trainer_kwargs=lora())
    plain.train()
    t, logs = trainer(tmp_path / "b", dict(reward_range=(0, 1), heldout_prompts=4), steps=4, num_iterations=2,
                      learning_rate=1e-2, trainer_kwargs=lora())
    t.train()
    assert [trl_part(r) for r in logs.rows] == [trl_part(r) for r in plain_logs.rows]
    rows = step_rows(logs)
    assert [r["lag"] for r in rows] == [0, 1, 0, 1]
    assert all(r["sampling/logp_diff_max"] < 1e-4 for r in rows if r["lag"] == 0)
    assert max(r["tv/pi_k_alpha"] for r in rows if r["lag"] == 1) > 1e-3
    assert all(math.isfinite(r["heldout/improvement_lcb"]) for r in rows)


# ---- AsyncGRPOTrainer: every sample with its own lag -----------------------------------------------------------

#: AsyncGRPO's wall-clock keys (and the queue's fill level, a function of timing in a real run).
ASYNC_CLOCK = ("perf/", "sample/rollout_queue_size", "train_runtime", "train_samples_per_second",
               "train_steps_per_second")


def async_run(tmp_path, watched=None, **kwargs):
    from tests.llm.trl_harness import async_trainer

    logs = Logs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t, _ = async_trainer(tmp_path, callbacks=[logs], **kwargs)
    if watched is not None:
        t.lines = []
        watch(t, log=t.lines.append, **watched)
    t.train()
    return t, logs


@pytest.mark.slow
def test_async_grpo_logs_each_steps_lag_tv_and_ess_and_its_own_logs_stay_the_same(tmp_path):
    """TRL's AsyncGRPOTrainer (its own loop, packing, loss and staleness accounting; a CPU rollout worker, weight
    transfer and tree attention stand in for vLLM, NCCL and flash-attention 3: tests/llm/trl_harness.py): every
    number it logs is the same with and without the watcher, and every step logs the lag of the samples it trained
    on. From step 1 on they were drawn one update before: accelerate's dataloader fetches the next micro-batch
    while this one trains, so TRL's own ``sample/staleness_mean``, counted at the fetch, reads 0. TRL's own ``ratio``
    shows the lag too: exactly 1 at step 0, not at the stale steps."""
    plain, plain_logs = async_run(tmp_path / "a", steps=6)
    t, logs = async_run(tmp_path / "b", dict(), steps=6)
    drop = lambda row: {k: v for k, v in row.items() if not k.startswith(ASYNC_CLOCK + OURS)}  # noqa: E731
    assert [drop(r) for r in logs.rows] == [drop(r) for r in plain_logs.rows]
    rows = step_rows(logs)
    assert [r["lag"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert all(r["sample/staleness_mean"] == 0 for r in rows)  # TRL's count, at the fetch
    assert abs(rows[0]["ratio"] - 1) < 1e-6 and rows[0]["sampling/logp_diff_max"] < 1e-5
    assert rows[0]["tv/pi_k_alpha"] < 1e-5
    stale = rows[1:]
    assert all("sampling/logp_diff_max" not in r for r in stale)  # no sync check off lag 0
    assert max(abs(r["ratio"] - 1) for r in stale) > 1e-3 and max(r["tv/pi_k_alpha"] for r in stale) > 0.01
    assert all(0 < r["ess/pi_k_alpha"] <= 1 for r in rows)
    assert t.offpolicy_watch.summary()["per_lag"][1]["steps"] == 5


def test_async_grpo_with_held_out_prompts_is_refused_in_one_line(tmp_path):
    from tests.llm.trl_harness import async_trainer

    t, _ = async_trainer(tmp_path, steps=1)
    with pytest.raises(ValueError, match="heldout_prompts with AsyncGRPOTrainer is not supported"):
        watch(t, heldout_prompts=4)


def test_async_grpo_readings_are_our_estimators_on_each_samples_own_forward(tmp_path):
    """The per-sample log pi_k/alpha the watcher reads off AsyncGRPO's packed, tree-attended micro-batch equals a
    plain forward of the trainer's weights over each sample alone, against the sampler's log-probs; the step's TV
    and ESS are ``clustered_metrics`` of those, the samples labelled by their group."""
    from tests.llm.trl_harness import async_trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t, _ = async_trainer(tmp_path, steps=3)
    logs = Logs()
    t.add_callback(logs)
    watch(t, log=lambda line: None)
    watcher = t.offpolicy_watch
    seen, expected = [], []
    note = watcher.note_batch

    def keep(examples):
        note(examples)
        seen.append(list(examples[0][0].samples))

    watcher.note_batch = keep
    record = watcher.record

    def check(inputs, log_probs):
        samples = seen.pop(0)
        model = t.accelerator.unwrap_model(t.model)
        log_w = []
        model.set_attn_implementation("sdpa")  # plain causal attention, not the packed tree's
        for s in samples:  # the sample alone, the trainer's weights at this step
            ids = torch.as_tensor(s["input_ids"])[None]
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            mask = torch.as_tensor(s["completion_mask"])[1:].bool()
            old = torch.as_tensor(s["old_log_probs"])[1:]
            log_w.append(float((logp - old)[mask].sum()))
        model.set_attn_implementation("tree_fa3")
        groups = np.array([s["group_id"] for s in samples])
        expected.append(dg.clustered_metrics(np.array(log_w), groups))
        record(inputs, log_probs)

    watcher.record = check
    t.train()
    assert watcher.stopped is None
    rows = step_rows(logs)
    assert len(rows) == len(expected) == 3
    for row, ours in zip(rows, expected):
        for key in ("tv/pi_k_alpha", "tv/pi_k_alpha_se", "ess/pi_k_alpha"):
            assert row[key] == pytest.approx(ours[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_with_top_p_and_top_k_pi_k_and_alpha_are_both_on_the_samplers_kept_set(tmp_path):
    """TRL's trainer-side log-probs are the unfiltered softmax's while its sampler draws from the top-k/top-p kept
    set, so at lag 0 TRL's own pi/alpha is not 1. The watcher reads both on the kept set (pi_k by this project's
    filtered output layer, alpha recorded from the scores generate sampled from): at lag 0 they agree to float
    rounding, the stale steps read a TV, and TRL's logs are the same with and without it."""
    setup = dict(steps=4, num_iterations=2, learning_rate=1e-3, top_p=0.8, top_k=10)
    plain, plain_logs = trainer(tmp_path / "a", **setup)
    plain.train()
    t, logs = trainer(tmp_path / "b", dict(reward_range=(0, 1), heldout_prompts=4), cls=Captured, **setup)
    t.train()
    assert [trl_part(r) for r in logs.rows] == [trl_part(r) for r in plain_logs.rows]
    rows = step_rows(logs)
    assert [r["lag"] for r in rows] == [0, 1, 0, 1]
    assert all(r["sampling/logp_diff_max"] < 1e-4 for r in rows if r["lag"] == 0)
    assert max(r["tv/pi_k_alpha"] for r in rows if r["lag"] == 1) > 0.01
    assert all("tv/staleness" not in r for r in rows if r["lag"] == 1)  # TRL's old log-probs are unfiltered
    step, inputs, logp = t.seen[0]  # lag 0: TRL's unfiltered log-probs against the kept-set sampler's
    unfiltered_gap = ((logp - inputs["recorded"]).abs() * inputs["completion_mask"]).max()
    assert unfiltered_gap > 1e-3


def test_the_start_line_says_what_held_out_prompts_can_certify_and_that_they_call_your_rewards(tmp_path):
    t, _ = trainer(tmp_path, dict(reward_range=np.array([0.0, 1.0]), heldout_prompts=6), steps=1)
    assert t.offpolicy_watch.options.reward_range == (0.0, 1.0)  # a numpy pair, as a config often holds it
    line = next(line for line in t.lines if "certify" in line)
    assert "can certify no change from 6 held-out prompts" in line and "keeps state" in line
    t, _ = trainer(tmp_path / "b", dict(heldout_prompts=16), steps=1)
    assert "smallest change the certificate can certify from 16 held-out prompts is 0.412" in "".join(t.lines)


def test_a_policy_far_from_its_sampler_is_warned_even_where_the_ess_looks_fine():
    """Every weight near 0 gives a Kish ESS near 1 (it is blind to scale) and a TV near 1: the TV is what warns."""
    from llm.step.monitors import Warnings

    said = []
    w = Warnings("float32")
    for step, tv in enumerate([0.1, 0.97, 0.98, 0.2, 0.6]):
        w.see({"step": step, "tv/pi_k_alpha": tv, "ess/pi_k_alpha": 0.2, "is_weight_seq/mean": 0.01}, False,
              said.append)
    warned = [line for line in said if "TV(pi_k, alpha)" in line]
    assert [line.split(":")[0] for line in warned] == ["WARNING step 1", "WARNING step 4"]  # once, again after recovery
    assert "no bound holds" in warned[0] and "0.01 of its mass" in warned[0]

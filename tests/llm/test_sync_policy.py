"""The divergence sync policy, the staleness cap and a TRL correction in the trainer (llm.step.clock, llm.run.trainer): each
step's completions come from the weights the logged lag names, a sync happens exactly when the previous step's
held-out TV estimate exceeds the budget or the lag its cap, a resumed run continues the clock, and the policy learns."""

import math
import os
import signal

import pytest

from llm import GRPOConfig, train
from llm.tensors.metrics import deterministic
from llm.run.rundir import read_metrics
from llm.step.rollout import step_seed
from tests.helpers import LEARNING_MARGIN
from fixtures.seams import PolicyFingerprints, tag_generations


def _config(tmp_path, name, **kw):
    base = dict(output_dir=str(tmp_path / name), sampler="transformers", progress=False, logging_steps=1000, seed=0,
                eval_steps=0, prompts_per_step=8, heldout_prompts=8)
    return GRPOConfig(**base | kw)


def _stopped_after_step_4_and_resumed(tmp_path, **kw) -> list[dict]:
    """The rows of a run (``_config(**kw)``) stopped by Ctrl-C after step 4 and resumed by the same call."""

    def ctrl_c_after_step_4(step, row):
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    cfg = _config(tmp_path, "resumed", **kw)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, log=lambda *a: None, callbacks=[ctrl_c_after_step_4])
    return read_metrics(train(cfg, log=lambda *a: None))


@pytest.mark.slow
def test_divergence_syncs_when_the_previous_estimate_exceeds_the_budget_and_serves_those_weights(tmp_path,
                                                                                                  monkeypatch):
    generated = tag_generations(monkeypatch)
    policies = PolicyFingerprints()
    budget, cap = 0.03, 3
    rows = read_metrics(train(_config(tmp_path, "div", max_steps=14, sync_policy="divergence", tv_budget=budget,
                                      max_lag=cap), log=lambda *a: None, callbacks=[policies]))
    reasons = [r["sync/reason"] for r in rows]
    assert "budget" in reasons and any(r["lag"] > 0 for r in rows)  # both branches ran: the checks below bite
    assert reasons[0] == "" and rows[0]["lag"] == 0
    for prev, r in zip(rows, rows[1:]):
        estimate = prev["heldout/tv/pi_new_alpha"]  # TV(pi_k, alpha) of this step, measured on the previous one
        assert r["sync/tv_estimate"] == estimate and r["sync/tv_estimate_se"] == prev["heldout/tv/pi_new_alpha_se"]
        if r["sync/reason"] == "max_lag":
            assert prev["lag"] == cap
        elif r["sync/reason"] == "budget":
            assert estimate > budget and prev["lag"] < cap
        else:
            assert estimate <= budget and r["lag"] == prev["lag"] + 1
        assert (r["lag"] == 0) == bool(r["sync/reason"])
    for r in rows:  # the samples of step k came from pi_{k - lag}; right after a sync the sampler holds pi_k
        k = r["step"]
        assert generated[step_seed(0, k)] == policies.before[k - r["lag"]], k
        assert r["lag"] <= cap
        if r["lag"] == 0:
            assert r["tv/pi_k_alpha"] < 1e-4


@pytest.mark.slow
def test_divergence_with_a_budget_that_never_binds_is_fixed_v(tmp_path):
    """A TV never exceeds 1: with budget 1 and max_lag v - 1 the policy syncs every v steps, and the run logs what
    the fixed policy at v logs (both generating step by step)."""
    fixed = read_metrics(train(_config(tmp_path, "fixed", max_steps=7, sync_period=3, window_generation=False),
                               log=lambda *a: None))
    div = read_metrics(train(_config(tmp_path, "div", max_steps=7, sync_policy="divergence", tv_budget=1.0,
                                     max_lag=2), log=lambda *a: None))
    assert [r["sync/reason"] for r in fixed] == ["", "", "", "period", "", "", "period"]
    assert [r["sync/reason"] for r in div] == ["", "", "", "max_lag", "", "", "max_lag"]
    strip = lambda r: {k: v for k, v in deterministic(r).items() if not k.startswith("sync/")}  # noqa: E731
    for a, b in zip(fixed, div):
        assert strip(a) == pytest.approx(strip(b), abs=1e-6, nan_ok=True)  # nan: the certificate abstains


@pytest.mark.slow
def test_a_resumed_divergence_run_continues_its_clock(tmp_path):
    kw = dict(max_steps=8, sync_policy="divergence", tv_budget=0.03, max_lag=3, save_steps=0)
    full = read_metrics(train(_config(tmp_path, "full", **kw), log=lambda *a: None))

    resumed = _stopped_after_step_4_and_resumed(tmp_path, **kw)
    assert [r["lag"] for r in resumed] == [r["lag"] for r in full]
    assert [r["sync/reason"] for r in resumed] == [r["sync/reason"] for r in full]
    for a, b in zip(full, resumed):
        assert a["reward"] == b["reward"] and a["loss"] == pytest.approx(b["loss"], abs=1e-5)


@pytest.mark.slow
def test_asynchronous_divergence_syncs_one_step_ahead_on_the_projected_tv(tmp_path, monkeypatch):
    """--async-generation with the divergence policy: step k + 1's completions are generated while step k trains,
    from the weights the sampler holds after step k's decision. The decision reads the projected TV of step k + 1:
    TV(pi_k, W) (the last step's held-out TV(pi_new, alpha), or its drift when W was synced there) plus the last
    step's drift ``heldout/tv/pi_new_pi_k``; a sync makes the next step's lag 1, keeping adds one. Each step's samples
    came from pi_{k - lag}, the sampler agrees with the trainer's copy of them at every lag-1 step, and a run stopped
    after step 4 and resumed logs the uninterrupted run's lags, syncs and rewards."""
    generated = tag_generations(monkeypatch)
    policies = PolicyFingerprints()
    budget, cap = 0.06, 4
    kw = dict(max_steps=10, sync_policy="divergence", async_generation=True, tv_budget=budget, max_lag=cap)
    rows = read_metrics(train(_config(tmp_path, "full", **kw), log=lambda *a: None, callbacks=[policies]))
    reasons = [r["sync/reason"] for r in rows]
    assert "budget" in reasons and "" in reasons[1:]  # both branches ran: the checks below bite
    assert rows[0]["lag"] == 0 and reasons[0] == ""
    for prev, r in zip(rows, rows[1:]):
        drift = prev["heldout/tv/pi_new_pi_k"]
        served = drift if r["lag"] == 1 else prev["heldout/tv/pi_new_alpha"]
        assert r["sync/tv_estimate"] == pytest.approx(served + drift, abs=1e-12)
        assert r["lag"] == (1 if prev["sync/reason"] else prev["lag"] + 1) <= cap
        if r["sync/reason"] == "budget":
            assert r["sync/tv_estimate"] > budget
        elif r["sync/reason"] == "":
            assert r["sync/tv_estimate"] <= budget and r["lag"] + 1 <= cap
    for r in rows:
        k = r["step"]
        assert generated[step_seed(0, k)] == policies.before[k - r["lag"]], k
        if r["lag"] == 1:
            assert r["sampling/logp_diff_max"] <= 1e-4, k

    resumed = _stopped_after_step_4_and_resumed(tmp_path, **kw)
    assert [(r["lag"], r["sync/reason"]) for r in resumed] == [(r["lag"], r["sync/reason"]) for r in rows]
    for a, b in zip(rows, resumed):
        assert a["reward"] == b["reward"] and a["loss"] == pytest.approx(b["loss"], abs=1e-5)


def test_max_staleness_drops_the_steps_older_than_it(tmp_path):
    """v = 4, max_staleness 1: the steps at lag 2 and 3 make no update (exact J unchanged), the others do. A dropped
    step has no loss tokens: its clip shares read nan (not 0: nothing was measured), while the importance weights
    and the mismatch KL, over every completion token, still show how far the sampler lags (not 1 and 0)."""
    rows = read_metrics(train(_config(tmp_path, "stale", max_steps=8, sync_period=4, max_staleness=1,
                                      heldout_prompts=0), log=lambda *a: None))
    assert [r["dropped_stale"] for r in rows] == [0.0, 0.0, 1.0, 1.0] * 2
    for r in rows:
        if r["dropped_stale"]:
            assert r["j/pi_new"] == r["j/pi_k"]
            assert math.isnan(r["clip_ratio/region_mean"]) and math.isnan(r["is_correction/frac_above_cap"])
            assert r["sampling/mismatch_kl"] > 1e-6 and r["is_weight/max"] - r["is_weight/min"] > 1e-3
        else:
            assert r["j/pi_new"] != r["j/pi_k"]


@pytest.mark.slow
def test_trls_default_correction_learns_off_policy(tmp_path):
    """sequence_mask (TRL's default mode) at v = 4, 16 prompts a step: exact J rises by the margin (measured, seed 0:
    +0.051 after 60 steps; with 8 prompts a step +0.045 after 80, the paper's clip +0.054)."""
    rows = read_metrics(train(_config(tmp_path, "seqmask", max_steps=80, exact_j_steps=80, sync_period=4,
                                      prompts_per_step=16, importance_sampling_mode="sequence_mask", heldout_prompts=0),
                              log=lambda *a: None))
    assert rows[-1]["j/pi_new"] - rows[0]["j/pi_k"] >= LEARNING_MARGIN
    assert all(math.isnan(r["is_correction/frac_above_cap"]) or 0 <= r["is_correction/frac_above_cap"] <= 1
               for r in rows)  # nan: a step whose groups were all masked


@pytest.mark.slow
def test_trust_region_masking_learns_off_policy(tmp_path):
    """seq_max_k2 (Trust Region Masking's gate) at v = 4, 16 prompts a step, a tight threshold so that the gate acts:
    exact J rises by the margin, completions are dropped whole on lagged steps (``is_correction/frac_above_cap`` > 0)
    and none at lag 0 (alpha = pi_k, every k2 is 0)."""
    rows = read_metrics(train(_config(tmp_path, "trm", max_steps=80, exact_j_steps=80, sync_period=4,
                                      prompts_per_step=16, importance_sampling_mode="seq_max_k2",
                                      rollout_rs_threshold=0.005, heldout_prompts=0), log=lambda *a: None))
    assert rows[-1]["j/pi_new"] - rows[0]["j/pi_k"] >= LEARNING_MARGIN
    dropped = [r["is_correction/frac_above_cap"] for r in rows if not math.isnan(r["is_correction/frac_above_cap"])]
    assert max(dropped) > 0
    assert all(r["is_correction/frac_above_cap"] == 0 for r in rows if r["lag"] == 0
               and not math.isnan(r["is_correction/frac_above_cap"]))

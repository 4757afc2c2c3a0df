"""``llm.integrations.verl`` (docs/integrations.md): the readings of a verl micro-batch on crafted tensors and the
one-line refusals (everywhere), and inside verl 0.9.1's own actor update (``TrainingWorker.train_mini_batch``, its
FSDP2 engine, ``ppo_loss``; tests/llm/verl_harness.py) where verl is installed: ``make check-verl`` runs them in
.venv-bench. verl's loss, metrics and weights are the same with and without the watcher, update for update; each
optimiser step logs its lag, TV and ESS; the readings are this project's estimators on verl's own tensors; an engine
that never receives the weights is flagged; an error of ours costs one line."""

import json
import math
import os

import numpy as np
import pytest
import torch

from llm.tensors import diagnostics as dg
from llm.integrations import verl as vw
from llm.integrations.readings import step_metrics

# ---- without verl ------------------------------------------------------------------------------------------------


def _crafted(B=6, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor([5, 3, 1, 4, 5, 2])[:, None]).float()
    mask[2] = 0  # a completion with no response token
    old = -torch.rand(B, T, generator=g) * 3 * mask
    rollout = old + 0.05 * torch.randn(B, T, generator=g) * mask
    logp_k = old + 0.3 * torch.randn(B, T, generator=g) * mask
    return logp_k, old, rollout, mask, ["a", "a", "a", "b", "b", "c"]


def test_a_micro_batch_reads_pi_k_over_the_engines_alpha_and_splits_staleness_from_the_engine():
    logp_k, old, rollout, mask, uids = _crafted()
    mb, dropped = vw.micro_batch(2, logp_k, old, rollout, mask, uids)
    assert dropped == 0
    keep = [0, 1, 3, 4, 5]
    np.testing.assert_allclose(mb.log_w_k, ((logp_k - rollout) * mask).sum(1).double().numpy()[keep], rtol=1e-6)
    np.testing.assert_allclose(mb.log_w_gen, ((old - rollout) * mask).sum(1).double().numpy()[keep], rtol=1e-6)
    assert list(mb.lag) == [2] * 5 and mb.gap is None  # the sync check is lag 0's
    assert mb.prompts[0] == mb.prompts[1] != mb.prompts[2] == mb.prompts[3] != mb.prompts[4]
    row, by_lag = step_metrics([mb])
    expected = dg.clustered_metrics(mb.log_w_k, mb.prompts, mb.log_w_gen)
    for key in ("tv/pi_k_alpha", "tv/pi_k_alpha_se", "ess/pi_k_alpha", "tv/staleness", "tv/engine_mismatch"):
        assert row[key] == pytest.approx(expected[key], rel=1e-12)
    assert set(by_lag) == {2}


def test_without_the_engines_log_probs_alpha_is_old_log_probs_and_there_is_no_split():
    logp_k, old, _, mask, uids = _crafted()
    mb, _ = vw.micro_batch(1, logp_k, old, None, mask, uids)
    np.testing.assert_allclose(mb.log_w_k, ((logp_k - old) * mask).sum(1).double().numpy()[[0, 1, 3, 4, 5]], rtol=1e-6)
    assert mb.log_w_gen is None and mb.gap is None
    at_zero, _ = vw.micro_batch(0, logp_k, old, _crafted()[2], mask, None, first_label=6)
    assert at_zero.gap is not None and list(at_zero.prompts) == [6, 7, 9, 10, 11]  # no uid: each its own prompt
    with pytest.raises(RuntimeError, match="lag 3 without"):
        vw.micro_batch(3, logp_k, None, None, mask, uids)


def test_a_completion_with_a_log_prob_that_is_not_finite_leaves_every_reading_alike():
    logp_k, old, rollout, mask, uids = _crafted()
    clean, _ = vw.micro_batch(2, logp_k, old, rollout, mask, uids)
    rollout[3, 1], old[5, 0] = float("nan"), float("-inf")
    rollout[1, 4] = float("nan")  # off the response: not read
    mb, dropped = vw.micro_batch(2, logp_k, old, rollout, mask, uids)
    assert dropped == 2 and len(mb.log_w_k) == len(mb.log_w_gen) == len(mb.prompts) == 3
    np.testing.assert_array_equal(mb.log_w_k, clean.log_w_k[[0, 1, 3]])
    np.testing.assert_array_equal(mb.log_w_gen, clean.log_w_gen[[0, 1, 3]])
    row, _ = step_metrics([mb])
    assert all(math.isfinite(row[k]) for k in ("tv/pi_k_alpha", "tv/staleness", "tv/engine_mismatch"))


@pytest.mark.parametrize("options, words", [
    (dict(heldout_prompts=4), "heldout_prompts: verl's rollout runs in its own workers"),
    (dict(reward_range=(0, 1)), "reward_range: the declared range serves the held-out certificate"),
    (dict(engine_dtype="fp8"), "watch (verl): engine_dtype"),
    (dict(summary_fille="x.json"), "watch (verl): unexpected option 'summary_fille'"),
    (dict(variance_eps=0.01), "variance_eps: options of the held-out certificate"),
    (dict(seed=3, improvement_lcb_level=0.9), "improvement_lcb_level, seed: options of the held-out certificate"),
])
def test_options_verl_cannot_serve_are_one_line(options, words):
    with pytest.raises((ValueError, TypeError)) as info:
        vw.verl_options(**options)
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text, words", [("{bad", "not a JSON object"), ("[1]", "must be a JSON object")])
def test_the_hooks_options_from_the_environment_are_refused_in_one_line(monkeypatch, text, words):
    monkeypatch.setenv(vw.OPTIONS_ENV, text)
    with pytest.raises(ValueError, match=words):
        vw.options_from_env()
    monkeypatch.setenv(vw.OPTIONS_ENV, '{"engine_dtype": "float32", "summary_file": null}')
    assert vw.verl_options(**vw.options_from_env()).engine_dtype == "float32"


# ---- inside verl's own actor update ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verl_process():
    """verl's worker set up on this CPU for this module's tests, and the process as it was afterwards: the
    environment (verl's ranks) and no process group, so later tests in the same pytest worker see neither."""
    pytest.importorskip("verl")
    pytest.importorskip("ray")
    from tests.llm import verl_harness

    saved = dict(os.environ)
    yield verl_harness
    verl_harness.close()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def H(verl_process):
    return verl_process


OURS = ("lag", "tv/", "ess/", "is_weight_seq/", "sampling/logp_diff")


def _run(H, watched, steps=3, mini_batch=8, epochs=2, engine=None, remove_rollout=False, lr=1e-3, edit=None,
         drop_uid=False, **options):
    """``steps`` of verl's update on the tiny model (4 prompts x 4 completions, up to 6 tokens), synced engine."""
    from llm.models.tiny import tiny_model_dir

    model = str(tiny_model_dir())
    worker = H.build_worker(model, lr=lr)
    lines = []
    if watched:
        vw.watch(worker, log=lines.append, **options)
    engine = engine or H.Engine(model)
    rng = np.random.default_rng(0)
    metrics = []
    for step in range(steps):
        engine.sync(worker)
        batch, rewards = engine.rollout(rng.choice(len(H.TASK.prompts), 4, replace=False), 4, 6, 1.0, step)
        batch = edit(batch) if edit is not None else batch
        metrics.append(H.update(worker, batch, rewards, mini_batch, epochs, remove_rollout=remove_rollout,
                                drop_uid=drop_uid))
    return worker, metrics, lines


def _verls_own(row):
    return {k: v for k, v in row.items() if not k.startswith(OURS) and k not in ("mfu", "perf/cpu_memory_used_gb")}


@pytest.mark.slow
def test_verls_loss_metrics_and_weights_are_the_same_with_and_without_the_watcher(H, tmp_path):
    plain, plain_metrics, _ = _run(H, False)
    watched, watched_metrics, lines = _run(H, True, summary_file=str(tmp_path / "s.json"))
    assert len(plain_metrics) == len(watched_metrics) == 3
    for a, b in zip(plain_metrics, watched_metrics):
        assert _verls_own(a) == _verls_own(b)  # pg_loss, clip fractions, ppo_kl, grad_norm, lr: exactly
        assert set(b) - set(a) >= {"lag", "tv/pi_k_alpha", "tv/pi_k_alpha_se", "ess/pi_k_alpha", "tv/staleness",
                                   "tv/engine_mismatch", "sampling/logp_diff_max", "tv/pi_k_alpha_lag3"}
    state_a, state_b = H.worker_state(plain), H.worker_state(watched)
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not any("WARNING" in line or "stopped" in line for line in lines), lines


@pytest.mark.slow
def test_each_optimiser_step_of_an_update_logs_its_lag_and_the_table_pools_them(H, tmp_path):
    worker, metrics, lines = _run(H, True, summary_file=str(tmp_path / "s.json"))
    for row in metrics:  # 2 mini-batches x 2 epochs: 4 optimiser steps, lags 0..3, every update
        assert row["lag"] == [0.0, 1.0, 2.0, 3.0]
        assert row["tv/staleness"][0] == 0.0  # lag 0: pi_k is the actor at the update's start, exactly
        assert row["tv/pi_k_alpha"][3] > row["tv/pi_k_alpha"][0]
        assert len(row["sampling/logp_diff_max"]) == 1  # the sync check: lag 0 only
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["updates"] == 3 and summary["steps"] == 12 and summary["stopped"] is None
    assert [r["lag"] for r in summary["per_lag"]] == [0, 1, 2, 3]
    assert all(r["steps"] == 3 and r["completions"] == 24 for r in summary["per_lag"])
    assert summary["per_lag"][3]["tv/pi_k_alpha"] > summary["per_lag"][1]["tv/pi_k_alpha"]
    assert "(verl) logging lag" in lines[0]


def test_the_readings_are_this_projects_estimators_on_verls_own_tensors(H, tmp_path):
    from verl.workers.utils.padding import no_padding_2_padding

    from llm.models.tiny import tiny_model_dir

    seen = []
    worker = H.build_worker(str(tiny_model_dir()))
    inner = worker.loss_fn

    def keeping(model_output, data, dp_group=None):  # what verl's loss saw, taken apart here by hand
        if torch.is_grad_enabled():
            pad = data.select("response_mask", "old_log_probs", "rollout_log_probs").to_padded_tensor()
            seen.append((no_padding_2_padding(model_output["log_probs"].detach(), data).float(),
                         pad["old_log_probs"].float(), pad["rollout_log_probs"].float(), pad["response_mask"].float(),
                         list(data["uid"])))
        return inner(model_output=model_output, data=data, dp_group=dp_group)

    worker.set_loss_fn(keeping)
    vw.watch(worker, log=lambda line: None, summary_file=None)
    engine = H.Engine(str(tiny_model_dir()))
    engine.sync(worker)
    batch, rewards = engine.rollout(np.arange(4), 4, 6, 1.0, 0)
    row = H.update(worker, batch, rewards, mini_batch=8, epochs=2)
    assert len(seen) == 8  # 4 optimiser steps x 2 micro-batches of 4
    for step in range(4):
        parts = seen[2 * step: 2 * step + 2]
        w_k = np.concatenate([((lp - ro) * m).sum(1).double().numpy() for lp, _, ro, m, _ in parts])
        w_gen = np.concatenate([((od - ro) * m).sum(1).double().numpy() for _, od, ro, m, _ in parts])
        names = sum((u for *_, u in parts), [])
        labels = np.unique(names, return_inverse=True)[1]
        expected = dg.clustered_metrics(w_k, labels, w_gen)
        for key in ("tv/pi_k_alpha", "tv/pi_k_alpha_se", "ess/pi_k_alpha", "tv/staleness", "tv/engine_mismatch"):
            assert row[key][step] == pytest.approx(expected[key], rel=1e-5, abs=1e-9), (step, key)


@pytest.mark.slow
def test_an_engine_that_never_receives_the_weights_is_flagged_at_lag_0(H):
    from llm.models.tiny import tiny_model_dir

    stale = H.Engine(str(tiny_model_dir()), stale=True)
    _, metrics, lines = _run(H, True, steps=4, engine=stale, lr=3e-3, summary_file=None)
    assert metrics[-1]["tv/engine_mismatch"][0] > 10 * metrics[0]["tv/engine_mismatch"][0]
    assert any("WARNING" in line and "sampler may hold stale weights" in line for line in lines), lines


def test_without_rollout_log_probs_one_line_says_what_alpha_is_read_as(H):
    _, metrics, lines = _run(H, True, steps=2, remove_rollout=True, summary_file=None)
    assert sum("no rollout_log_probs" in line for line in lines) == 1
    assert metrics[0]["lag"] == [0.0, 1.0, 2.0, 3.0] and metrics[0]["tv/pi_k_alpha"][0] == 0.0
    assert "tv/engine_mismatch" not in metrics[0] and "sampling/logp_diff_max" not in metrics[0]


@pytest.mark.slow
def test_an_error_inside_the_watcher_is_one_line_and_verl_trains_on_unchanged(H, monkeypatch):
    plain, plain_metrics, _ = _run(H, False, steps=2)

    def broken(*args, **kwargs):
        raise ValueError("garbage from a user's batch")

    monkeypatch.setattr(vw, "micro_batch", broken)
    watched, metrics, lines = _run(H, True, steps=2, summary_file=None)
    assert [_verls_own(r) for r in metrics] == [_verls_own(r) for r in plain_metrics]
    assert sum("stopped observing" in line for line in lines) == 1 and "garbage" in lines[-1]
    assert "\n" not in lines[-1] and watched.offpolicy_watch.stopped


def test_install_watches_the_actor_verl_builds_and_refuses_a_second_watch(H, monkeypatch, tmp_path):
    from verl.workers.engine_workers import TrainingWorker

    from llm.models.tiny import tiny_model_dir

    monkeypatch.setattr(TrainingWorker, "set_loss_fn", TrainingWorker.set_loss_fn)  # undone after the test
    monkeypatch.setenv(vw.OPTIONS_ENV, json.dumps({"summary_file": str(tmp_path / "hook.json")}))
    import importlib

    import llm.integrations.verl_watch as hook

    importlib.reload(hook)
    vw.install()  # a second install is a no-op
    worker = H.build_worker(str(tiny_model_dir()))  # verl's actor: set_loss_fn(partial(ppo_loss, ...))
    assert isinstance(worker.offpolicy_watch, vw.VerlWatcher)
    assert str(worker.offpolicy_watch.summary_path) == str(tmp_path / "hook.json")
    with pytest.raises(ValueError, match="already watched"):
        vw.watch(worker)
    with pytest.raises(TypeError, match="expected a verl TrainingWorker"):
        vw.watch(object())
    engine = H.Engine(str(tiny_model_dir()))
    engine.sync(worker)
    batch, rewards = engine.rollout(np.arange(4), 4, 6, 1.0, 0)
    row = H.update(worker, batch, rewards, mini_batch=16, epochs=1)
    assert row["lag"] == [0.0] and math.isfinite(row["tv/pi_k_alpha"][0])
    assert json.loads((tmp_path / "hook.json").read_text())["steps"] == 1


def test_a_wrong_option_in_the_hooks_environment_is_one_line_and_verl_runs_unobserved(H, monkeypatch, capsys):
    from verl.workers.engine_workers import TrainingWorker

    from llm.models.tiny import tiny_model_dir

    monkeypatch.setattr(TrainingWorker, "set_loss_fn", TrainingWorker.set_loss_fn)
    monkeypatch.setenv(vw.OPTIONS_ENV, '{"heldout_prompts": 8}')
    import importlib

    import llm.integrations.verl_watch as hook

    importlib.reload(hook)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "heldout_prompts" in err[0] and err[0].endswith("verl runs unobserved")
    worker = H.build_worker(str(tiny_model_dir()))
    assert getattr(worker, "offpolicy_watch", None) is None


def test_a_summary_file_that_cannot_be_written_is_refused_when_watching(H, tmp_path):
    from llm.models.tiny import tiny_model_dir

    worker = H.build_worker(str(tiny_model_dir()))
    (tmp_path / "afile").write_text("")
    for path, words in ((tmp_path, "is a directory"), (tmp_path / "afile" / "s.json", "not a directory")):
        with pytest.raises(ValueError, match=words):
            vw.watch(worker, summary_file=str(path), log=lambda line: None)
    assert getattr(worker, "offpolicy_watch", None) is None


def test_train_batch_called_by_hand_counts_lag_from_the_last_forward_of_old_log_probs(H, tmp_path):
    """verl's Tinker-like use: old_log_probs by infer_batch, then train_batch per mini-batch, no train_mini_batch."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    from llm.models.tiny import tiny_model_dir

    worker = H.build_worker(str(tiny_model_dir()))
    lines = []
    vw.watch(worker, log=lines.append, summary_file=str(tmp_path / "s.json"))
    engine = H.Engine(str(tiny_model_dir()))
    lags = []
    for update in range(2):
        engine.sync(worker)
        batch, rewards = engine.rollout(np.arange(4), 4, 6, 1.0, update)
        H.update(worker, batch, rewards, mini_batch=16, epochs=1)  # fills old_log_probs and advantages
        batch.batch["old_log_probs"] = H.old_log_probs(worker, batch)  # infer_batch: a new batch's forward
        for half in (slice(0, 8), slice(8, 16)):
            td = left_right_2_no_padding(batch[half].to_tensordict())
            tu.assign_non_tensor(td, calculate_entropy=False, global_batch_size=8, global_token_num=[1] * 8,
                                 compute_loss=True)
            lags.append(tu.get(worker.train_batch(td), "metrics")["lag"])
    assert lags == [0.0, 1.0, 0.0, 1.0]
    assert sum("train_batch called outside train_mini_batch" in line for line in lines) == 1
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 6  # 2 updates of one step, 4 by hand


def test_a_batch_without_uid_or_with_a_nan_log_prob_is_said_in_one_line_each(H):
    def unscored(batch):
        batch.batch["rollout_log_probs"][0, 0] = float("nan")
        return batch

    _, metrics, lines = _run(H, True, steps=2, summary_file=None, edit=unscored, drop_uid=True)
    assert sum("has no uid" in line for line in lines) == 1
    assert sum("not finite" in line for line in lines) == 1
    row = metrics[0]
    assert all(math.isfinite(v) for k in ("tv/pi_k_alpha", "tv/staleness", "tv/engine_mismatch", "ess/pi_k_alpha",
                                          "sampling/logp_diff_mean") for v in row[k])


@pytest.mark.slow
@pytest.mark.parametrize("engine_dtype", ["float16", "float32"])
def test_the_sync_check_takes_bfloat16s_rule_where_the_actor_autocasts_to_it(H, engine_dtype):
    """verl's FSDP actor computes log-probs under bfloat16 autocast by default, so even a float32 engine is read
    with bfloat16's rule: no alarm on a faithful sync; float16 (an engine's dtype the rule table lacks) as bfloat16."""
    worker, metrics, lines = _run(H, True, steps=2, summary_file=None, engine_dtype=engine_dtype)
    assert worker.offpolicy_watch.sync_rule() == "bfloat16" and worker.offpolicy_watch.stopped is None
    assert not any("WARNING" in line for line in lines), lines
    assert len(metrics[1]["sampling/logp_diff_max"]) == 1


def test_install_leaves_a_critic_alone(H, monkeypatch):
    from types import SimpleNamespace

    from verl.workers.engine_workers import TrainingWorker

    monkeypatch.setattr(TrainingWorker, "set_loss_fn", TrainingWorker.set_loss_fn)
    vw.install(log=lambda line: None)
    critic = SimpleNamespace(config=SimpleNamespace(model_type="value_model"), loss_fn=None)
    TrainingWorker.set_loss_fn(critic, print)
    assert critic.loss_fn is print and not hasattr(critic, "offpolicy_watch")

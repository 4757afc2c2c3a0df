"""llm.analysis.warning: the future gain is the exact J the next h updates gain, and the correlations are exact on
runs built so that a signal orders the gains perfectly, reversed, or not at all."""

import json
import math

import numpy as np
import pytest

from llm.analysis.warning import future_gain, main, signal_table


def test_the_future_gain_is_the_exact_j_after_h_updates_minus_the_j_before():
    j_before = np.array([0.1, 0.2, 0.4, 0.5])
    j_after = np.array([0.2, 0.4, 0.5, 0.9])  # step t moves J from j_before[t] to j_after[t] = j_before[t + 1]
    assert future_gain(j_before, j_after, 1) == pytest.approx(j_after - j_before)
    assert future_gain(j_before, j_after, 2) == pytest.approx([0.4 - 0.1, 0.5 - 0.2, 0.9 - 0.4])
    assert future_gain(j_before, j_after, 4) == pytest.approx([0.8])
    assert future_gain(j_before, j_after, 5).size == 0


def _run(gains, **signals):
    """Rows of a run whose step t gains ``gains[t]`` of exact J, with the given per-step signals."""
    j = np.concatenate([[0.2], 0.2 + np.cumsum(gains)])
    return [{"step": t, "j/pi_k": j[t], "j/pi_new": j[t + 1], **{k: v[t] for k, v in signals.items()}}
            for t in range(len(gains))]


def test_a_signal_that_orders_the_next_gains_has_rank_correlation_one_and_a_constant_one_none():
    rng = np.random.default_rng(0)
    runs = {}
    for k in range(4):
        gains = rng.permutation(np.linspace(0.001, 0.02, 12)) * (k + 1)  # run k gains k + 1 times more
        runs[f"run{k}"] = _run(gains, **{"tv/pi_k_alpha": -gains,  # warns perfectly (h = 1)
                                         "ess/pi_k_alpha": gains ** 3,  # vouches perfectly, a monotone transform
                                         "clip_ratio/region_mean": np.zeros(12),  # constant
                                         "lag": np.full(12, float(3 - k))})  # constant within, ordered across
    _, n = signal_table(runs, horizon=1)
    assert n["TV(pi_k, alpha)"]["within"] == pytest.approx(-1.0) and n["TV(pi_k, alpha)"]["within_negative"] == 1.0
    assert n["TV(pi_k, alpha)"]["across"] == pytest.approx(-1.0)  # mean TV falls as the total gain rises
    assert n["ESS of pi_k/alpha"]["within"] == pytest.approx(1.0) and n["ESS of pi_k/alpha"]["within_se"] == 0.0
    assert n["ESS of pi_k/alpha"]["across"] == pytest.approx(1.0)
    assert n["lag"]["within_runs"] == 0 and n["lag"]["across"] == pytest.approx(-1.0)
    assert n["clip share"]["within_runs"] == 0 and math.isnan(n["clip share"]["across"])
    assert n["held-out TV(pi_k, alpha)"]["across_runs"] == 0  # not logged


def test_the_command_reads_a_folder_of_runs_and_refuses_runs_without_exact_j(tmp_path, capsys):
    for k in range(3):
        d = tmp_path / "grid" / f"seed{k}"
        d.mkdir(parents=True)
        rows = _run(np.linspace(0.01, 0.001, 10) * (k + 1), **{"tv/pi_k_alpha": np.linspace(0, 0.3, 10) / (k + 1)})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(tmp_path / "grid"), "--horizon", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 runs, horizon 2 steps" in out
    tv = next(ln for ln in out.splitlines() if ln.startswith("| TV(pi_k, alpha) |"))
    assert tv.split("|")[2:4] == [" 3 ", " -1.000 ± 0.000 "]  # the gains shrink as TV grows, in every run
    bad = tmp_path / "real"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward": 0.5}) + "\n")
    with pytest.raises(ValueError, match="has no exact J"):
        main([str(bad)])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "grid"), "--horizon", "0"])
    assert "error: horizon: must be >= 1, got 0 (see --help)" in capsys.readouterr().err
